//! The concurrency layer's tower plumbing: the
//! [`ConcurrencyLimitService`] that [`ConcurrencyLimitLayer`] makes, which
//! takes a permit of each request's key and holds it in the response's
//! body, or answers the refusal.

use super::{ConcurrencyLimitLayer, DefaultMax, Shared};
use crate::concurrency::{AsyncConcurrencyLimiter, ConcurrencyLimiter};
use crate::layer::held::{HeldPermit, PermitBody};
use crate::layer::{headers, keys, take_ready, ResponseFuture};
use crate::observe::Status;
use http::request::Parts;
use http::{Request, Response};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

impl<Svc, F, K, P, L> Layer<Svc> for ConcurrencyLimitLayer<F, K, P, L> {
    type Service = ConcurrencyLimitService<Svc, F, K, P, L>;

    fn layer(&self, inner: Svc) -> Self::Service {
        ConcurrencyLimitService {
            inner,
            shared: Arc::clone(&self.shared),
            key: PhantomData,
        }
    }
}

/// The service made by [`ConcurrencyLimitLayer`]: takes a permit of the
/// request's key, then calls the inner service and holds the permit in
/// its response's body ([`PermitBody`]), or answers 401 / 429 / 431 / 503
/// itself.
///
/// Cloning it clones the inner service and one [`Arc`].
pub struct ConcurrencyLimitService<Svc, F, K = String, P = DefaultMax, L = ConcurrencyLimiter<K>> {
    inner: Svc,
    shared: Arc<Shared<F, K, P, L>>,
    key: PhantomData<fn() -> K>,
}

impl<Svc: Clone, F, K, P, L> Clone for ConcurrencyLimitService<Svc, F, K, P, L> {
    fn clone(&self) -> Self {
        ConcurrencyLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            key: PhantomData,
        }
    }
}

impl<Svc: fmt::Debug, F, K, P, L: fmt::Debug> fmt::Debug
    for ConcurrencyLimitService<Svc, F, K, P, L>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitService")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<Svc, F, K, P, L, ReqBody, ResBody> Service<Request<ReqBody>>
    for ConcurrencyLimitService<Svc, F, K, P, L>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Svc::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    P: Fn(&Parts) -> Option<u32> + Send + Sync + 'static,
    K: Send + Sync + 'static,
    L: AsyncConcurrencyLimiter<K> + Send + Sync + 'static,
{
    type Response = Response<PermitBody<ResBody, L::Permit>>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Self::Response, Svc::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let key =
                match keys::extract(&parts, shared.max_key_len, &shared.key, &shared.responses) {
                    Ok(key) => key,
                    Err(refused) => return Ok(refused),
                };
            let max = (shared.max)(&parts).unwrap_or_else(|| shared.limiter.max());
            let taken = shared
                .limiter
                .acquire_under(&key, max, shared.max_wait)
                .await;
            match taken {
                Ok(permit) => {
                    shared.responses.count(Status::Admitted);
                    let held = HeldPermit::new(permit);
                    parts.extensions.insert(held.clone());
                    let response = inner.call(Request::from_parts(parts, body)).await?;
                    Ok(response.map(|body| PermitBody::holding(body, held)))
                }
                Err(refusal) => {
                    let (response, status) = headers::concurrency_refused(
                        &refusal,
                        L::concurrency_denial(&refusal),
                        PermitBody::refused,
                    );
                    shared.responses.count(status);
                    Ok(response)
                }
            }
        })
    }
}

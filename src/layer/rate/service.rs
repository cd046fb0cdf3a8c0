//! The rate layer's tower plumbing: the [`RateLimitService`] that
//! [`RateLimitLayer`] makes, which keys each request, spends from its
//! key's bucket, then calls the inner service or answers the refusal.

use super::{DefaultQuota, RateLimitLayer, Shared};
use crate::gcra::Quota;
use crate::layer::keys::{self, Limited};
use crate::layer::{take_ready, ResponseFuture, UnitCost};
use crate::limiter::AsyncLimiter;
use crate::observe::Status;
use crate::time::{At, Now};
use http::request::Parts;
use http::{Request, Response};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

impl<Svc, L, F, K, C, P> Layer<Svc> for RateLimitLayer<L, F, K, C, P> {
    type Service = RateLimitService<Svc, L, F, K, C, P>;

    fn layer(&self, inner: Svc) -> Self::Service {
        RateLimitService {
            inner,
            shared: Arc::clone(&self.shared),
            key: PhantomData,
        }
    }
}

/// The service made by [`RateLimitLayer`]: spends from the request's key's
/// bucket, then calls the inner service or answers 401 / 413 / 429 / 431 /
/// 503 itself.
///
/// Cloning it clones the inner service and one [`Arc`]; the limiter and the
/// key and cost functions are shared, never copied.
pub struct RateLimitService<Svc, L, F, K = String, C = UnitCost, P = DefaultQuota> {
    inner: Svc,
    shared: Arc<Shared<L, F, C, P>>,
    key: PhantomData<fn() -> K>,
}

impl<Svc: Clone, L, F, K, C, P> Clone for RateLimitService<Svc, L, F, K, C, P> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            key: PhantomData,
        }
    }
}

impl<Svc: fmt::Debug, L: fmt::Debug, F, K, C, P> fmt::Debug
    for RateLimitService<Svc, L, F, K, C, P>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .field("policy", &self.shared.fields)
            .finish_non_exhaustive()
    }
}

impl<Svc, L, F, K, C, P, ReqBody, ResBody> Service<Request<ReqBody>>
    for RateLimitService<Svc, L, F, K, C, P>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Svc::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
    L: AsyncLimiter<K> + Send + Sync + 'static,
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    C: Fn(&Parts) -> u64 + Send + Sync + 'static,
    P: Fn(&Parts) -> Option<Quota> + Send + Sync + 'static,
    K: Clone + Send + Sync + 'static,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Response<ResBody>, Svc::Error>;

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
            let cost = (shared.cost)(&parts);
            let quota = (shared.quota)(&parts).unwrap_or_else(|| shared.limiter.quota());
            let decided = shared
                .limiter
                .check_under(&key, At::from(Now), cost, &quota)
                .await;
            match decided {
                Ok(decision) => {
                    shared.responses.count(Status::Admitted);
                    let headers = shared.fields.admitted(&decision);
                    parts.extensions.insert(Limited { key, quota });
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    for (name, value) in headers {
                        response.headers_mut().insert(name, value);
                    }
                    Ok(response)
                }
                Err(refusal) => {
                    let (response, status) = shared.fields.refused(&quota, &refusal);
                    shared.responses.count(status);
                    Ok(response)
                }
            }
        })
    }
}

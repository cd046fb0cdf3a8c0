//! The concurrency layer: a permit of the request's key for each request
//! in flight, held until its response body has been sent.

use super::held::{HeldPermit, PermitBody};
use super::keys::{self, DEFAULT_MAX_KEY_LEN};
use super::{headers, unshared, ResponseFuture};
use crate::concurrency::{AsyncConcurrencyLimiter, ConcurrencyLimiter};
use crate::observe::{ResponseCounts, Responses, Status};
use http::request::Parts;
use http::{Request, Response};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service};

/// The default limit function's type: every request is under the
/// limiter's default limit.
pub type DefaultMax = fn(&Parts) -> Option<u32>;

fn default_max(_: &Parts) -> Option<u32> {
    None
}

/// Limits how many requests of each key are in flight at once, over a
/// [`ConcurrencyLimiter`] or a
/// [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter) (any
/// [`AsyncConcurrencyLimiter`]; over Redis, the limit is shared by every
/// server on it): a request holds one of its key's permits from
/// its admission until its response body has been sent to its end (or
/// dropped), so a streamed response counts for as long as it streams.
///
/// The key comes from a key function, as for
/// [`RateLimitLayer`](super::RateLimitLayer), under the same bound on key
/// headers; the limit is the limiter's default or a plan's, per request
/// ([`with_max`](Self::with_max)). The permit is in the request's
/// extensions as a [`HeldPermit`], which a handler whose work outlives
/// the response (a WebSocket stream) takes for that work's whole life.
///
/// | outcome | response |
/// |---|---|
/// | a key header above the bound (256 bytes by default: [`with_max_key_len`](Self::with_max_key_len)) | `431 Request Header Fields Too Large` |
/// | no key | `401 Unauthorized` with `WWW-Authenticate: Bearer` |
/// | admitted | the inner service's response, its body holding the permit ([`PermitBody`]) |
/// | the key at its limit (at once, or after [`with_max_wait`](Self::with_max_wait)) | `429 Too Many Requests` with [`X-Concurrency-Limit`](super::X_CONCURRENCY_LIMIT) (the key's limit) and [`X-Concurrency-Held`](super::X_CONCURRENCY_HELD) (its permits held), no `Retry-After`: a permit comes back when a request ends, at no time known |
/// | the limiter at its cap of keys | `503 Service Unavailable` with `Retry-After: 1` ([`LIMITER_FULL_RETRY_AFTER`](super::LIMITER_FULL_RETRY_AFTER)) |
/// | the backend could not decide (Redis unreachable, failure policy closed) | `503 Service Unavailable` |
///
/// A refusal's body is its reason, one line of text.
///
/// # Examples
///
/// ```
/// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
/// use keyrate::ConcurrencyLimiter;
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Arc::new(ConcurrencyLimiter::new(1)); // 1 request in flight per key
/// let layer = ConcurrencyLimitLayer::new(Arc::clone(&limiter), bearer_token);
/// let service = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
/// }));
/// let request = || {
///     http::Request::get("/").header("authorization", "Bearer k").body(()).unwrap()
/// };
///
/// let first = service.clone().oneshot(request()).await.unwrap();
/// assert_eq!(first.status(), 200);
/// assert_eq!(limiter.held("k"), 1); // until its body is sent or dropped
/// let second = service.clone().oneshot(request()).await.unwrap();
/// assert_eq!(second.status(), 429);
/// assert_eq!(second.headers()["x-concurrency-limit"], "1");
/// assert_eq!(second.headers()["x-concurrency-held"], "1");
/// drop(first);
/// assert_eq!(limiter.held("k"), 0);
/// assert_eq!(service.oneshot(request()).await.unwrap().status(), 200);
/// # });
/// ```
pub struct ConcurrencyLimitLayer<F, K = String, P = DefaultMax, L = ConcurrencyLimiter<K>> {
    shared: Arc<Shared<F, K, P, L>>,
}

/// What a layer and every service it made share.
struct Shared<F, K, P, L> {
    limiter: Arc<L>,
    /// The key type the key function returns.
    keys: PhantomData<fn() -> K>,
    key: F,
    max: P,
    /// How long a request may wait for a permit (zero: not at all).
    max_wait: Duration,
    responses: ResponseCounts,
    /// The most bytes of key a key header may hold.
    max_key_len: usize,
}

impl<F, K, L> ConcurrencyLimitLayer<F, K, DefaultMax, L> {
    /// A layer that keys each request with `key` (`None` refuses it with
    /// 401) and holds one of its permits under the limiter's default
    /// limit, refusing at once a key at its limit.
    ///
    /// Ready-made key functions: [`bearer_token`](super::bearer_token) and
    /// [`api_key_header`](super::api_key_header).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{api_key_header, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(4));
    /// let _layer = ConcurrencyLimitLayer::new(streams, api_key_header);
    /// ```
    #[must_use]
    pub fn new(limiter: Arc<L>, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<K>,
    {
        ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                keys: PhantomData,
                key,
                max: default_max,
                max_wait: Duration::ZERO,
                responses: ResponseCounts::new(),
                max_key_len: DEFAULT_MAX_KEY_LEN,
            }),
        }
    }
}

/// # Configuration (before the layer is cloned or used)
impl<F, K, P, L> ConcurrencyLimitLayer<F, K, P, L> {
    /// Rebuilds the shared part with one part replaced.
    fn rebuild<P2>(
        self,
        change: impl FnOnce(Shared<F, K, P, L>) -> Shared<F, K, P2, L>,
    ) -> ConcurrencyLimitLayer<F, K, P2, L> {
        ConcurrencyLimitLayer {
            shared: Arc::new(change(unshared(self.shared, "ConcurrencyLimitLayer"))),
        }
    }

    /// Holds each request under the limit `max(parts)`, a plan's chosen
    /// per request, or the limiter's default where it returns `None`. A
    /// limit of 0 refuses every request of the plan (429).
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// /// The plan your authentication found for the key, in the request's
    /// /// extensions (never the key's shape: a client chooses its key).
    /// #[derive(Clone, Copy)]
    /// struct Pro;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(2)); // free plan
    /// let _layer = ConcurrencyLimitLayer::new(streams, bearer_token).with_max(|parts: &http::request::Parts| {
    ///     parts.extensions.get::<Pro>().map(|_| 20)
    /// });
    /// ```
    #[must_use]
    pub fn with_max<P2>(self, max: P2) -> ConcurrencyLimitLayer<F, K, P2, L>
    where
        P2: Fn(&Parts) -> Option<u32>,
    {
        self.rebuild(|s| Shared {
            limiter: s.limiter,
            keys: PhantomData,
            key: s.key,
            max,
            max_wait: s.max_wait,
            responses: s.responses,
            max_key_len: s.max_key_len,
        })
    }

    /// Lets a request of a key at its limit wait up to `max_wait` for a
    /// permit (first come, first served: [`ConcurrencyLimiter::acquire`])
    /// before it is refused (feature `tokio`). By default, and with
    /// `Duration::ZERO`, it is refused at once. Over Redis the wait polls
    /// ([`RedisConcurrencyLimiter::acquire_under`](crate::RedisConcurrencyLimiter::acquire_under)),
    /// first come first served only among this process's requests.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(2));
    /// let _layer = ConcurrencyLimitLayer::new(streams, bearer_token)
    ///     .with_max_wait(Duration::from_millis(200));
    /// ```
    #[cfg(feature = "tokio")]
    #[must_use]
    pub fn with_max_wait(self, max_wait: Duration) -> Self {
        self.rebuild(|s| Shared { max_wait, ..s })
    }

    /// Refuses requests whose key header holds more than `max_key_len`
    /// bytes of key (by default [`DEFAULT_MAX_KEY_LEN`], 256) with `431
    /// Request Header Fields Too Large`, before the key function runs: as
    /// [`RateLimitLayer::with_max_key_len`](super::RateLimitLayer::with_max_key_len).
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(2));
    /// let _layer = ConcurrencyLimitLayer::new(streams, bearer_token).with_max_key_len(64);
    /// ```
    #[must_use]
    pub fn with_max_key_len(self, max_key_len: usize) -> Self {
        self.rebuild(|s| Shared { max_key_len, ..s })
    }
}

/// # What the layer reports
impl<F, K, P, L> ConcurrencyLimitLayer<F, K, P, L> {
    /// The limiter the layer takes permits from.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(2)), bearer_token);
    /// assert_eq!(layer.limiter().max(), 2);
    /// ```
    #[must_use]
    pub fn limiter(&self) -> &Arc<L> {
        &self.shared.limiter
    }

    /// The responses of every service this layer made, counted by status
    /// ([`Responses`]: `admitted`, `unauthorized`, `too_many_requests`,
    /// `unavailable`, `key_too_large`).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(2)), bearer_token);
    /// assert_eq!(layer.responses().admitted, 0);
    /// ```
    #[must_use]
    pub fn responses(&self) -> Responses {
        self.shared.responses.read()
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn response_counts(&self) -> ResponseCounts {
        self.shared.responses.clone()
    }
}

impl<F, K, P, L> Clone for ConcurrencyLimitLayer<F, K, P, L> {
    fn clone(&self) -> Self {
        ConcurrencyLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<F, K, P, L: fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<F, K, P, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("max_wait", &self.shared.max_wait)
            .field("max_key_len", &self.shared.max_key_len)
            .finish_non_exhaustive()
    }
}

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
        // The service that was polled ready serves this request; a clone
        // takes its place for the next one.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
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

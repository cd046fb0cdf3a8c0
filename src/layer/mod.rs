//! A [`tower::Layer`] that rate-limits HTTP requests by key (feature
//! `tower`), over any [`AsyncLimiter`]: the in-memory limiter, or
//! `RedisLimiter` for a fleet of servers sharing each key's budget.
//!
//! The layer asks a user-supplied function for each request's key (an API
//! key, a tenant id), and optionally others for its cost and its quota,
//! then spends from that key's bucket at the backend's clock ([`Now`]):
//!
//! | outcome | response |
//! |---|---|
//! | a key header above the bound (`Authorization`'s token or `X-API-Key`, 256 bytes by default: [`with_max_key_len`](RateLimitLayer::with_max_key_len)) | `431 Request Header Fields Too Large`; the key function is not called, nothing spent |
//! | no key | `401 Unauthorized` with `WWW-Authenticate: Bearer`; nothing spent |
//! | admitted | the inner service's response, plus `RateLimit-Policy` and `RateLimit` (the tokens left) |
//! | over the limit | `429 Too Many Requests` with `Retry-After`, `RateLimit-Policy` and `RateLimit` |
//! | cost above the capacity | `413 Content Too Large`, no `Retry-After`: no wait can help |
//! | the limiter at its bucket cap | `503 Service Unavailable` with `Retry-After: 1` ([`LIMITER_FULL_RETRY_AFTER`]) |
//! | any other refusal (its clock out of range, its backend down and failing closed) | `503 Service Unavailable` |
//!
//! The rate-limit fields follow the structured-field form of
//! draft-ietf-httpapi-ratelimit-headers (revisions 09 to 11):
//!
//! ```text
//! RateLimit-Policy: "default";q=20;w=10
//! RateLimit: "default";r=7;t=7
//! ```
//!
//! `q` is the bucket's capacity (its largest burst), `w` the seconds an empty
//! bucket takes to refill (rounded up), `r` the whole tokens left after this
//! request, and `t` the seconds until the bucket is full again (rounded up;
//! on a 429, the seconds until this request would be admitted).
//! `Retry-After` is whole seconds, rounded up, so a client that honours it
//! is admitted when it retries (if nothing else spent meanwhile). An
//! admission that a fail-open backend could not measure carries no
//! `RateLimit` field.
//!
//! [`ConcurrencyLimitLayer`] limits, with the same key functions, how many
//! requests of a key are in flight at once, each holding a permit of a
//! [`ConcurrencyLimiter`](crate::ConcurrencyLimiter) until its response
//! body has been sent (see `docs/concurrency.md`).
//!
//! [`CompoundLimitLayer`] charges each request several scopes (its key
//! under a plan of several quotas, its organization, a global key) all or
//! nothing, over any [`AsyncCompound`](crate::AsyncCompound) limiter, with
//! every quota in `RateLimit-Policy` and the binding one in `RateLimit`.
//!
//! Files: `mod.rs` (the rate layer's tower plumbing), `headers.rs` (the
//! HTTP policy: header fields and refusals), `keys.rs` (key extraction),
//! `compound.rs` (the compound layer, its plumbing and its headers),
//! `concurrency.rs` (the concurrency layer), `held.rs` (its permit in the
//! request and in the response body), `length.rs` (the declared-length
//! rule, for costs by the byte).
//!
//! A cost by body length reads the request's head, so it charges the
//! declared `Content-Length` ([`declared_length`]); a
//! [`DeclaredLengthLayer`] outside the rate layer makes that the truth:
//! `411` for a body that declares no length (a chunked upload), and a
//! body cut off with an error past its declared length.

mod compound;
mod concurrency;
mod headers;
mod held;
mod keys;
mod length;

pub use self::compound::{CompoundLimitLayer, CompoundLimitService, Scope};
pub use self::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimitService, DefaultMax};
pub use self::headers::{
    LIMITER_FULL_RETRY_AFTER, RATELIMIT, RATELIMIT_POLICY, X_CONCURRENCY_HELD, X_CONCURRENCY_LIMIT,
};
pub use self::held::{HeldPermit, PermitBody};
pub use self::keys::{api_key_header, bearer_token, Limited, DEFAULT_MAX_KEY_LEN, X_API_KEY};
pub use self::length::{
    declared_length, BodyTooLong, DeclaredBody, DeclaredLengthFuture, DeclaredLengthLayer,
    DeclaredLengthService,
};

use self::headers::Fields;
use crate::gcra::Quota;
use crate::limiter::AsyncLimiter;
use crate::observe::{ResponseCounts, Responses, Status};
use crate::time::{At, Now};
use http::request::Parts;
use http::{Request, Response};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// The default cost function's type: every request costs one token.
pub type UnitCost = fn(&Parts) -> u64;

fn unit_cost(_: &Parts) -> u64 {
    1
}

/// The default quota function's type: every request gets the limiter's
/// default quota.
pub type DefaultQuota = fn(&Parts) -> Option<Quota>;

fn default_quota(_: &Parts) -> Option<Quota> {
    None
}

/// Rate-limits the requests to the service it wraps, per key, over any
/// [`AsyncLimiter`] `L`.
///
/// Build it once with a shared limiter; every service it makes, and every
/// clone of those, spends from that same limiter (one [`Arc`], never a copy).
///
/// # Examples
///
/// ```
/// use keyrate::layer::{bearer_token, RateLimitLayer};
/// use keyrate::TokenBucketLimiter;
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2));
/// let layer = RateLimitLayer::new(limiter, bearer_token);
/// let mut service = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
/// }));
/// let request = || {
///     http::Request::get("/").header("authorization", "Bearer k").body(()).unwrap()
/// };
///
/// let ok = service.ready().await.unwrap().call(request()).await.unwrap();
/// assert_eq!(ok.status(), 200);
/// assert_eq!(ok.headers()["ratelimit"], "\"default\";r=1;t=1");
/// assert_eq!(ok.headers()["ratelimit-policy"], "\"default\";q=2;w=2");
///
/// let _ = service.ready().await.unwrap().call(request()).await.unwrap();
/// let limited = service.ready().await.unwrap().call(request()).await.unwrap();
/// assert_eq!(limited.status(), 429);
/// assert_eq!(limited.headers()["retry-after"], "1");
///
/// let anonymous = http::Request::get("/").body(()).unwrap();
/// let refused = service.ready().await.unwrap().call(anonymous).await.unwrap();
/// assert_eq!(refused.status(), 401);
/// # });
/// ```
pub struct RateLimitLayer<L, F, K = String, C = UnitCost, P = DefaultQuota> {
    shared: Arc<Shared<L, F, C, P>>,
    key: PhantomData<fn() -> K>,
}

/// What a layer and every service it made share.
struct Shared<L, F, C, P> {
    limiter: Arc<L>,
    key: F,
    cost: C,
    quota: P,
    fields: Fields,
    responses: ResponseCounts,
    /// The most bytes of key a key header may hold.
    max_key_len: usize,
}

impl<L, F, K> RateLimitLayer<L, F, K> {
    /// A layer that keys each request with `key` (`None` refuses it with
    /// 401) and charges it one token. The policy is named `"default"` in
    /// the rate-limit headers.
    ///
    /// Ready-made key functions: [`bearer_token`] and [`api_key_header`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{api_key_header, bearer_token, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(TokenBucketLimiter::new(10.0, 20));
    /// let _layer = RateLimitLayer::new(limiter, |parts: &http::request::Parts| {
    ///     bearer_token(parts).or_else(|| api_key_header(parts))
    /// });
    /// ```
    #[must_use]
    pub fn new(limiter: Arc<L>, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<K>,
    {
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                key,
                cost: unit_cost,
                quota: default_quota,
                fields: Fields::new("default"),
                responses: ResponseCounts::new(),
                max_key_len: DEFAULT_MAX_KEY_LEN,
            }),
            key: PhantomData,
        }
    }
}

impl<L, F, K, C, P> RateLimitLayer<L, F, K, C, P> {
    /// Rebuilds the shared part with one function replaced; the layer must
    /// not have made services yet (it is being configured).
    fn rebuild<C2, P2>(
        self,
        change: impl FnOnce(Shared<L, F, C, P>) -> Shared<L, F, C2, P2>,
    ) -> RateLimitLayer<L, F, K, C2, P2> {
        RateLimitLayer {
            shared: Arc::new(change(unshared(self.shared, "RateLimitLayer"))),
            key: PhantomData,
        }
    }

    /// Charges each request `cost(parts)` tokens instead of one.
    ///
    /// A cost of 0 is admitted without spending; a cost above the capacity
    /// is refused with 413.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, declared_length, DeclaredBody, DeclaredLengthLayer, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    /// use tower::{service_fn, ServiceBuilder};
    ///
    /// // One token per started kilobyte of declared body; the declared
    /// // length is the truth behind a DeclaredLengthLayer (411 without one).
    /// let limiter = Arc::new(TokenBucketLimiter::new(100.0, 1000));
    /// let layer = RateLimitLayer::new(limiter, bearer_token).with_cost(|parts: &http::request::Parts| {
    ///     declared_length(parts).div_ceil(1024).max(1)
    /// });
    /// let _uploads = ServiceBuilder::new()
    ///     .layer(DeclaredLengthLayer::new()) // outermost: refused before charged
    ///     .layer(layer)
    ///     .service(service_fn(|_request: http::Request<DeclaredBody<String>>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     }));
    /// ```
    ///
    /// A cost by body length must not trust a header the client may leave
    /// out: see [`DeclaredLengthLayer`] (a chunked upload declares none).
    #[must_use]
    pub fn with_cost<C2>(self, cost: C2) -> RateLimitLayer<L, F, K, C2, P>
    where
        C2: Fn(&Parts) -> u64,
    {
        self.rebuild(|s| Shared {
            limiter: s.limiter,
            key: s.key,
            cost,
            quota: s.quota,
            fields: s.fields,
            responses: s.responses,
            max_key_len: s.max_key_len,
        })
    }

    /// Applies `quota(parts)` to each request, a plan chosen per request
    /// (say, from an extension that an authentication layer set), or the
    /// limiter's default quota where it returns `None`. The rate-limit
    /// headers describe the quota applied.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::{Quota, TokenBucketLimiter};
    /// use std::sync::Arc;
    ///
    /// /// The plan your authentication (in front of this layer) found for
    /// /// the key in your key table, in the request's extensions. Never
    /// /// the key's shape: a client chooses its key's prefix.
    /// #[derive(Clone, Copy)]
    /// enum Plan { Free, Pro }
    ///
    /// let pro = Quota::new(20.0, 100).unwrap();
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5)); // free plan
    /// let _layer = RateLimitLayer::new(limiter, bearer_token).with_quota(move |parts: &http::request::Parts| {
    ///     matches!(parts.extensions.get::<Plan>()?, Plan::Pro).then_some(pro)
    /// });
    /// ```
    #[must_use]
    pub fn with_quota<P2>(self, quota: P2) -> RateLimitLayer<L, F, K, C, P2>
    where
        P2: Fn(&Parts) -> Option<Quota>,
    {
        self.rebuild(|s| Shared {
            limiter: s.limiter,
            key: s.key,
            cost: s.cost,
            quota,
            fields: s.fields,
            responses: s.responses,
            max_key_len: s.max_key_len,
        })
    }

    /// Names the policy in the `RateLimit-Policy` and `RateLimit` headers
    /// (by default `"default"`).
    ///
    /// # Panics
    ///
    /// Panics if `name` is empty or holds a character outside printable
    /// ASCII (`' '..='~'`), which a structured-field string cannot carry,
    /// or if the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5));
    /// let _layer = RateLimitLayer::new(limiter, bearer_token).with_policy_name("connections");
    /// ```
    #[must_use]
    pub fn with_policy_name(self, name: &str) -> Self {
        assert!(
            !name.is_empty() && name.bytes().all(|b| (b' '..=b'~').contains(&b)),
            "invalid policy name {name:?}: expected 1 or more printable ASCII characters"
        );
        self.rebuild(|s| Shared {
            fields: Fields::new(name),
            ..s
        })
    }

    /// Refuses requests whose key header holds more than `max_key_len`
    /// bytes of key (by default [`DEFAULT_MAX_KEY_LEN`], 256) with `431
    /// Request Header Fields Too Large`, before the key function runs: the
    /// token of `Authorization` (what follows its scheme, whatever the
    /// scheme) and the value of `X-API-Key`, the headers that
    /// [`bearer_token`] and [`api_key_header`] read. A key is copied into
    /// the limiter's map, a thread's hot-key cache, the offenders' sketch
    /// and the request's extensions, so its size bounds their memory. A
    /// key function of your own that reads other headers bounds them
    /// itself.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5));
    /// let layer = RateLimitLayer::new(limiter, bearer_token).with_max_key_len(64);
    /// let service = layer.layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// let bearer = |key: String| {
    ///     http::Request::get("/").header("authorization", format!("Bearer {key}")).body(()).unwrap()
    /// };
    /// let fits = service.clone().oneshot(bearer("k".repeat(64))).await.unwrap();
    /// assert_eq!(fits.status(), 200);
    /// let too_long = service.clone().oneshot(bearer("k".repeat(65))).await.unwrap();
    /// assert_eq!(too_long.status(), 431);
    /// assert_eq!(layer.responses().key_too_large, 1);
    /// # });
    /// ```
    #[must_use]
    pub fn with_max_key_len(self, max_key_len: usize) -> Self {
        self.rebuild(|s| Shared { max_key_len, ..s })
    }

    /// The limiter the layer spends from.
    #[must_use]
    pub fn limiter(&self) -> &Arc<L> {
        &self.shared.limiter
    }

    /// The responses of every service this layer made, counted by status
    /// (see [`Responses`] for an example).
    #[must_use]
    pub fn responses(&self) -> Responses {
        self.shared.responses.read()
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn response_counts(&self) -> ResponseCounts {
        self.shared.responses.clone()
    }
}

impl<L, F, K, C, P> Clone for RateLimitLayer<L, F, K, C, P> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
            key: PhantomData,
        }
    }
}

impl<L: fmt::Debug, F, K, C, P> fmt::Debug for RateLimitLayer<L, F, K, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("policy", &self.shared.fields)
            .field("max_key_len", &self.shared.max_key_len)
            .finish_non_exhaustive()
    }
}

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

/// The future of a [`RateLimitService`] call: the decision (awaited on
/// backends that await), then the inner service's response with the
/// rate-limit headers, or the refusal; and of a
/// [`ConcurrencyLimitService`] call.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

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

/// A layer's configuration, taken back to be changed: it must not be
/// shared yet (a layer is configured before it is cloned or used).
fn unshared<T>(shared: Arc<T>, layer: &str) -> T {
    match Arc::try_unwrap(shared) {
        Ok(shared) => shared,
        Err(_) => panic!("a {layer} is configured before it is cloned"),
    }
}

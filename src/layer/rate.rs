//! The rate layer, [`RateLimitLayer`]: its type, the state that it and
//! every service it made share, and what it reports. It is made and
//! configured in `rate/config.rs`; its tower plumbing is `rate/service.rs`.

mod config;
mod service;

pub use self::service::RateLimitService;

use super::headers::Fields;
use super::UnitCost;
use crate::gcra::Quota;
use crate::observe::{ResponseCounts, Responses};
use http::request::Parts;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// The default quota function's type: every request gets the limiter's
/// default quota.
pub type DefaultQuota = fn(&Parts) -> Option<Quota>;

fn default_quota(_: &Parts) -> Option<Quota> {
    None
}

/// Rate-limits the requests to the service it wraps, per key, over any
/// [`AsyncLimiter`](crate::AsyncLimiter) `L`.
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

impl<L, F, K, C, P> RateLimitLayer<L, F, K, C, P> {
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

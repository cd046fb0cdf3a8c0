//! The concurrency layer, [`ConcurrencyLimitLayer`]: a permit of the
//! request's key for each request in flight, held until its response body
//! has been sent. Here its type, the state that it and every service it
//! made share, and what it reports; it is made and configured in
//! `concurrency/config.rs`, and its tower plumbing is `concurrency/service.rs`.

mod config;
mod service;

pub use self::service::ConcurrencyLimitService;

use crate::concurrency::ConcurrencyLimiter;
use crate::observe::{ResponseCounts, Responses};
use http::request::Parts;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// The default limit function's type: every request is under the
/// limiter's default limit.
pub type DefaultMax = fn(&Parts) -> Option<u32>;

fn default_max(_: &Parts) -> Option<u32> {
    None
}

/// Limits how many requests of each key are in flight at once, over a
/// [`ConcurrencyLimiter`] or a
/// [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter) (any
/// [`AsyncConcurrencyLimiter`](crate::AsyncConcurrencyLimiter); over Redis, the limit is shared by every
/// server on it): a request holds one of its key's permits from
/// its admission until its response body has been sent to its end (or
/// dropped), so a streamed response counts for as long as it streams.
///
/// The key comes from a key function, as for
/// [`RateLimitLayer`](super::RateLimitLayer), under the same bound on key
/// headers; the limit is the limiter's default or a plan's, per request
/// ([`with_max`](Self::with_max)). The permit is in the request's
/// extensions as a [`HeldPermit`](super::HeldPermit), which a handler whose work outlives
/// the response (a WebSocket stream) takes for that work's whole life.
///
/// | outcome | response |
/// |---|---|
/// | a key header above the bound (256 bytes by default: [`with_max_key_len`](Self::with_max_key_len)) | `431 Request Header Fields Too Large` |
/// | no key | `401 Unauthorized` with `WWW-Authenticate: Bearer` |
/// | admitted | the inner service's response, its body holding the permit ([`PermitBody`](super::PermitBody)) |
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

//! The tower layer's responses, counted by status (feature `tower`).

use super::Striped;
use std::fmt;
use std::sync::Arc;

/// What the rate-limit layer answered, counted by status.
///
/// Read with [`RateLimitLayer::responses`](crate::RateLimitLayer::responses);
/// the counts are shared by the layer, every service it made and their
/// clones, and only grow.
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
/// let layer = RateLimitLayer::new(Arc::new(TokenBucketLimiter::new(1.0, 1)), bearer_token);
/// let mut service = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// }));
/// for _ in 0..3 {
///     let request = http::Request::get("/").header("authorization", "Bearer k").body(());
///     let _ = service.ready().await.unwrap().call(request.unwrap()).await.unwrap();
/// }
/// let responses = layer.responses();
/// assert_eq!((responses.admitted, responses.too_many_requests), (1, 2));
/// # });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Responses {
    /// Requests admitted and passed to the inner service (whose own status
    /// is not looked at; `200` in the metrics).
    pub admitted: u64,
    /// `401 Unauthorized`: no key.
    pub unauthorized: u64,
    /// `413 Content Too Large`: a cost above the capacity.
    pub payload_too_large: u64,
    /// `429 Too Many Requests`.
    pub too_many_requests: u64,
    /// `503 Service Unavailable`: the limiter full, its clock out of range,
    /// or its backend down (failing closed).
    pub unavailable: u64,
    /// `431 Request Header Fields Too Large`: a key header above the
    /// layer's bound (see
    /// [`RateLimitLayer::with_max_key_len`](crate::RateLimitLayer::with_max_key_len)).
    pub key_too_large: u64,
}

/// The statuses counted, in `Responses`' field order.
#[derive(Clone, Copy)]
pub(crate) enum Status {
    Admitted,
    Unauthorized,
    PayloadTooLarge,
    TooManyRequests,
    Unavailable,
    KeyTooLarge,
}

/// Striped counters of a layer's responses.
#[derive(Clone)]
pub(crate) struct ResponseCounts(Arc<Striped<6>>);

impl ResponseCounts {
    pub(crate) fn new() -> Self {
        ResponseCounts(Arc::new(Striped::new(true)))
    }

    #[inline]
    pub(crate) fn count(&self, status: Status) {
        self.0.add(status as usize, 1);
    }

    pub(crate) fn read(&self) -> Responses {
        let [admitted, unauthorized, payload_too_large, too_many_requests, unavailable, key_too_large] =
            self.0.sums();
        Responses {
            admitted,
            unauthorized,
            payload_too_large,
            too_many_requests,
            unavailable,
            key_too_large,
        }
    }
}

impl fmt::Debug for ResponseCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.read().fmt(f)
    }
}

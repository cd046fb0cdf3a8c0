//! The tower layer's responses, counted by status (feature `tower`).

use super::Striped;
use std::fmt;
use std::sync::Arc;

/// What a layer answered, counted by status.
///
/// Read with [`RateLimitLayer::responses`](crate::RateLimitLayer::responses),
/// [`ConcurrencyLimitLayer::responses`](crate::layer::ConcurrencyLimitLayer::responses)
/// or [`DeclaredLengthLayer::responses`](crate::layer::DeclaredLengthLayer::responses);
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
    /// `411 Length Required`: a body that declares no length, refused by
    /// a [`DeclaredLengthLayer`](crate::layer::DeclaredLengthLayer) (the
    /// other layers never answer it).
    pub length_required: u64,
    /// `400 Bad Request`: a body whose declared length is invalid (several
    /// `Content-Length` fields, or one that is not a number), refused by a
    /// [`DeclaredLengthLayer`](crate::layer::DeclaredLengthLayer).
    pub bad_request: u64,
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
    LengthRequired,
    BadRequest,
}

/// Striped counters of a layer's responses.
#[derive(Clone)]
pub(crate) struct ResponseCounts(Arc<Striped<8>>);

impl ResponseCounts {
    pub(crate) fn new() -> Self {
        ResponseCounts(Arc::new(Striped::new(true)))
    }

    #[inline]
    pub(crate) fn count(&self, status: Status) {
        self.0.add(status as usize, 1);
    }

    pub(crate) fn read(&self) -> Responses {
        let [admitted, unauthorized, payload_too_large, too_many_requests, unavailable, key_too_large, length_required, bad_request] =
            self.0.sums();
        Responses {
            admitted,
            unauthorized,
            payload_too_large,
            too_many_requests,
            unavailable,
            key_too_large,
            length_required,
            bad_request,
        }
    }
}

impl Default for ResponseCounts {
    fn default() -> Self {
        ResponseCounts::new()
    }
}

impl fmt::Debug for ResponseCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.read().fmt(f)
    }
}

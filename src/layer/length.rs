//! Paying by the byte: the declared-length rule. A request's body is
//! charged by its `Content-Length` ([`declared_length`]) only where that
//! is the truth: [`DeclaredLengthLayer`] refuses a body that declares no
//! length (`411`) before anything is charged, and cuts off one that sends
//! more than it declared ([`DeclaredBody`], [`BodyTooLong`]).

mod body;

pub use self::body::{BodyTooLong, DeclaredBody};

use crate::observe::{ResponseCounts, Responses, Status};
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// A request's declared body length: its `Content-Length`, or 0 when it
/// has none or an invalid one. A cost function for
/// [`RateLimitLayer::with_cost`](super::RateLimitLayer::with_cost) that
/// charges one token per byte.
///
/// The header is the client's word: charge by it only behind a
/// [`DeclaredLengthLayer`] (outside the rate layer), which refuses a body
/// without one and holds a body to it. Without that layer a chunked upload
/// declares nothing and costs 0.
///
/// # Examples
///
/// ```
/// use keyrate::layer::declared_length;
///
/// let (parts, ()) = http::Request::post("/").header("content-length", "120").body(()).unwrap().into_parts();
/// assert_eq!(declared_length(&parts), 120);
/// let (chunked, ()) = http::Request::post("/").body(()).unwrap().into_parts();
/// assert_eq!(declared_length(&chunked), 0);
/// ```
#[must_use]
pub fn declared_length(parts: &Parts) -> u64 {
    match declared(parts) {
        Declared::Length(len) => len,
        Declared::None | Declared::Chunked | Declared::Invalid => 0,
    }
}

/// What a request's head says of its body's length.
enum Declared {
    Length(u64),
    /// No `Content-Length`.
    None,
    /// A `Transfer-Encoding`, which overrides any length (RFC 9112, 6.3).
    Chunked,
    /// Several `Content-Length` fields, or one that is not a number.
    Invalid,
}

fn declared(parts: &Parts) -> Declared {
    if parts.headers.contains_key(TRANSFER_ENCODING) {
        return Declared::Chunked;
    }
    let mut values = parts.headers.get_all(CONTENT_LENGTH).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return if parts.headers.contains_key(CONTENT_LENGTH) {
            Declared::Invalid
        } else {
            Declared::None
        };
    };
    // Digits only: `parse` would take a leading `+`.
    let value = value.as_bytes();
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Declared::Invalid;
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Declared::Invalid, Declared::Length)
}

/// Holds each request to the body length it declares, so that a cost by
/// [`declared_length`] charges what the body is.
///
/// | request | response |
/// |---|---|
/// | a body, and no `Content-Length` (a chunked upload: `Transfer-Encoding` is refused whatever else it declares) | `411 Length Required`; the inner service is not called |
/// | several `Content-Length` fields, or one that is not a number | `400 Bad Request` |
/// | `Content-Length: n` | the inner service, with the body wrapped in a [`DeclaredBody`] that fails with [`BodyTooLong`] rather than yield byte `n + 1` |
/// | no `Content-Length` and a body known to be empty (a plain `GET`) | the inner service, the body held to 0 bytes |
///
/// Put it outside the [`RateLimitLayer`](super::RateLimitLayer) (in axum,
/// the later `route_layer`), so that a refused request spends nothing. Its
/// responses are counted as the other layers' are
/// ([`responses`](Self::responses): `length_required`, `bad_request`,
/// `admitted` for a request passed on), and exported by
/// [`Metrics::length_layer`](crate::prometheus::Metrics::length_layer).
/// Over HTTP/1.1 and HTTP/2, hyper already reads no more than the declared
/// length; the wrapper makes the rule hold for any server and body.
///
/// Why a declared length and not a charge as the bytes stream: the
/// decision comes before the work, all or nothing, with an exact
/// `Retry-After`. A body charged as it streams would be denied midway,
/// after the handler has started on it, with no wait a client could
/// honour. A stream of unknown length (live audio) is better cut into
/// messages each charged on its own, as the example's WebSocket is.
///
/// # Examples
///
/// ```
/// use http_body_util::{BodyExt, Full};
/// use keyrate::layer::{declared_length, DeclaredBody, DeclaredLengthLayer, RateLimitLayer, X_API_KEY};
/// use keyrate::TokenBucketLimiter;
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Arc::new(TokenBucketLimiter::new(10.0, 100)); // bytes
/// let upload = service_fn(|request: http::Request<DeclaredBody<Full<bytes::Bytes>>>| async move {
///     let body = request.into_body().collect().await?.to_bytes();
///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(http::Response::new(body.len().to_string()))
/// });
/// let rate = RateLimitLayer::new(limiter, keyrate::layer::api_key_header).with_cost(declared_length);
/// let service = DeclaredLengthLayer::new().layer(rate.layer(upload));
/// let post = |len: Option<usize>| {
///     let mut request = http::Request::post("/").header(X_API_KEY, "k");
///     if let Some(len) = len {
///         request = request.header("content-length", len);
///     }
///     request.body(Full::from(vec![b'x'; 60])).unwrap()
/// };
///
/// // No declared length: 411, nothing spent.
/// assert_eq!(service.clone().oneshot(post(None)).await.unwrap().status(), 411);
/// let ok = service.clone().oneshot(post(Some(60))).await.unwrap();
/// assert_eq!(ok.headers()["ratelimit"], "\"default\";r=40;t=6");
/// // A body longer than it declared is cut off: paying for 10 does not buy 60.
/// assert!(service.clone().oneshot(post(Some(10))).await.is_err());
/// # });
/// ```
#[derive(Debug, Clone, Default)]
pub struct DeclaredLengthLayer {
    /// Shared by the layer, every service it made and their clones.
    responses: ResponseCounts,
}

impl DeclaredLengthLayer {
    /// The layer.
    ///
    /// # Examples
    ///
    /// ```
    /// let _layer = keyrate::layer::DeclaredLengthLayer::new();
    /// ```
    #[must_use]
    pub fn new() -> Self {
        DeclaredLengthLayer::default()
    }

    /// The responses of every service this layer made, counted by status
    /// ([`Responses`]: `length_required`, `bad_request`, and `admitted` for
    /// the requests passed on).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::DeclaredLengthLayer;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let layer = DeclaredLengthLayer::new();
    /// let service = layer.layer(service_fn(|_: http::Request<keyrate::layer::DeclaredBody<String>>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// let chunked = http::Request::post("/").header("transfer-encoding", "chunked").body(String::from("hi")).unwrap();
    /// assert_eq!(service.oneshot(chunked).await.unwrap().status(), 411);
    /// assert_eq!(layer.responses().length_required, 1);
    /// # });
    /// ```
    #[must_use]
    pub fn responses(&self) -> Responses {
        self.responses.read()
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn response_counts(&self) -> ResponseCounts {
        self.responses.clone()
    }
}

impl<S> Layer<S> for DeclaredLengthLayer {
    type Service = DeclaredLengthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeclaredLengthService {
            inner,
            responses: self.responses.clone(),
        }
    }
}

/// The service made by [`DeclaredLengthLayer`].
#[derive(Debug, Clone)]
pub struct DeclaredLengthService<S> {
    inner: S,
    responses: ResponseCounts,
}

impl<S, B, ResBody> Service<Request<B>> for DeclaredLengthService<S>
where
    S: Service<Request<DeclaredBody<B>>, Response = Response<ResBody>>,
    B: Body,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = DeclaredLengthFuture<S::Future, Response<ResBody>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let declared = match declared(&parts) {
            Declared::Length(len) => len,
            Declared::None if body.is_end_stream() => 0,
            Declared::None | Declared::Chunked => {
                self.responses.count(Status::LengthRequired);
                return refuse(StatusCode::LENGTH_REQUIRED);
            }
            Declared::Invalid => {
                self.responses.count(Status::BadRequest);
                return refuse(StatusCode::BAD_REQUEST);
            }
        };
        self.responses.count(Status::Admitted);
        let body = DeclaredBody::new(body, declared);
        DeclaredLengthFuture {
            state: State::Inner {
                future: self.inner.call(Request::from_parts(parts, body)),
            },
        }
    }
}

fn refuse<F, B: Default>(status: StatusCode) -> DeclaredLengthFuture<F, Response<B>> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    DeclaredLengthFuture {
        state: State::Refused {
            response: Some(response),
        },
    }
}

pin_project! {
    /// The future of a [`DeclaredLengthService`] call: the inner
    /// service's, or a refusal.
    #[derive(Debug)]
    pub struct DeclaredLengthFuture<F, R> {
        #[pin]
        state: State<F, R>,
    }
}

pin_project! {
    #[project = StateProj]
    #[derive(Debug)]
    enum State<F, R> {
        // The inner service's call.
        Inner { #[pin] future: F },
        // A `411` or `400`, answered once.
        Refused { response: Option<R> },
    }
}

impl<F, R, E> Future for DeclaredLengthFuture<F, R>
where
    F: Future<Output = Result<R, E>>,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx),
            StateProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("DeclaredLengthFuture polled after it completed"),
            },
        }
    }
}

#![cfg(not(loom))]
//! The declared-length rule: a body without a declared length is refused
//! before the rate layer charges anything, and a body is held to the length
//! it declared, so a cost by `Content-Length` charges what the body is.

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use keyrate::layer::{
    declared_length, BodyTooLong, DeclaredBody, DeclaredLengthLayer, RateLimitLayer, X_API_KEY,
};
use keyrate::{ManualClock, Now, TokenBucketLimiter};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

type Chunks = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A body of `chunks` frames of `size` bytes, with no length it knows.
fn chunked(chunks: usize, size: usize) -> Chunks {
    let frames: Vec<_> = (0..chunks)
        .map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; size]))))
        .collect();
    StreamBody::new(stream::iter(frames))
}

/// A service that reads the whole body, counts the bytes it got, and
/// answers them, or fails with the body's error.
fn reader<B>(
    bytes: &Arc<AtomicU64>,
) -> impl Service<
    Request<DeclaredBody<B>>,
    Response = Response<String>,
    Error = BoxError,
    Future = impl std::future::Future<Output = Result<Response<String>, BoxError>> + Send,
> + Clone
       + Send
       + 'static
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let bytes = Arc::clone(bytes);
    service_fn(move |request: Request<DeclaredBody<B>>| {
        let bytes = Arc::clone(&bytes);
        async move {
            let body = request.into_body().collect().await?.to_bytes();
            bytes.fetch_add(body.len() as u64, Relaxed);
            Ok(Response::new(body.len().to_string()))
        }
    })
}

fn post<B>(key: &str, length: Option<&str>, body: B) -> Request<B> {
    let mut request = Request::post("/upload").header(X_API_KEY, key);
    if let Some(length) = length {
        request = request.header("content-length", length);
    }
    request.body(body).unwrap()
}

#[tokio::test]
async fn a_chunked_upload_is_refused_before_it_is_charged() {
    let limiter = Arc::new(TokenBucketLimiter::new(10.0, 100).with_clock(ManualClock::new()));
    let read = Arc::new(AtomicU64::new(0));
    let rate = RateLimitLayer::new(Arc::clone(&limiter), keyrate::layer::api_key_header)
        .with_cost(declared_length);
    let service = DeclaredLengthLayer::new().layer(rate.layer(reader::<Chunks>(&read)));

    // Four chunked 120-byte uploads on a 100-byte bucket: each 411, none
    // admitted, none read, nothing spent.
    for _ in 0..4 {
        let response = service
            .clone()
            .oneshot(post("k", None, chunked(4, 30)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::LENGTH_REQUIRED);
        assert!(response.headers().get("ratelimit").is_none());
    }
    // A chunked body that also declares a length: Transfer-Encoding wins
    // (RFC 9112), so it declares nothing either.
    let mut both = post("k", Some("10"), chunked(4, 30));
    both.headers_mut()
        .insert("transfer-encoding", "chunked".parse().unwrap());
    let response = service.clone().oneshot(both).await.unwrap();
    assert_eq!(response.status(), StatusCode::LENGTH_REQUIRED);
    assert_eq!(read.load(Relaxed), 0);
    assert_eq!(limiter.remaining("k", Now), Ok(100));
    assert_eq!(rate.responses().admitted, 0);

    // Declared, the same bytes are charged: 120 never fits, 100 does once.
    let response = service
        .clone()
        .oneshot(post("k", Some("120"), chunked(4, 30)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let response = service
        .clone()
        .oneshot(post("k", Some("100"), chunked(4, 25)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit"], "\"default\";r=0;t=10");
    let response = service
        .clone()
        .oneshot(post("k", Some("1"), chunked(1, 1)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(read.load(Relaxed), 100);
}

#[tokio::test]
async fn a_body_longer_than_it_declared_is_cut_off() {
    let limiter = Arc::new(TokenBucketLimiter::new(10.0, 100).with_clock(ManualClock::new()));
    let read = Arc::new(AtomicU64::new(0));
    let rate = RateLimitLayer::new(Arc::clone(&limiter), keyrate::layer::api_key_header)
        .with_cost(declared_length);
    let service = DeclaredLengthLayer::new().layer(rate.layer(reader::<Chunks>(&read)));

    // Declares 10 bytes, pays 10, sends 120: the reader gets an error at
    // the frame that goes past 10, and never more than 10 bytes.
    let error = service
        .clone()
        .oneshot(post("liar", Some("10"), chunked(4, 30)))
        .await
        .unwrap_err();
    assert_eq!(
        error.downcast_ref::<BodyTooLong>(),
        Some(&BodyTooLong { declared: 10 })
    );
    let error = service
        .clone()
        .oneshot(post("liar", Some("40"), chunked(4, 30)))
        .await
        .unwrap_err();
    assert_eq!(
        error.downcast_ref::<BodyTooLong>(),
        Some(&BodyTooLong { declared: 40 })
    );
    assert_eq!(read.load(Relaxed), 0);
    assert_eq!(limiter.remaining("liar", Now), Ok(50));

    // Exactly its length, and shorter (it paid for bytes it did not send).
    let exact = service
        .clone()
        .oneshot(post("honest", Some("60"), chunked(2, 30)))
        .await
        .unwrap();
    assert_eq!(exact.into_body(), "60");
    let short = service
        .clone()
        .oneshot(post("honest", Some("40"), chunked(1, 30)))
        .await
        .unwrap();
    assert_eq!(short.into_body(), "30");
    assert_eq!(limiter.remaining("honest", Now), Ok(0));
}

#[tokio::test]
async fn lengths_that_are_not_one_number_are_refused_and_empty_bodies_pass() {
    let read = Arc::new(AtomicU64::new(0));
    let service = DeclaredLengthLayer::new().layer(reader::<Full<Bytes>>(&read));
    let body = || Full::new(Bytes::from_static(b"hello"));
    for length in [
        "",
        "+5",
        "-5",
        "5 ",
        "0x5",
        "five",
        "99999999999999999999999",
    ] {
        let request = post("k", Some(length), body());
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{length:?}");
    }
    let mut twice = post("k", Some("5"), body());
    twice
        .headers_mut()
        .append("content-length", "5".parse().unwrap());
    let response = service.clone().oneshot(twice).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(read.load(Relaxed), 0);

    // A GET with no body needs no length; one with a body does.
    let get = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    let response = service.clone().oneshot(get).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let get = Request::get("/").body(body()).unwrap();
    let response = service.clone().oneshot(get).await.unwrap();
    assert_eq!(response.status(), StatusCode::LENGTH_REQUIRED);
    let declared = post("k", Some("5"), body());
    assert_eq!(
        service.clone().oneshot(declared).await.unwrap().into_body(),
        "5"
    );
}

/// The layer's refusals are counted as the other layers' are: in its
/// `responses()`, and in Prometheus under the name it is exposed by.
#[tokio::test]
async fn refusals_are_counted_and_exported() {
    let read = Arc::new(AtomicU64::new(0));
    let layer = DeclaredLengthLayer::new();
    let service = layer.layer(reader::<Chunks>(&read));
    for _ in 0..3 {
        let response = service
            .clone()
            .oneshot(post("k", None, chunked(2, 10)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::LENGTH_REQUIRED);
    }
    for length in ["ten", "+1"] {
        let response = service
            .clone()
            .oneshot(post("k", Some(length), chunked(1, 1)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    let response = service
        .clone()
        .oneshot(post("k", Some("20"), chunked(2, 10)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // A clone of the layer shares its counts.
    let responses = layer.clone().responses();
    assert_eq!(
        (
            responses.length_required,
            responses.bad_request,
            responses.admitted
        ),
        (3, 2, 1)
    );
    assert_eq!(responses.too_many_requests + responses.unauthorized, 0);

    #[cfg(feature = "prometheus")]
    {
        let text = keyrate::prometheus::Metrics::new()
            .length_layer("uploads", &layer)
            .render();
        for (status, n) in [("411", 3), ("400", 2), ("200", 1), ("429", 0)] {
            let series = format!(
                r#"keyrate_http_responses_total{{limiter="uploads",status="{status}"}} {n}"#
            );
            assert!(
                text.lines().any(|line| line == series),
                "{series} in\n{text}"
            );
        }
    }
}

#[test]
fn the_types_are_send_sync_and_the_error_says_what_was_wrong() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<DeclaredLengthLayer>();
    assert_send_sync::<keyrate::layer::DeclaredLengthService<()>>();
    assert_send_sync::<DeclaredBody<Full<Bytes>>>();
    assert_send_sync::<BodyTooLong>();
    let error: BoxError = Box::new(BodyTooLong { declared: 7 });
    assert_eq!(
        error.to_string(),
        "the request body is longer than its Content-Length (7 bytes)"
    );
    // The layer is at the crate's root too.
    let _: keyrate::DeclaredLengthLayer = DeclaredLengthLayer::default();
}

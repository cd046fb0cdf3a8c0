#![cfg(not(loom))]
//! The concurrency layer on a real axum server on loopback, driven by a
//! real HTTP client (hyper-util): a permit is held while a streamed
//! response body is being sent (a body that waits on a channel the test
//! controls) and given back when it ends; a key at its limit is refused;
//! a handler that takes the permit keeps it after the response.

mod common;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request as AxumRequest;
use axum::routing::get;
use axum::Router;
use common::sync::{within, PATIENCE};
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrate::layer::{bearer_token, ConcurrencyLimitLayer, HeldPermit};
use keyrate::{ConcurrencyLimiter, Permit};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// What the server's handlers share with the test.
#[derive(Clone, Default)]
struct Handlers {
    /// The senders of the streamed bodies in flight, in arrival order:
    /// dropping one ends its body.
    streams: Arc<Mutex<Vec<mpsc::Sender<Bytes>>>>,
    /// Permits that `/take` moved out of their requests.
    taken: Arc<Mutex<Vec<Permit>>>,
}

/// `/stream` answers at once with a body that streams what the test sends
/// and ends when the test drops the sender; `/take` takes the permit and
/// answers "ok".
fn router(handlers: &Handlers) -> Router {
    let streams = Arc::clone(&handlers.streams);
    let taken = Arc::clone(&handlers.taken);
    Router::new()
        .route(
            "/stream",
            get(move || async move {
                let (tx, rx) = mpsc::channel::<Bytes>(4);
                streams.lock().unwrap().push(tx);
                let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
                    let chunk = rx.recv().await?;
                    Some((Ok::<_, Infallible>(chunk), rx))
                });
                Body::from_stream(chunks)
            }),
        )
        .route(
            "/take",
            get(move |request: AxumRequest| async move {
                let held = request.extensions().get::<HeldPermit>().expect("a permit");
                taken.lock().unwrap().extend(held.take());
                "ok"
            }),
        )
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A GET of `path` with `key` (if any) as its bearer token; the response
/// as soon as its head arrives, its body unread.
async fn get_with(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
) -> http::Response<impl HttpBody<Data = Bytes, Error = impl std::fmt::Debug> + Unpin + Send> {
    let mut request = http::Request::get(format!("http://{addr}{path}"));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request.body(Full::new(Bytes::new())).unwrap();
    within(&format!("GET {path}"), client.request(request))
        .await
        .expect("the server answers")
}

async fn text<B>(response: http::Response<B>) -> String
where
    B: HttpBody<Data = Bytes, Error: std::fmt::Debug>,
{
    let body = within("the response body", response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// Waits until `done()` holds, yielding to the server between tries:
/// true once it does, false if it still does not after [`PATIENCE`]. A
/// deadline far beyond an honest wait, not a count of tries, so that a
/// busy machine is only slower.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// Waits until the server has made `n` streams.
async fn streams_started(handlers: &Handlers, n: usize) {
    assert!(eventually(|| handlers.streams.lock().unwrap().len() == n).await);
}

#[tokio::test]
async fn a_streamed_body_holds_its_permit_until_it_ends() {
    let limiter = Arc::new(ConcurrencyLimiter::new(2));
    let layer = ConcurrencyLimitLayer::new(Arc::clone(&limiter), bearer_token);
    let handlers = Handlers::default();
    let addr = serve(router(&handlers).layer(layer.clone())).await;
    let client = client();

    // Two streams of "k" in flight: their heads are here, their bodies
    // are not over.
    let first = get_with(&client, addr, "/stream", Some("k")).await;
    let second = get_with(&client, addr, "/stream", Some("k")).await;
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    streams_started(&handlers, 2).await;
    assert_eq!(limiter.held("k"), 2);

    // The third is refused while they stream; another key is not.
    let third = get_with(&client, addr, "/stream", Some("k")).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.headers()["x-concurrency-limit"], "2");
    assert_eq!(third.headers()["x-concurrency-held"], "2");
    assert!(third.headers().get("retry-after").is_none());
    assert_eq!(
        text(third).await,
        "concurrency limit: 2 of 2 permits held\n"
    );
    let other = get_with(&client, addr, "/stream", Some("other")).await;
    assert_eq!(other.status(), StatusCode::OK);
    streams_started(&handlers, 3).await;
    assert_eq!(limiter.held("k"), 2);

    // The first stream sends a chunk: still in flight.
    let tx = handlers.streams.lock().unwrap().remove(0);
    tx.send(Bytes::from_static(b"audio")).await.unwrap();
    let mut first = first.into_body();
    let chunk = within("the first stream's chunk", first.frame())
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(chunk, "audio");
    assert_eq!(limiter.held("k"), 2);

    // It ends: the client reads the end, and the permit is back.
    drop(tx);
    assert!(within("the first stream's end", first.frame())
        .await
        .is_none());
    assert!(eventually(|| limiter.held("k") == 1).await);
    let fourth = get_with(&client, addr, "/stream", Some("k")).await;
    assert_eq!(fourth.status(), StatusCode::OK);
    streams_started(&handlers, 3).await;
    assert_eq!(limiter.held("k"), 2);

    // A client that drops a body midway gives its permit back too, when
    // the server sees the connection go.
    drop(second);
    assert!(eventually(|| limiter.held("k") == 1).await);

    let responses = layer.responses();
    assert_eq!((responses.admitted, responses.too_many_requests), (4, 1));
    drop((other, fourth));
}

#[tokio::test]
async fn a_handler_that_takes_the_permit_keeps_it_after_the_response() {
    let limiter = Arc::new(ConcurrencyLimiter::new(2));
    let layer = ConcurrencyLimitLayer::new(Arc::clone(&limiter), bearer_token);
    let handlers = Handlers::default();
    let addr = serve(router(&handlers).layer(layer)).await;
    let client = client();

    for _ in 0..2 {
        let response = get_with(&client, addr, "/take", Some("k")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(text(response).await, "ok");
    }
    // Both responses are over; the handler's permits are still held.
    assert_eq!(handlers.taken.lock().unwrap().len(), 2);
    assert_eq!(limiter.held("k"), 2);
    let refused = get_with(&client, addr, "/take", Some("k")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // The work that holds them ends: they are back.
    handlers.taken.lock().unwrap().pop();
    assert_eq!(limiter.held("k"), 1);
    let admitted = get_with(&client, addr, "/take", Some("k")).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    handlers.taken.lock().unwrap().clear();
    assert_eq!(limiter.held("k"), 0);
}

#[tokio::test]
async fn plans_keys_and_the_cap_get_their_statuses() {
    // Free keys 1 stream, pro keys 2; at most 2 keys tracked.
    let limiter = Arc::new(ConcurrencyLimiter::new(1).with_max_keys(2));
    let layer = ConcurrencyLimitLayer::new(Arc::clone(&limiter), bearer_token)
        .with_max_key_len(16)
        .with_max(|parts: &http::request::Parts| {
            bearer_token(parts)?.starts_with("sk_pro_").then_some(2)
        });
    let handlers = Handlers::default();
    let addr = serve(router(&handlers).layer(layer.clone())).await;
    let client = client();

    let _pro: Vec<_> = [
        get_with(&client, addr, "/stream", Some("sk_pro_1")).await,
        get_with(&client, addr, "/stream", Some("sk_pro_1")).await,
    ]
    .into_iter()
    .inspect(|r| assert_eq!(r.status(), StatusCode::OK))
    .collect();
    let _free = get_with(&client, addr, "/stream", Some("free")).await;
    assert_eq!(_free.status(), StatusCode::OK);
    let free = get_with(&client, addr, "/stream", Some("free")).await;
    assert_eq!(free.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(free.headers()["x-concurrency-limit"], "1");

    // A third key, with two keys holding permits: 503, Retry-After.
    let full = get_with(&client, addr, "/stream", Some("third")).await;
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(full.headers()["retry-after"], "1");
    assert!(text(full).await.contains("concurrency limiter full"));

    let anonymous = get_with(&client, addr, "/stream", None).await;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let long = get_with(&client, addr, "/stream", Some(&"k".repeat(17))).await;
    assert_eq!(long.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

    let responses = layer.responses();
    assert_eq!(
        (
            responses.admitted,
            responses.too_many_requests,
            responses.unavailable,
            responses.unauthorized,
            responses.key_too_large
        ),
        (3, 1, 1, 1, 1)
    );
    assert_eq!(limiter.stats().refused_limiter_full, 1);
}

#[tokio::test]
async fn with_a_max_wait_a_request_waits_for_a_stream_to_end() {
    let limiter = Arc::new(ConcurrencyLimiter::new(1));
    // Long enough never to run out on a slow machine: the test ends the
    // stream it waits for.
    let layer = ConcurrencyLimitLayer::new(Arc::clone(&limiter), bearer_token)
        .with_max_wait(Duration::from_secs(60));
    let handlers = Handlers::default();
    let addr = serve(router(&handlers).layer(layer)).await;
    let client = client();

    let first = get_with(&client, addr, "/stream", Some("k")).await;
    streams_started(&handlers, 1).await;
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { get_with(&client, addr, "/stream", Some("k")).await })
    };
    assert!(eventually(|| limiter.stats().waiting == 1).await);
    // The first stream ends: the waiter gets its permit.
    handlers.streams.lock().unwrap().clear();
    assert_eq!(text(first).await, "");
    // The waiter's request has its own deadline (`get_with`).
    let second = waiting.await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    streams_started(&handlers, 1).await;
    assert_eq!(limiter.held("k"), 1);
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<HeldPermit>();
    check::<keyrate::layer::PermitBody<String>>();
    check::<ConcurrencyLimitLayer<fn(&http::request::Parts) -> Option<String>>>();
}

//! The concurrency layer over Redis: two axum servers on loopback, each
//! with its own `RedisConcurrencyLimiter` on one real Redis
//! (`KEYRATE_REDIS_URL`), share one key's limit. While the first server's
//! streamed responses hold the key's permits, the second refuses with 429;
//! a permit is held until its response body has been sent, and given back
//! then. In a namespace of the test's own; counts only, no timings.
#![cfg(not(loom))]

mod lease_support;
mod redis_support;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request as AxumRequest;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrate::layer::{bearer_token, ConcurrencyLimitLayer, HeldPermit};
use keyrate::{RedisConcurrencyLimiter, RedisPermit};
use lease_support::{limiter, until};
use redis_support::{unique_prefix, url};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The senders of the streams a server has started: a stream's body ends
/// when its sender is dropped.
type Streams = Arc<Mutex<Vec<mpsc::Sender<Bytes>>>>;

/// A server whose `/stream` answers at once with a body that streams what
/// the test sends, behind the concurrency layer over `limiter`; `/plain`
/// checks that the permit in its extensions is a Redis one.
async fn serve(limiter: RedisConcurrencyLimiter, streams: &Streams) -> SocketAddr {
    let streams = Arc::clone(streams);
    let router = Router::new()
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
            "/plain",
            get(|request: AxumRequest| async move {
                let held = request.extensions().get::<HeldPermit<RedisPermit>>();
                match held.map(HeldPermit::is_held) {
                    Some(true) => "a redis permit",
                    _ => "no permit",
                }
            }),
        )
        .layer(ConcurrencyLimitLayer::new(Arc::new(limiter), bearer_token));
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// A GET of `path` with `key` as its bearer token; the response as soon
/// as its head arrives, its body unread.
async fn get_with(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    key: &str,
) -> http::Response<impl HttpBody<Data = Bytes, Error = impl std::fmt::Debug> + Unpin + Send> {
    let request = http::Request::get(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    client.request(request).await.expect("the server answers")
}

/// Waits until the server has started `n` streams.
async fn started(streams: &Streams, n: usize) {
    until("the streams start", || async {
        streams.lock().unwrap().len() == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_redis_share_a_key_limit() {
    let url = url();
    let namespace = unique_prefix("layer-redis-conc");
    let lease = Duration::from_secs(15);
    let first = limiter(&url, &namespace, 2, lease).await;
    let second = limiter(&url, &namespace, 2, lease).await;
    let probe = first.clone();
    let (first_streams, second_streams) = (Streams::default(), Streams::default());
    let a = serve(first, &first_streams).await;
    let b = serve(second, &second_streams).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let key = "sk_live_shared";

    // The first server holds both permits with two streams.
    let one = get_with(&client, a, "/stream", key).await;
    let two = get_with(&client, a, "/stream", key).await;
    assert_eq!((one.status().as_u16(), two.status().as_u16()), (200, 200));
    started(&first_streams, 2).await;
    assert_eq!(probe.held(key).await.unwrap(), 2);

    // The second server, on its own limiter, refuses: 429 with the limit.
    let refused = get_with(&client, b, "/stream", key).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-concurrency-limit"], "2");
    assert_eq!(refused.headers()["x-concurrency-held"], "2");
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(!body.is_empty());
    assert!(!String::from_utf8_lossy(&body).contains(key));
    assert_eq!(second_streams.lock().unwrap().len(), 0);

    // A chunk of the first stream arrives: its body is not over, and its
    // permit is still held.
    let mut one = one.into_body();
    let sender = first_streams.lock().unwrap().remove(0);
    sender.send(Bytes::from_static(b"frame")).await.unwrap();
    let chunk = one.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&chunk[..], b"frame");
    assert_eq!(probe.held(key).await.unwrap(), 2);
    assert_eq!(get_with(&client, b, "/stream", key).await.status(), 429);

    // The body ends: its permit goes back (queued to the first limiter's
    // renew task), and the second server admits.
    drop(sender);
    assert!(one.frame().await.is_none());
    until("the ended stream's permit is released", || async {
        probe.held(key).await.unwrap() == 1
    })
    .await;
    let admitted = get_with(&client, b, "/plain", key).await;
    assert_eq!(admitted.status(), 200);
    let text = admitted.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&text[..], b"a redis permit");

    // Everything ends: nothing is held on Redis.
    drop(two);
    first_streams.lock().unwrap().clear();
    until("every permit is released", || async {
        probe.held(key).await.unwrap() == 0
    })
    .await;
}

#![cfg(not(loom))]
//! The tower layer over Redis: two HTTP servers on loopback, each with its
//! own `RedisLimiter` on one real Redis, share one key's budget. Needs
//! `KEYRATE_REDIS_URL` (see `redis_support`; `scripts/test.sh` starts a
//! server).

mod redis_support;

use axum::body::Bytes;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrate::layer::{bearer_token, RateLimitLayer};
use keyrate::{AsyncLimiter, Quota, RedisLimiter};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// One server instance: its own limiter (its own connection, mirror and
/// counters) on the shared Redis, under the shared prefix.
async fn server(url: &str, prefix: &str, quota: Quota) -> SocketAddr {
    let limiter = RedisLimiter::connect(url, quota)
        .await
        .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
        .with_namespace(prefix, keyrate::KeyNames::Encoded)
        .with_timeout(redis_support::TEST_TIMEOUT);
    let layer = RateLimitLayer::new(Arc::new(limiter), bearer_token);
    let router = Router::new()
        .route("/v1/tts", get(|| async { "ok" }))
        .layer(layer);
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// A GET with `key` as its bearer token: the status and the headers a
/// client sees.
async fn get_with(addr: SocketAddr, key: &str) -> (u16, http::HeaderMap) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::get(format!("http://{addr}/v1/tts"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.expect("the server answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let _ = response.into_body().collect().await;
    (status, headers)
}

#[tokio::test]
async fn two_servers_on_one_redis_share_a_keys_budget() {
    let url = redis_support::url();
    let prefix = redis_support::unique_prefix("layer-redis");
    // One token a day: nothing refills during the test, whatever the
    // machine's speed.
    let quota = Quota::new(1.0 / 86_400.0, 3).unwrap();
    let first = server(&url, &prefix, quota).await;
    let second = server(&url, &prefix, quota).await;

    // The first server spends the whole burst of "shared".
    for left in (0..3).rev() {
        let (status, headers) = get_with(first, "shared").await;
        assert_eq!(status, 200);
        let state = headers["ratelimit"].to_str().unwrap();
        assert!(
            state.starts_with(&format!("\"default\";r={left};")),
            "{state}"
        );
    }
    // The second server sees the same bucket: refused, with a Retry-After
    // of about a day.
    let (status, headers) = get_with(second, "shared").await;
    assert_eq!(status, 429);
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((86_000..=86_400).contains(&retry), "retry-after {retry}");
    // Another key on the second server has its own full budget.
    let (status, _) = get_with(second, "other").await;
    assert_eq!(status, 200);
    // And the first server is refused too now.
    assert_eq!(get_with(first, "shared").await.0, 429);

    // What Redis holds agrees: the key's bucket is empty (0 tokens).
    let limiter = RedisLimiter::connect(&url, quota)
        .await
        .unwrap()
        .with_namespace(prefix.as_str(), keyrate::KeyNames::Encoded);
    assert_eq!(
        AsyncLimiter::remaining(&limiter, "shared", keyrate::Now)
            .await
            .unwrap(),
        0
    );
}

#![cfg(not(loom))]
//! The compound layer on loopback: an HTTP server whose route charges each
//! request its key under a plan of two quotas and its organization's
//! ceiling, all or nothing, over the in-memory `CompoundLimiter` and (with
//! feature `redis`) over a `RedisLimiter`. Two keys of one org share its
//! ceiling: a key is denied by the org while its own buckets hold tokens,
//! and the denied request spent nothing. The headers list every quota and
//! name the one that binds.

#[cfg(feature = "redis")]
mod redis_support;

use axum::body::Bytes;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrate::layer::{bearer_token, CompoundLimitLayer, Scope};
use keyrate::{AsyncCompound, CompoundLimiter, Policy, Quota};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The plan: 5 an hour (bursts of 5), and 8 a day; the org: 6 a day.
/// Nothing refills during the test, whatever the machine's speed.
fn policies() -> (Arc<Policy>, Arc<Policy>) {
    let day = Duration::from_secs(86_400);
    let plan = Policy::new([
        Quota::with_interval(Duration::from_secs(720), 5).unwrap(),
        Quota::with_interval(day / 8, 8).unwrap(),
    ])
    .unwrap();
    let org = Policy::from(Quota::with_interval(day / 6, 6).unwrap());
    (Arc::new(plan), Arc::new(org))
}

/// A server on loopback whose `/v1/tts` charges the bearer key's plan and
/// its org (every key here belongs to `org`).
async fn server<L>(limiter: Arc<L>, org: String) -> SocketAddr
where
    L: AsyncCompound<str> + Send + Sync + 'static,
{
    let (plan, org_policy) = policies();
    let layer = CompoundLimitLayer::new(limiter, move |parts: &http::request::Parts| {
        let key = bearer_token(parts)?;
        Some(vec![
            Scope::new("key", key, Arc::clone(&plan)),
            Scope::new("org", org.clone(), Arc::clone(&org_policy)),
        ])
    });
    let router = Router::new()
        .route("/v1/tts", get(|| async { "ok" }))
        .layer(layer);
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

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

/// The scenario on any compound limiter; `remaining` reads a key's plan.
async fn org_ceiling_binds<L>(limiter: Arc<L>, org: &str, key_a: &str, key_b: &str)
where
    L: AsyncCompound<str> + Send + Sync + 'static,
    L::Error: std::fmt::Debug,
{
    let addr = server(Arc::clone(&limiter), org.to_owned()).await;
    let (plan, _) = policies();
    let policy_list = "\"key.0\";q=5;w=3600, \"key.1\";q=8;w=86400, \"org.0\";q=6;w=86400";
    // Key a takes 4 of the org's 6.
    for i in 0..4 {
        let (status, headers) = get_with(addr, key_a).await;
        assert_eq!(status, 200, "request {i}");
        assert_eq!(headers["ratelimit-policy"], policy_list);
        if i == 0 {
            // The least after one request: 4 of the burst of 5, full
            // again in 12 minutes (one token of 5 an hour).
            assert_eq!(headers["ratelimit"], "\"key.0\";r=4;t=720");
        }
    }
    // Key b: 2 admitted, then the org's ceiling binds.
    for _ in 0..2 {
        assert_eq!(get_with(addr, key_b).await.0, 200);
    }
    let (status, headers) = get_with(addr, key_b).await;
    assert_eq!(status, 429);
    assert_eq!(headers["ratelimit-policy"], policy_list);
    assert_eq!(headers["ratelimit"], "\"org.0\";r=0;t=14400");
    assert_eq!(headers["retry-after"], "14400");
    // Key b's own buckets hold tokens, and the denial spent none of them:
    // its burst holds 5 less 2, not less 3.
    let now = keyrate::Now;
    assert_eq!(
        limiter.remaining_policy(key_b, &plan, now).await.unwrap(),
        3
    );
    let (_, org_policy) = policies();
    assert_eq!(
        limiter
            .remaining_policy(org, &org_policy, now)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn in_memory() {
    let limiter = Arc::new(CompoundLimiter::new());
    org_ceiling_binds(Arc::clone(&limiter), "org_7", "sk_a", "sk_b").await;
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.denied_insufficient_tokens), (6, 1));
    assert_eq!(stats.denied_by(1, 0), 1);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn on_redis() {
    let limiter = redis_support::limiter("layer_compound", Quota::new(1.0, 1).unwrap())
        .await
        .with_hash_tag(true);
    let limiter = Arc::new(limiter);
    org_ceiling_binds(Arc::clone(&limiter), "org_7", "sk_a", "sk_b").await;
    assert_eq!(limiter.compound_stats().denied_by(1, 0), 1);
}

#[test]
fn public_types_are_send_sync_debug() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<Scope>();
    type Scopes = fn(&http::request::Parts) -> Option<Vec<Scope>>;
    check::<CompoundLimitLayer<CompoundLimiter, Scopes>>();
}

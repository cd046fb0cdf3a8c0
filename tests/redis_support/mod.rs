//! Finding the Redis server the Redis tests run against.
//!
//! The server is named by `KEYRATE_REDIS_URL` (for example
//! `redis://127.0.0.1:6390`), the cluster by `KEYRATE_REDIS_CLUSTER_URLS`.
//! `bash scripts/test.sh` starts both (throwaway servers) and sets them.
//! Without the variable a Redis test fails, as it does when the variable is
//! set and no server answers: a Redis test never passes without running.
#![allow(dead_code)]

use keyrate::{Quota, RedisLimiter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The server's URL from `KEYRATE_REDIS_URL`.
///
/// # Panics
///
/// When `KEYRATE_REDIS_URL` is unset or empty: run the tests with
/// `bash scripts/test.sh` (which starts the servers) or set it.
pub fn url() -> String {
    match std::env::var("KEYRATE_REDIS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "KEYRATE_REDIS_URL is not set: the Redis tests need a Redis server. Run \
             `bash scripts/test.sh` (which starts throwaway servers), or start one and set \
             KEYRATE_REDIS_URL (e.g. redis://127.0.0.1:6390)"
        ),
    }
}

/// A key prefix no other test (or earlier run) uses, free of glob
/// characters so that `KEYS prefix*` matches exactly its keys.
pub fn unique_prefix(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("keyrate-test:{test}:{}:{nanos}:{n}:", std::process::id())
}

/// The per-call timeout of the tests' limiters: far above any real call,
/// so that a loaded machine cannot fail a test by being slow.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A limiter on the test server with its own prefix. Keys get a TTL floor
/// of an hour: the tests' made-up timestamps do not advance in real time.
pub async fn limiter(test: &str, quota: Quota) -> RedisLimiter {
    let url = url();
    let limiter = RedisLimiter::connect(&url, quota)
        .await
        .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"));
    limiter
        .with_prefix(unique_prefix(test))
        .with_min_ttl(Duration::from_secs(3600))
        .with_timeout(TEST_TIMEOUT)
}

/// A plain connection to the test server, for inspecting keys.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid KEYRATE_REDIS_URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
}

/// The keys under `prefix`.
pub async fn keys(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .expect("KEYS")
}

/// The Redis Cluster's node URLs from `KEYRATE_REDIS_CLUSTER_URLS`
/// (comma-separated, e.g. `redis://127.0.0.1:7100,redis://127.0.0.1:7101`,
/// as `scripts/redis_cluster.sh start` prints them).
///
/// # Panics
///
/// When `KEYRATE_REDIS_CLUSTER_URLS` is unset or empty: run the tests with
/// `bash scripts/test.sh` (which starts the servers) or set it.
pub fn cluster_urls() -> Vec<String> {
    match std::env::var("KEYRATE_REDIS_CLUSTER_URLS") {
        Ok(urls) if !urls.is_empty() => urls.split(',').map(str::to_owned).collect(),
        _ => panic!(
            "KEYRATE_REDIS_CLUSTER_URLS is not set: the cluster tests need a Redis Cluster. \
             Run `bash scripts/test.sh` (which starts throwaway servers), or start one with \
             `scripts/redis_cluster.sh start BASE_PORT DIR` and set KEYRATE_REDIS_CLUSTER_URLS \
             to the URLs it prints"
        ),
    }
}

/// A cluster connection to the test cluster.
#[cfg(feature = "redis-cluster")]
pub async fn cluster(urls: &[String]) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::builder(urls.to_vec())
        .connection_timeout(TEST_TIMEOUT)
        .response_timeout(TEST_TIMEOUT)
        .build()
        .expect("valid KEYRATE_REDIS_CLUSTER_URLS")
        .get_async_connection()
        .await
        .unwrap_or_else(|err| {
            panic!("KEYRATE_REDIS_CLUSTER_URLS={urls:?} but no cluster answers: {err}")
        })
}

/// The keys under `prefix`, on any connection (a cluster asks every node).
pub async fn keys_on(conn: &mut impl redis::aio::ConnectionLike, prefix: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .expect("KEYS")
}

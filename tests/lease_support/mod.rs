//! What the Redis lease tests share: a limiter in a namespace of the
//! test's, waiting for a condition, a snapshot of a lease set on Redis's
//! clock, and reading an `AtLimit` denial.
#![allow(dead_code)]

use crate::redis_support::TEST_TIMEOUT;
use keyrate::{ConcurrencyDenial, KeyNames, RedisConcurrencyDenial, RedisConcurrencyLimiter};
use std::time::Duration;

/// A limiter on `url`, in `namespace` (keys encoded, so that a test can
/// name a lease set), with the tests' long deadline.
pub async fn limiter(
    url: &str,
    namespace: &str,
    max: u32,
    lease: Duration,
) -> RedisConcurrencyLimiter {
    RedisConcurrencyLimiter::connect(url, max)
        .await
        .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
        .with_namespace(namespace, KeyNames::Encoded)
        .with_lease_time(lease)
        .with_timeout(TEST_TIMEOUT)
}

/// Waits until `done` holds, checking every 20 ms; fails after a minute
/// (a bound on liveness, not a timing claim: every condition waited for
/// here is met within a few lease times on an idle machine).
pub async fn until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..3000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within a minute: {what}");
}

/// Redis's clock (Unix ms) and the lease set's expiry scores, read in one
/// script: a consistent snapshot.
pub async fn snapshot(conn: &mut redis::aio::MultiplexedConnection, set: &str) -> (u64, Vec<u64>) {
    let script = redis::Script::new(
        "local t = redis.call('TIME') \
         return {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), \
                 redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}",
    );
    let (now, members): (u64, Vec<(String, u64)>) = script
        .key(set)
        .invoke_async(conn)
        .await
        .expect("the snapshot script");
    (now, members.into_iter().map(|(_, score)| score).collect())
}

pub fn at_limit(result: Result<keyrate::RedisPermit, RedisConcurrencyDenial>) -> (u32, u32) {
    match result {
        Err(RedisConcurrencyDenial::Denied(ConcurrencyDenial::AtLimit { held, max })) => {
            (held, max)
        }
        other => panic!("expected AtLimit, got {other:?}"),
    }
}

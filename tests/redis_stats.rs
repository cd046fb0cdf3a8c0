//! The Redis limiters count their decisions like the in-memory one, plus
//! failed round trips. Needs `KEYRATE_REDIS_URL` (see `redis_support`).
#![cfg(not(loom))]

mod redis_support;

use keyrate::{AsyncLimiter, BlockingRedisLimiter, FailurePolicy, Limiter, Quota};
use redis_support::{limiter, raw, unique_prefix, url, TEST_TIMEOUT};

#[tokio::test]
async fn async_decisions_are_counted_by_outcome() {
    let limiter = limiter("stats_async", Quota::new(1.0, 3).unwrap()).await;
    assert!(limiter.allow_n("k", 0.0, 2).await);
    assert!(!limiter.allow_n("k", 0.0, 2).await);
    assert!(!limiter.allow_n("k", 0.0, 4).await);
    assert!(!limiter.allow("k", f64::NAN).await);
    let clone = limiter.clone();
    assert!(clone.allow("k", 0.0).await);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.admitted_cost), (2, 3));
    assert_eq!(stats.denied_insufficient_tokens, 1);
    assert_eq!(stats.denied_exceeds_capacity, 1);
    assert_eq!(stats.denied_invalid_timestamp, 1);
    assert_eq!(stats.backend_errors, 0);
    // The second call was denied by the deny mirror's bound, with no
    // round trip.
    assert_eq!(stats.mirror_denials, 1);

    // A bucket key holding a hash: the script fails, the failure policy
    // (closed) denies, and the call counts as a backend error only.
    let mut raw = raw(&url()).await;
    let _: () = redis::cmd("HSET")
        .arg(limiter.bucket_key("bad"))
        .arg("f")
        .arg("v")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(limiter.failure_policy(), FailurePolicy::Closed);
    assert!(limiter.check("bad", 0.0, 1).await.is_err());
    assert!(!limiter.allow("bad", 0.0).await);
    let after = limiter.stats();
    assert_eq!(after.backend_errors, 2);
    assert_eq!(after.denied(), stats.denied());
    assert_eq!(after.admitted, stats.admitted);
}

#[test]
fn blocking_decisions_and_failures_are_counted() {
    let url = url();
    let limiter = BlockingRedisLimiter::connect_blocking(&url, Quota::new(1.0, 1).unwrap())
        .unwrap()
        .with_namespace(unique_prefix("stats_blocking"), keyrate::KeyNames::Encoded)
        .with_timeout(TEST_TIMEOUT);
    assert!(limiter.allow("k", 0.0));
    assert!(!limiter.allow("k", 0.0));
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.denied_insufficient_tokens), (1, 1));
}

/// The Prometheus text shows what each backend measures, and nothing it
/// does not: a Redis limiter has no buckets, sweeps or offenders in this
/// process (they live in Redis), an in-memory one has no backend.
#[cfg(feature = "prometheus")]
#[tokio::test]
async fn metrics_show_only_what_each_backend_measures() {
    use keyrate::prometheus::Metrics;
    use std::sync::Arc;
    let redis = limiter("stats_metrics", Quota::new(1.0, 1).unwrap()).await;
    assert!(redis.allow("k", 0.0).await);
    assert!(!redis.allow("k", 0.0).await);
    let memory = keyrate::TokenBucketLimiter::new(1.0, 1);
    assert!(memory.allow("k", 0.0));
    assert!(!memory.allow("k", 0.0));
    let text = Metrics::new()
        .limiter("shared", Arc::new(redis))
        .limiter("local", Arc::new(memory))
        .render();
    let series = |name: &str, limiter: &str| {
        text.lines()
            .any(|line| line.starts_with(name) && line.contains(&format!("limiter=\"{limiter}\"")))
    };
    for limiter in ["shared", "local"] {
        assert!(series("keyrate_admitted_total", limiter), "{text}");
        assert!(series("keyrate_denied_total", limiter), "{text}");
    }
    for name in [
        "keyrate_buckets_created_total",
        "keyrate_sweeps_total",
        "keyrate_buckets{",
        "keyrate_hot_key_promotions_total",
        "keyrate_offenders_window_denials",
    ] {
        assert!(
            !series(name, "shared"),
            "{name} exported for Redis:\n{text}"
        );
        assert!(series(name, "local"), "{name} missing in memory:\n{text}");
    }
    for name in [
        "keyrate_backend_errors_total",
        "keyrate_mirror_denials_total",
    ] {
        assert!(series(name, "shared"), "{name} missing for Redis:\n{text}");
        assert!(!series(name, "local"), "{name} exported in memory:\n{text}");
    }
}

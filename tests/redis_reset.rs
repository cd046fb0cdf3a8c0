//! Resets on Redis: a key locked out by a quota set by mistake admits a
//! full burst again after `reset`; `reset_all` refills every bucket of the
//! namespace, in batches, and nothing else; the local deny mirror forgets;
//! another process's mirror over-denies for at most its refresh period.
//!
//! Needs `KEYRATE_REDIS_URL` (see `redis_support`). `reset_all_cluster` is
//! tested in `tests/cluster.rs`.
#![cfg(not(loom))]

mod redis_support;

use keyrate::{
    AsyncLimiter, BlockingRedisLimiter, KeyNames, KeySecret, Limiter, Quota, RedisLimiter,
};
use redis_support::{limiter, raw, unique_prefix, url, TEST_TIMEOUT};
use std::time::Duration;

fn quota(rate: f64, capacity: u64) -> Quota {
    Quota::new(rate, capacity).unwrap()
}

/// The operator's undo: a quota set by mistake, reverted, leaves the key
/// empty for centuries; a reset refills it, for every limiter that shares
/// the namespace.
#[tokio::test]
async fn a_reset_key_admits_a_full_burst_again() {
    let l = limiter("reset_key", quota(1.0, 5)).await;
    l.set_quota(quota(1e-9, 5)); // the mistake: 32 years a token
    assert!(l.allow_n("k", 0.0, 5).await);
    l.set_quota(quota(1.0, 5)); // reverted
    assert!(
        !l.allow("k", 1e6).await,
        "still empty: the time until full is kept"
    );
    assert_eq!(l.remaining("k", 1e6).await.unwrap(), 0);
    assert!(l.reset("k").await.unwrap());
    // The local mirror held the centuries-long bound: it forgot it.
    assert_eq!(l.remaining("k", 0.0).await.unwrap(), 5);
    for _ in 0..5 {
        assert!(l.allow("k", 0.0).await);
    }
    assert!(!l.allow("k", 0.0).await);
    assert!(!l.reset("never-seen").await.unwrap());
}

/// Another process's mirror cannot see a reset: it denies the key from its
/// stale bound for at most its refresh period, and one with a short
/// period (here none) sees the reset at once.
#[tokio::test]
async fn other_mirrors_over_deny_at_most_their_refresh_period() {
    let url = url();
    let namespace = unique_prefix("reset_mirrors");
    let secret = KeySecret::new(format!("{namespace} secret")).unwrap();
    let make = |refresh: Duration| {
        let (url, namespace, secret) = (url.clone(), namespace.clone(), secret.clone());
        async move {
            RedisLimiter::connect(&url, quota(1.0, 3))
                .await
                .unwrap()
                .with_namespace(namespace, KeyNames::Hashed(secret))
                .with_min_ttl(Duration::from_secs(3600))
                .with_timeout(TEST_TIMEOUT)
                .with_mirror_refresh(refresh)
        }
    };
    let operator = make(Duration::from_secs(1)).await;
    let stale = make(Duration::from_secs(3600)).await;
    let fresh = make(Duration::ZERO).await;
    for l in [&stale, &fresh] {
        assert!(!l.allow_n("k", 0.0, 4).await);
    }
    assert!(stale.allow_n("k", 0.0, 3).await);
    // Both mirrors now hold the empty bucket's bound.
    assert!(!stale.allow("k", 0.0).await);
    assert!(!fresh.allow("k", 0.0).await);
    let before = stale.stats().mirror_denials;
    assert!(!stale.allow("k", 0.0).await);
    assert_eq!(stale.stats().mirror_denials, before + 1, "denied locally");
    assert!(operator.reset("k").await.unwrap());
    // The documented consequence: within its refresh period, the other
    // process's mirror still denies.
    assert!(!stale.allow("k", 0.0).await);
    // A mirror whose bound is due for a refresh asks Redis, and admits.
    assert!(fresh.allow_n("k", 0.0, 3).await);
}

/// `reset_all` refills every bucket of its namespace, over several `SCAN`
/// batches, and touches no other namespace.
#[tokio::test]
async fn reset_all_refills_the_namespace_only() {
    let l = limiter("reset_all", quota(1.0, 1)).await;
    let other = limiter("reset_all_other", quota(1.0, 1)).await;
    const KEYS: usize = 2500; // more than one batch of 1,000
    let calls: Vec<_> = (0..KEYS).map(|i| format!("k{i}")).collect();
    for chunk in calls.chunks(100) {
        let admitted = futures_util::future::join_all(chunk.iter().map(|k| l.allow(k, 0.0))).await;
        assert!(admitted.into_iter().all(|a| a));
    }
    assert!(other.allow("k0", 0.0).await);
    assert!(!l.allow("k0", 0.0).await);
    assert_eq!(l.reset_all().await.unwrap(), KEYS as u64);
    let mut conn = raw(&url()).await;
    assert!(redis_support::keys(&mut conn, l.bucket_key_prefix())
        .await
        .is_empty());
    for k in ["k0", "k1", "k2499"] {
        assert!(l.allow(k, 0.0).await, "{k} full again");
    }
    assert!(
        !other.allow("k0", 0.0).await,
        "another namespace is untouched"
    );
    assert_eq!(l.reset_all().await.unwrap(), 3);
}

#[test]
fn blocking_resets() {
    let url = url();
    let l = BlockingRedisLimiter::connect_blocking(&url, quota(1.0, 2))
        .unwrap()
        .with_namespace(unique_prefix("reset_blocking"), keyrate::KeyNames::Encoded)
        .with_min_ttl(Duration::from_secs(3600))
        .with_timeout(TEST_TIMEOUT);
    assert!(l.allow_n("a", 0.0, 2));
    assert!(l.allow_n("b", 0.0, 2));
    assert!(!l.allow("a", 0.0));
    assert!(l.reset_blocking("a").unwrap());
    assert!(l.allow_n("a", 0.0, 2));
    assert_eq!(l.reset_all_blocking().unwrap(), 2);
    assert!(l.allow_n("a", 0.0, 2) && l.allow_n("b", 0.0, 2));
}

//! Compound calls on Redis (`AsyncCompound`, `Compound`): the exact model
//! of `tests/compound_model` on a standalone Redis (async; the blocking
//! limiter: `redis_compound_blocking.rs`) and on a Redis Cluster (feature `redis-cluster`); bad input; a denial
//! by one scope that spends nothing in the others; the deny mirror; the
//! counters by binding bucket.
//!
//! Needs `KEYRATE_REDIS_URL` (and `KEYRATE_REDIS_CLUSTER_URLS` for the
//! cluster), see `redis_support`. Every test names its own namespace.
#![cfg(not(loom))]

mod compound_model;
mod redis_support;

use compound_model::{cases, quota, run_against_model, runner, T0};
use keyrate::{
    AsyncCompound, BlockingRedisLimiter, CompoundDenial, ConfigError, Policy, Quota,
    RedisCompoundDenial, RedisErrorKind, RedisLimiter,
};
use redis_support::{limiter, unique_prefix, TEST_TIMEOUT};
use std::time::Duration;

const SEC: u64 = 1_000_000_000;

/// Every answer equals the model's, through the async limiter with its
/// buckets placed by an anchor, and through one whose namespace is the
/// hash tag; the mirror (on by default) denied some calls locally and
/// stayed exact.
#[test]
fn async_matches_the_model() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let base = runtime.block_on(limiter("compound_model", Quota::new(1.0, 1).unwrap()));
    let case = std::cell::Cell::new(0u64);
    runner()
        .run(&cases(), |(policies, calls)| {
            case.set(case.get() + 1);
            let limiter = base
                .clone()
                .with_namespace(unique_prefix("compound_model"), keyrate::KeyNames::Encoded);
            runtime.block_on(async {
                if case.get() % 2 == 0 {
                    run_against_model(&limiter.placed("org"), "", &policies, &calls).await
                } else {
                    let tagged = limiter.with_hash_tag(true);
                    run_against_model(&tagged, "", &policies, &calls).await
                }
            })
        })
        .unwrap();
    let stats = base.compound_stats();
    assert!(
        stats.admitted > 0 && stats.denied_insufficient_tokens > 0,
        "{stats:?}"
    );
    assert!(
        stats.mirror_denials > 0,
        "the mirror denied nothing: {stats:?}"
    );
}

fn denial<T: std::fmt::Debug>(result: Result<T, RedisCompoundDenial>) -> CompoundDenial {
    match result {
        Err(RedisCompoundDenial::Denied(denial)) => denial,
        other => panic!("expected a denial, got {other:?}"),
    }
}

/// Bad input is a typed error and spends nothing: no key is written.
#[tokio::test]
async fn bad_input_spends_nothing() {
    let prefix = unique_prefix("compound_bad");
    let limiter = limiter("compound_bad", Quota::new(1.0, 1).unwrap())
        .await
        .with_namespace(prefix.clone(), keyrate::KeyNames::Encoded);
    let q = quota(SEC, 3);
    assert_eq!(Policy::new([]), Err(ConfigError::EmptyPolicy));
    assert_eq!(
        Policy::new([q; 9]),
        Err(ConfigError::TooManyQuotas { count: 9 })
    );
    let policy = Policy::new([q, quota(SEC, 2)]).unwrap();
    let placed = limiter.placed("org");
    let at = Duration::from_nanos(T0);
    assert_eq!(
        denial(AsyncCompound::<str>::check_scopes(&placed, &[], at, 1).await),
        CompoundDenial::NoScopes
    );
    assert_eq!(
        denial(
            placed
                .check_scopes(&[("a", &policy), ("b", &policy), ("a", &policy)], at, 1)
                .await
        ),
        CompoundDenial::DuplicateKey {
            first: 0,
            second: 2
        }
    );
    assert_eq!(
        denial(placed.check_scopes(&[("a", &policy)], at, 3).await),
        CompoundDenial::ExceedsCapacity {
            cost: 3,
            capacity: 2,
            scope: 0,
            quota: 1
        }
    );
    assert_eq!(
        denial(placed.check_scopes(&[("a", &policy)], f64::NAN, 1).await),
        CompoundDenial::InvalidTimestamp
    );
    // Unplaced, each key has its own slot (three keys in one slot: odds
    // of 2^-28): refused on a standalone Redis too.
    let three = [("a", &policy), ("b", &policy), ("c", &policy)];
    assert!(matches!(
        denial(AsyncCompound::check_scopes(&limiter, &three, at, 1).await),
        CompoundDenial::CrossSlot { first: 0, .. }
    ));
    let mut raw = redis_support::raw(&redis_support::url()).await;
    assert_eq!(
        redis_support::keys(&mut raw, &prefix).await,
        Vec::<String>::new()
    );
    let stats = limiter.compound_stats();
    assert_eq!(stats.denied_bad_call, 3);
    assert_eq!(stats.denied_exceeds_capacity, 1);
    assert_eq!(stats.denied_by(0, 1), 1);
    // A bucket key that holds something else: a typed failure, unwritten.
    redis::cmd("SET")
        .arg(limiter.bucket_key("f"))
        .arg("not words")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    match limiter.check_policy("f", &policy, at, 1).await {
        Err(RedisCompoundDenial::Failed(err)) => assert_eq!(err.kind(), RedisErrorKind::Script),
        other => panic!("{other:?}"),
    }
    let value: String = redis::cmd("GET")
        .arg(limiter.bucket_key("f"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(value, "not words");
}

/// A key under its plan and its organization: the org's ceiling denies
/// the key while its own buckets hold tokens, and the denial spends
/// nothing from them (their Redis value is unchanged). Then the mirror:
/// the same call again is denied without a round trip, with the same
/// exact wait, and at that wait it is admitted.
#[tokio::test]
async fn org_ceiling_denies_and_spends_nothing() {
    let limiter = limiter("compound_org", Quota::new(1.0, 1).unwrap()).await;
    let plan = Policy::new([quota(SEC / 10, 10), quota(10 * SEC, 20)]).unwrap();
    let org = Policy::from(quota(SEC, 4));
    let placed = limiter.placed("org_7");
    let at = |ns: u64| Duration::from_nanos(T0 + ns);
    let a = [("sk_a", &plan), ("org_7", &org)];
    let b = [("sk_b", &plan), ("org_7", &org)];
    assert!(placed.check_scopes(&a, at(0), 3).await.is_ok());
    let mut raw = redis_support::raw(&redis_support::url()).await;
    let before: Option<String> = redis::cmd("GET")
        .arg(limiter.placed_bucket_key("sk_b", "org_7"))
        .query_async(&mut raw)
        .await
        .unwrap();
    let denied = denial(placed.check_scopes(&b, at(0), 2).await);
    assert_eq!(
        denied,
        CompoundDenial::InsufficientTokens {
            retry_after: Duration::from_secs(1),
            scope: 1,
            quota: 0
        }
    );
    assert_eq!(
        placed.remaining_policy("sk_b", &plan, at(0)).await.unwrap(),
        10
    );
    let after: Option<String> = redis::cmd("GET")
        .arg(limiter.placed_bucket_key("sk_b", "org_7"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(before, after, "the denied call wrote the key's bucket");
    // Denied again by the mirror, exactly.
    let local = limiter.compound_stats().mirror_denials;
    assert_eq!(
        denial(placed.check_scopes(&b, at(SEC / 2), 2).await).retry_after(),
        Some(Duration::from_millis(500))
    );
    assert_eq!(limiter.compound_stats().mirror_denials, local + 1);
    let decision = placed.check_scopes(&b, at(SEC), 2).await.unwrap();
    assert_eq!(
        (decision.remaining(), decision.scope(), decision.quota()),
        (0, 1, 0)
    );
    let stats = limiter.compound_stats();
    assert_eq!(stats.denied_by(1, 0), 2);
    assert_eq!(stats.admitted, 2);
}

/// A one-quota compound bucket is the single-quota limiter's bucket.
#[tokio::test]
async fn one_quota_is_the_single_bucket() {
    use keyrate::AsyncLimiter;
    let q = quota(SEC, 5);
    let limiter = limiter("compound_single", q).await;
    let at = Duration::from_nanos(T0);
    assert!(AsyncLimiter::check(&limiter, "k", at, 2).await.is_ok());
    let policy = Policy::from(q);
    assert_eq!(limiter.remaining_policy("k", &policy, at).await.unwrap(), 3);
    assert!(limiter.check_policy("k", &policy, at, 3).await.is_ok());
    assert_eq!(AsyncLimiter::remaining(&limiter, "k", at).await.unwrap(), 0);
}

/// Redis's own clock: a call at `Now` is decided at Redis's `TIME`.
#[tokio::test]
async fn at_redis_s_clock() {
    let limiter = limiter("compound_now", Quota::new(1.0, 1).unwrap()).await;
    let policy = Policy::new([Quota::new(1.0, 2).unwrap(), Quota::new(0.001, 3).unwrap()]).unwrap();
    let placed = limiter.placed("o");
    assert!(placed
        .check_policy("k", &policy, keyrate::Now, 2)
        .await
        .is_ok());
    let denied = denial(placed.check_policy("k", &policy, keyrate::Now, 2).await);
    assert!(
        matches!(
            denied,
            CompoundDenial::InsufficientTokens {
                scope: 0,
                quota: 1,
                ..
            }
        ),
        "{denied:?}"
    );
}

/// On a Redis Cluster: the model, with calls anchored by several anchors
/// (so on several masters), and unplaced calls refused before Redis.
#[cfg(feature = "redis-cluster")]
mod cluster {
    use super::*;

    #[test]
    fn cluster_matches_the_model() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let urls = redis_support::cluster_urls();
        let base = runtime.block_on(async {
            RedisLimiter::with_connection(
                redis_support::cluster(&urls).await,
                Quota::new(1.0, 1).unwrap(),
            )
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(TEST_TIMEOUT)
        });
        let case = std::cell::Cell::new(0u64);
        runner()
            .run(&cases(), |(policies, calls)| {
                case.set(case.get() + 1);
                let limiter = base.clone().with_namespace(
                    unique_prefix("cluster_compound"),
                    keyrate::KeyNames::Encoded,
                );
                let anchor = format!("org{}", case.get());
                runtime.block_on(run_against_model(
                    &limiter.placed(&anchor),
                    "",
                    &policies,
                    &calls,
                ))
            })
            .unwrap();
        let limiter = base.clone().with_namespace(
            unique_prefix("cluster_compound_cross"),
            keyrate::KeyNames::Encoded,
        );
        let p = Policy::from(quota(SEC, 1));
        let at = Duration::from_nanos(T0);
        let three = [("a", &p), ("b", &p), ("c", &p)];
        let refused = runtime.block_on(AsyncCompound::check_scopes(&limiter, &three, at, 1));
        assert!(matches!(
            denial(refused),
            CompoundDenial::CrossSlot { first: 0, .. }
        ));
    }
}

#[test]
fn public_types_are_send_sync_debug() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<RedisCompoundDenial>();
    check::<keyrate::Placed<'static, RedisLimiter>>();
    check::<keyrate::Placed<'static, BlockingRedisLimiter>>();
    check::<keyrate::CompoundStats>();
}

/// `reset_all` refills placed compound buckets too, and the mirror
/// forgets their words: a call the mirror denied before is admitted after;
/// a placed bucket is reset alone by its anchor's view.
#[tokio::test]
async fn reset_all_reaches_placed_buckets() {
    let prefix = unique_prefix("compound_reset");
    let limiter = limiter("compound_reset", Quota::new(1.0, 1).unwrap())
        .await
        .with_namespace(prefix.clone(), keyrate::KeyNames::Encoded);
    let policy = Policy::new([quota(SEC, 2), quota(60 * SEC, 3)]).unwrap();
    let at = Duration::from_nanos(T0);
    let placed = limiter.placed("org");
    let scopes = [("k", &policy), ("org", &policy)];
    assert!(placed.check_scopes(&scopes, at, 2).await.is_ok());
    assert!(placed.check_scopes(&scopes, at, 1).await.is_err());
    assert!(limiter.check_policy("plain", &policy, at, 1).await.is_ok());
    let mut raw = redis_support::raw(&redis_support::url()).await;
    assert_eq!(redis_support::keys(&mut raw, &prefix).await.len(), 3);
    assert_eq!(limiter.reset_all().await.unwrap(), 3);
    assert!(redis_support::keys(&mut raw, &prefix).await.is_empty());
    assert!(placed.check_scopes(&scopes, at, 2).await.is_ok());
    // One placed key reset alone: it holds its burst again, the org not.
    assert!(placed.reset("k").await.unwrap());
    assert!(!placed.reset("k").await.unwrap());
    assert!(placed.check_policy("org", &policy, at, 1).await.is_err());
    assert!(placed.check_policy("k", &policy, at, 2).await.is_ok());
}

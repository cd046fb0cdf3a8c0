//! `RedisConcurrencyLimiter` on a real Redis (`KEYRATE_REDIS_URL`): two
//! limiters sharing a limit never exceed it together, renewals and
//! releases, a permit that outlives its runtime, and bad input. A process
//! killed with its permits, a Redis restart and Redis's calls per held
//! permit: `tests/redis_lease_failures.rs`; the cluster:
//! `tests/redis_leases_cluster.rs`.
//!
//! Every test names its own namespace (`unique_prefix`), so that two
//! copies of this binary can run at once on one Redis.
#![cfg(not(loom))]

mod lease_support;
mod redis_support;

use keyrate::{FailurePolicy, RedisConcurrencyDenial, RedisConcurrencyLimiter, RedisErrorKind};
use lease_support::{at_limit, limiter, snapshot, until};
use redis_support::{raw, unique_prefix, url};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_on_one_redis_never_exceed_max_together() {
    const MAX: u32 = 3;
    let url = url();
    let namespace = unique_prefix("leases-two");
    let a = limiter(&url, &namespace, MAX, Duration::from_secs(15)).await;
    let b = limiter(&url, &namespace, MAX, Duration::from_secs(15)).await;
    let holding = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let (admitted, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for task in 0..12 {
        let limiter = if task % 2 == 0 { a.clone() } else { b.clone() };
        let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
        let (admitted, refused) = (Arc::clone(&admitted), Arc::clone(&refused));
        tasks.push(tokio::spawn(async move {
            for _ in 0..150 {
                match limiter.try_acquire("hot").await {
                    Ok(permit) => {
                        assert!(!permit.is_degraded());
                        assert!(permit.held() <= MAX, "Redis counted {}", permit.held());
                        let now = holding.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        assert!(now <= MAX, "{now} holders at once, limit {MAX}");
                        tokio::task::yield_now().await;
                        // Out of the count before the release is queued.
                        holding.fetch_sub(1, SeqCst);
                        drop(permit);
                        admitted.fetch_add(1, SeqCst);
                    }
                    Err(denial) => {
                        let (held, max) = at_limit(Err(denial));
                        assert!(held >= max && max == MAX, "{held} of {max}");
                        refused.fetch_add(1, SeqCst);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task panicked");
    }
    let (admitted, refused) = (admitted.load(SeqCst), refused.load(SeqCst));
    println!(
        "admitted {admitted}, refused {refused}, most at once {}",
        most.load(SeqCst)
    );
    assert!(
        admitted > 0 && refused > 0,
        "{admitted} admitted, {refused} refused"
    );
    assert_eq!(admitted + refused, 12 * 150);
    assert!(most.load(SeqCst) <= MAX);
    // Every release reaches Redis: the set empties.
    until("every lease released", || async {
        a.held("hot").await.unwrap() == 0
    })
    .await;
    for limiter in [&a, &b] {
        let stats = limiter.stats();
        assert_eq!((stats.held, stats.leases_lost, stats.failed), (0, 0, 0));
        assert_eq!(stats.released, stats.acquired);
    }
    assert_eq!(a.stats().acquired + b.stats().acquired, admitted);
}

#[tokio::test]
async fn renewals_keep_a_lease_past_its_lease_time_and_a_drop_releases_it() {
    let url = url();
    let namespace = unique_prefix("leases-renew");
    let limiter = limiter(&url, &namespace, 1, Duration::from_secs(3)).await;
    let set = limiter.lease_key("k");
    let mut conn = raw(&url).await;
    let permit = limiter.try_acquire("k").await.unwrap();
    let acquired = permit.acquired_at().unwrap().as_millis() as u64;
    let (_, scores) = snapshot(&mut conn, &set).await;
    assert_eq!(
        scores,
        vec![acquired + 3000],
        "expiry = Redis's TIME + lease"
    );
    // Past the first expiry on Redis's clock, the lease is still held.
    until("Redis's clock passes the first expiry", || {
        let (mut conn, set) = (conn.clone(), set.clone());
        async move { snapshot(&mut conn, &set).await.0 > acquired + 3000 }
    })
    .await;
    let (now, scores) = snapshot(&mut conn, &set).await;
    assert_eq!(scores.len(), 1);
    assert!(scores[0] > now, "renewed: {} > {now}", scores[0]);
    assert_eq!(at_limit(limiter.try_acquire("k").await), (1, 1));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&set)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        ttl > 0 && ttl <= 3000,
        "the set expires with its last lease: {ttl}"
    );
    assert!(limiter.stats().renew_rounds >= 1);

    // A drop after the limiter is gone still releases.
    drop(limiter);
    drop(permit);
    let checker = self::limiter(&url, &namespace, 1, Duration::from_secs(3)).await;
    until("the release reaches Redis", || async {
        checker.held("k").await.unwrap() == 0
    })
    .await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&set)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "an empty lease set is gone");
}

#[test]
fn a_permit_dropped_after_its_runtime_is_gone_does_not_panic() {
    let url = url();
    let namespace = unique_prefix("leases-runtime");
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let (limiter, permit) = first.block_on(async {
        let limiter = limiter(&url, &namespace, 1, Duration::from_millis(300)).await;
        let permit = limiter.try_acquire("k").await.unwrap();
        (limiter, permit)
    });
    drop(first); // the renewal task goes with it
    drop(permit); // queued to a task that is gone: nothing happens
                  // The limiter's connection lived on that runtime too (redis-rs drives
                  // it from a task there): a limiter of the same namespace, on another
                  // runtime, sees the orphaned lease expire within its lease time.
    drop(limiter);
    runtime().block_on(async {
        let checker = limiter_on(&url, &namespace).await;
        until("the orphaned lease expires", || async {
            checker.held("k").await.unwrap() == 0
        })
        .await;
        assert!(!checker.try_acquire("k").await.unwrap().is_degraded());
    });
}

async fn limiter_on(url: &str, namespace: &str) -> RedisConcurrencyLimiter {
    limiter(url, namespace, 1, Duration::from_millis(300)).await
}

#[tokio::test]
async fn bad_input_gets_clear_answers() {
    let url = url();
    let err = RedisConcurrencyLimiter::connect(&url, 0).await.unwrap_err();
    assert_eq!(err.kind(), RedisErrorKind::Config);
    assert!(err.to_string().contains("at least 1"), "{err}");
    let conn = raw(&url).await;
    assert_eq!(
        RedisConcurrencyLimiter::with_connection(conn.clone(), 0).unwrap_err(),
        keyrate::ConfigError::ZeroMaxPermits
    );

    let namespace = unique_prefix("leases-bad");
    let limiter = limiter(&url, &namespace, 2, Duration::from_secs(15)).await;
    // A limit of 0 per call refuses without Redis; set_max(0) is refused.
    assert_eq!(at_limit(limiter.try_acquire_under("k", 0).await), (0, 0));
    assert!(limiter.set_max(0).is_err());
    assert_eq!(limiter.max(), 2);
    // Lease times are kept in range.
    let lease = |d| limiter.clone().with_lease_time(d).lease_time();
    assert_eq!(lease(Duration::ZERO), Duration::from_millis(300));
    assert_eq!(lease(Duration::MAX), Duration::from_secs(24 * 3600));
    // Any key: empty, a megabyte, braces and bytes that are not ASCII.
    for key in [String::new(), "x".repeat(1 << 20), "{é}|~#*".to_owned()] {
        let permit = limiter.try_acquire(&key).await.unwrap();
        assert_eq!(permit.held(), 1);
    }
    // A key holding something else: a script error, answered by the
    // failure policy.
    let mut raw_conn = conn.clone();
    let _: () = redis::cmd("SET")
        .arg(limiter.lease_key("taken"))
        .arg("not a set")
        .query_async(&mut raw_conn)
        .await
        .unwrap();
    match limiter.try_acquire("taken").await {
        Err(RedisConcurrencyDenial::Failed(err)) => assert_eq!(err.kind(), RedisErrorKind::Script),
        other => panic!("expected a script failure, got {other:?}"),
    }
    let open = limiter.clone().with_failure_policy(FailurePolicy::Open);
    assert!(open.try_acquire("taken").await.unwrap().is_degraded());
    assert_eq!(limiter.stats().failed, 2);
    assert_eq!(limiter.stats().degraded, 1);
    let _: () = redis::cmd("DEL")
        .arg(limiter.lease_key("taken"))
        .query_async(&mut raw_conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_types_are_send_and_sync_and_debug_shows_no_key() {
    fn send_sync<T: Send + Sync + std::fmt::Debug>() {}
    send_sync::<RedisConcurrencyLimiter>();
    send_sync::<keyrate::RedisPermit>();
    send_sync::<RedisConcurrencyDenial>();
    send_sync::<keyrate::RedisConcurrencyStats>();
    let url = url();
    let namespace = unique_prefix("leases-debug");
    let limiter = limiter(&url, &namespace, 1, Duration::from_secs(15)).await;
    let permit = limiter.try_acquire("sk_live_secret").await.unwrap();
    assert!(!format!("{permit:?}").contains("sk_live_secret"));
    let denial = limiter.try_acquire("sk_live_secret").await.unwrap_err();
    assert!(!format!("{denial:?} {denial}").contains("sk_live_secret"));
}

#[tokio::test]
async fn renewal_batches_find_exactly_the_leases_lost() {
    const KEYS: usize = 600; // more than one renew call's 512 leases
    let url = url();
    let namespace = unique_prefix("leases-batches");
    let limiter = limiter(&url, &namespace, 1, Duration::from_secs(3)).await;
    let mut held = Vec::new();
    for key in 0..KEYS {
        held.push(limiter.try_acquire(&format!("k{key}")).await.unwrap());
    }
    // Lost behind the limiter's back: every seventh key's set deleted.
    let mut conn = raw(&url).await;
    let gone: Vec<String> = (0..KEYS)
        .step_by(7)
        .map(|key| limiter.lease_key(&format!("k{key}")))
        .collect();
    let _: () = redis::cmd("DEL")
        .arg(&gone)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Two rounds: the second began after the deletion.
    let before = limiter.stats();
    let start = before.renew_rounds;
    until("two renewal rounds over every lease", || async {
        limiter.stats().renew_rounds >= start + 2
    })
    .await;
    let stats = limiter.stats();
    assert_eq!(stats.leases_lost, gone.len() as u64);
    assert_eq!(stats.renew_failures, 0);
    // Two calls a round or more (over 512 leases): every round since
    // `before` but the first (maybe under way then) began after the last
    // acquire.
    let rounds = stats.renew_rounds - before.renew_rounds;
    let calls = stats.renew_calls - before.renew_calls;
    assert!(
        calls >= 2 * (rounds - 1),
        "{calls} calls in {rounds} rounds"
    );
    // The others were renewed and are still held; the lost ones admit again.
    for key in 0..KEYS {
        let name = format!("k{key}");
        let expected = u32::from(key % 7 != 0);
        assert_eq!(limiter.held(&name).await.unwrap(), expected, "{name}");
    }
    drop(held);
    until("every release reaches Redis", || async {
        limiter.held("k1").await.unwrap() == 0 && limiter.held("k599").await.unwrap() == 0
    })
    .await;
}

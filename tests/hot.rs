//! The per-thread hot-key cache: a key that a thread keeps calling is
//! spent through that thread's cache, with the same decisions as through
//! the map, and its bucket is pinned only while a thread caches it.
#![cfg(not(loom))]

mod common;

use common::model::{as_secs, outcome, Model};
use common::sync::Barrier;
use keyrate::{Denial, Quota, TokenBucketLimiter};
use proptest::prelude::*;
use std::sync::Arc;
use std::thread;

/// Calls in a row on one key, all through the map, that get it cached: a
/// quarter of the lookups vote, at random, and 16 votes promote, so about
/// 64 on average; 300 leave a key uncached with probability 2e-20.
const HOT_CALLS: usize = 300;

/// Keys the calling threads' hot-key caches took in for `limiter`: the
/// observable that a test meant for the hot path took it.
fn promotions(limiter: &TokenBucketLimiter) -> u64 {
    limiter.stats().hot_key_promotions
}

#[test]
fn a_cached_bucket_is_swept_like_any_other() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1000));
    let cached = Arc::new(Barrier::new(2));
    let swept = Arc::new(Barrier::new(2));
    let worker = {
        let (limiter, cached, swept) = (limiter.clone(), cached.clone(), swept.clone());
        thread::spawn(move || {
            // A failure here must not leave the main thread waiting.
            let _guards = (cached.guard(), swept.guard());
            for _ in 0..HOT_CALLS {
                assert!(limiter.allow("hot", 0.0));
            }
            cached.wait();
            swept.wait();
            // The cached bucket was retired: these calls must reach the
            // map's new bucket, not spend on the retired one.
            (0..2000).filter(|_| limiter.allow("hot", 1e6)).count()
        })
    };
    let _guards = (cached.guard(), swept.guard());
    cached.wait();
    assert_eq!(limiter.remaining("hot", 0.0), Ok(1000 - HOT_CALLS as u64));
    assert_eq!(promotions(&limiter), 1, "the worker caches the key");
    // Full again at 1e6 s: swept although the worker caches it.
    assert_eq!(limiter.sweep(1e6), 1);
    assert!(limiter.is_empty());
    swept.wait();
    assert_eq!(worker.join().unwrap(), 1000);
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.remaining("hot", 1e6), Ok(0));
}

#[test]
fn cached_keys_never_hold_places_under_the_cap() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1000).with_max_buckets(2));
    let cached = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let worker = {
        let (limiter, cached, release) = (limiter.clone(), cached.clone(), release.clone());
        thread::spawn(move || {
            let _guards = (cached.guard(), release.guard());
            // Both keys win this thread's vote in turn and fill its two
            // slots.
            for key in ["a", "b"] {
                for _ in 0..HOT_CALLS {
                    assert!(limiter.allow(key, 0.0));
                }
            }
            cached.wait();
            release.wait();
        })
    };
    let _guards = (cached.guard(), release.guard());
    cached.wait();
    assert_eq!(promotions(&limiter), 2, "the worker caches both keys");
    assert_eq!(
        limiter.check("c", 0.0, 1),
        Err(Denial::LimiterFull { max_buckets: 2 })
    );
    // Once full, the cached buckets go, and their places with them, while
    // the worker that caches them still lives.
    assert_eq!(limiter.sweep(1e6), 2);
    assert!(limiter.allow("c", 1e6));
    assert!(limiter.allow("d", 1e6));
    release.wait();
    worker.join().unwrap();
}

#[test]
fn limiters_sharing_a_thread_and_a_key_keep_their_own_buckets() {
    let big = TokenBucketLimiter::new(1.0, 300);
    let small = TokenBucketLimiter::new(1.0, 5);
    let ids = TokenBucketLimiter::<u64>::with_quota(Quota::new(1.0, 7).unwrap());
    let (mut big_admitted, mut small_admitted, mut ids_admitted) = (0, 0, 0);
    // Blocks long enough for each limiter's key to win this thread's vote,
    // so three limiters share this thread's cache slots.
    for _ in 0..4 {
        for _ in 0..HOT_CALLS {
            small_admitted += u64::from(small.allow("k", 0.0));
        }
        for _ in 0..HOT_CALLS {
            ids_admitted += u64::from(ids.allow(&7, 0.0));
        }
        for _ in 0..HOT_CALLS {
            big_admitted += u64::from(big.allow("k", 0.0));
        }
    }
    assert_eq!((big_admitted, small_admitted, ids_admitted), (300, 5, 7));
    // Each key was cached once, and stayed cached (four keys in 32 sets of
    // eight ways evict none).
    assert_eq!(
        (
            promotions(&big),
            promotions(&small),
            ids.stats().hot_key_promotions
        ),
        (1, 1, 1)
    );
    // A new limiter never inherits a dropped one's cached bucket (`big`,
    // hammered last, is still in this thread's cache).
    drop(big);
    let fresh = TokenBucketLimiter::new(1.0, 50);
    let admitted = (0..HOT_CALLS).filter(|_| fresh.allow("k", 0.0)).count();
    assert_eq!(admitted, 50);
    assert_eq!(promotions(&fresh), 1);
}

/// One hot key at one instant, spent at once by three threads: two keyed
/// callers that each cache it (or, `with_handles`, one keyed caller and one
/// handle), and a keyed caller that alternates with other keys. Together
/// they must admit exactly the capacity.
fn three_paths_on_one_key(with_handles: bool) {
    const CAPACITY: u64 = 20_000;
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, CAPACITY));
    let start = Arc::new(Barrier::new(3));
    let spawn = |role: usize| {
        let (limiter, start) = (limiter.clone(), start.clone());
        thread::spawn(move || {
            let _guard = start.guard();
            let handle = (with_handles && role == 1).then(|| limiter.bucket("hot"));
            start.wait();
            let mut admitted = 0u64;
            for i in 0..3 * CAPACITY {
                admitted += u64::from(match (role, &handle) {
                    (_, Some(handle)) => handle.allow(5.0),
                    (0 | 1, None) => limiter.allow("hot", 5.0),
                    _ => {
                        let _ = limiter.allow(&format!("other{}", i % 97), 5.0);
                        limiter.allow("hot", 5.0)
                    }
                });
            }
            admitted
        })
    };
    let workers: Vec<_> = (0..3).map(spawn).collect();
    let admitted: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(admitted, CAPACITY);
    assert_eq!(limiter.remaining("hot", 5.0), Ok(0));
    // Each keyed caller that only calls "hot" cached it.
    let cachers = if with_handles { 1 } else { 2 };
    assert!(promotions(&limiter) >= cachers, "{:?}", limiter.stats());
}

#[test]
fn cached_and_map_paths_share_one_bucket_under_threads() {
    // The key is inline in the map when the race starts: the first thread
    // to cache it moves its word out while the others spend on it.
    three_paths_on_one_key(false);
}

#[test]
fn cached_handle_and_map_paths_share_one_bucket_under_threads() {
    three_paths_on_one_key(true);
}

/// A block of calls in a row on one key.
#[derive(Debug, Clone)]
struct Block {
    key: usize,
    calls: usize,
    /// Nanoseconds between calls, as a fraction of one token's interval
    /// (in 1/4ths), so blocks both drain and refill.
    step_quarters: u64,
    /// First cost of the block; costs then cycle through `0..=capacity+1`.
    cost: u64,
    sweep: bool,
}

/// Blocks of calls; the first one long enough to cache its key, whatever
/// its costs (all but those above the capacity, at most a third, are map
/// lookups until it is cached: `2 * HOT_CALLS` calls make `HOT_CALLS`).
fn blocks() -> impl Strategy<Value = Vec<Block>> {
    let rest = prop::collection::vec(
        (
            0usize..3,
            1usize..200,
            0u64..6,
            0u64..8,
            prop::bool::weighted(0.2),
        )
            .prop_map(|(key, calls, step_quarters, cost, sweep)| Block {
                key,
                calls,
                step_quarters,
                cost,
                sweep,
            }),
        0..24,
    );
    let first = (2 * HOT_CALLS..3 * HOT_CALLS, 0u64..6, 0u64..8);
    (first, rest).prop_map(|((calls, step_quarters, cost), mut rest)| {
        let hot = Block {
            key: 0,
            calls,
            step_quarters,
            cost,
            sweep: false,
        };
        rest.insert(0, hot);
        rest
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Long runs on one key (cached after 64 net calls) mixed with runs on
    /// others, sweeps and cache evictions: every decision, and every wait,
    /// equals the exact model.
    #[test]
    fn cached_decisions_equal_the_exact_model(
        rate in prop::sample::select(vec![(1u64, 1u64), (3, 1), (7, 2), (1000, 1)]),
        capacity in 1u64..8,
        blocks in blocks(),
    ) {
        let (num, den) = rate;
        let mut model = Model::rounded(num, den, capacity);
        let quota = Quota::new(model.rate(), capacity).unwrap();
        let limiter = TokenBucketLimiter::<String>::with_quota(quota);
        let keys = ["sk_live_a", "sk_live_b", "sk_live_c"];
        let interval = model.spend_ns(1);
        let mut now = 1_000_000_000u64;
        for block in &blocks {
            let key = keys[block.key];
            for i in 0..block.calls {
                let (secs, seen) = as_secs(now);
                let cost = (block.cost + i as u64) % (capacity + 2);
                let want = model.call(key, seen, cost);
                prop_assert_eq!(outcome(limiter.check(key, secs, cost)), want);
                now += interval * block.step_quarters / 4;
            }
            if block.sweep {
                let (secs, _) = as_secs(now);
                limiter.sweep(secs);
            }
        }
        let (secs, seen) = as_secs(now);
        for key in keys {
            prop_assert_eq!(limiter.remaining(key, secs), Ok(model.remaining(key, seen)));
        }
        // The first block's key was cached: decisions came from the cache.
        prop_assert!(promotions(&limiter) >= 1);
    }
}

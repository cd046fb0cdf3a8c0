//! Both stores ([`Store::Sharded`], the default, and [`Store::DashMap`])
//! decide alike: the same exact admissions under real threads, the same
//! eviction, cap, handles and hot-key cache.
#![cfg(not(loom))]

mod common;

use common::api_key;
use keyrate::{Denial, Store, TokenBucketLimiter};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const STORES: [Store; 2] = [Store::Sharded, Store::DashMap];

fn limiter(store: Store, rate: f64, capacity: u64) -> TokenBucketLimiter {
    TokenBucketLimiter::new(rate, capacity).with_store(store)
}

#[test]
fn threads_at_one_instant_admit_exactly_capacity_per_key() {
    const KEYS: u64 = 64;
    const CAPACITY: u64 = 50;
    for store in STORES {
        let limiter = limiter(store, 1.0, CAPACITY);
        assert_eq!(limiter.store(), store);
        let admitted: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let (limiter, admitted) = (&limiter, &admitted);
                scope.spawn(move || {
                    // Every key is called far more than its capacity, and one
                    // key is hammered, so that the hot-key cache takes it in.
                    for i in 0..20_000u64 {
                        let key = if i % 2 == 0 { 0 } else { (i + thread) % KEYS };
                        if limiter.allow(api_key(key).as_str(), 5.0) {
                            admitted[key as usize].fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        for (key, count) in admitted.iter().enumerate() {
            assert_eq!(count.load(Relaxed), CAPACITY, "{store:?}, key {key}");
        }
        assert_eq!(limiter.len(), KEYS as usize, "{store:?}");
        assert!(limiter.stats().hot_key_promotions >= 1, "{store:?}");
    }
}

#[test]
fn sweeps_evict_exactly_the_full_buckets() {
    for store in STORES {
        let limiter = limiter(store, 1.0, 4);
        assert!(limiter.allow_n("a", 0.0, 1)); // full again at 1 s
        assert!(limiter.allow_n("b", 0.0, 3)); // full again at 3 s
        let handle = limiter.bucket("c");
        assert!(handle.allow_n(0.0, 4)); // full again at 4 s, pinned
        assert_eq!(limiter.sweep(0.5), 0, "{store:?}");
        assert_eq!(limiter.sweep(1.0), 1, "{store:?}");
        assert_eq!(limiter.sweep(10.0), 1, "{store:?}: the handle pins c");
        assert_eq!(limiter.remaining("c", 2.0), Ok(2), "{store:?}");
        drop(handle);
        assert_eq!(limiter.sweep(10.0), 1, "{store:?}");
        assert!(limiter.is_empty(), "{store:?}");
    }
}

#[test]
fn a_flood_stays_bounded_and_legit_keys_decide_as_alone() {
    const FLOOD: u64 = 200_000;
    const STEP_NS: u64 = 10_000;
    for store in STORES {
        let flooded = limiter(store, 10.0, 5);
        let quiet = limiter(store, 10.0, 5);
        let mut max_held = 0;
        for i in 0..FLOOD {
            let now = (i * STEP_NS) as f64 / 1e9;
            assert!(flooded.allow(api_key(i).as_str(), now), "{store:?}");
            if i % 97 == 0 {
                let cost = 1 + i % 3;
                assert_eq!(
                    flooded.check("legit", now, cost).map(|d| d.remaining()),
                    quiet.check("legit", now, cost).map(|d| d.remaining()),
                    "{store:?} at {now}"
                );
            }
            max_held = max_held.max(flooded.len());
        }
        // 0.5 s of refill is 50,000 flood keys: twice that, at most.
        assert!(max_held <= 100_002, "{store:?}: held {max_held}");
        assert!(max_held >= 10_000, "{store:?}: held only {max_held}");
    }
}

#[test]
fn the_cap_refuses_new_keys_only() {
    for store in STORES {
        let capped = limiter(store, 1.0, 3)
            .with_max_buckets(10)
            .with_auto_sweep(false);
        for i in 0..10 {
            assert!(capped.allow(api_key(i).as_str(), 0.0), "{store:?}");
        }
        assert_eq!(
            capped.check(api_key(10).as_str(), 0.0, 1),
            Err(Denial::LimiterFull { max_buckets: 10 }),
            "{store:?}"
        );
        assert_eq!(
            capped
                .check(api_key(3).as_str(), 0.0, 2)
                .map(|d| d.remaining()),
            Ok(0),
            "{store:?}"
        );
        assert_eq!(capped.len(), 10, "{store:?}");
    }
}

#[test]
fn changing_the_store_starts_afresh_even_for_cached_keys() {
    let limiter = TokenBucketLimiter::new(1.0, 3);
    // Hammered on this thread: promoted into its hot-key cache, and empty.
    let admitted = (0..500).filter(|_| limiter.allow("k", 0.0)).count();
    assert_eq!(admitted, 3);
    assert!(limiter.stats().hot_key_promotions >= 1);
    for store in [Store::DashMap, Store::Sharded] {
        let limiter = TokenBucketLimiter::new(1.0, 3);
        assert_eq!((0..500).filter(|_| limiter.allow("k", 0.0)).count(), 3);
        let limiter = limiter.with_store(store);
        // The new map has no bucket for "k": a full one, not the cached one.
        let admitted = (0..500).filter(|_| limiter.allow("k", 0.0)).count();
        assert_eq!(admitted, 3, "{store:?}");
    }
}

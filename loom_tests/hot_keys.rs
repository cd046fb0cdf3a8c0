//! Model 11: the hot-key cache's share/retire protocol.
//!
//! A thread whose lookups keep asking for a key promotes it: the key's
//! bucket moves to an `Arc` (as for a handle) and the thread caches a
//! clone, then spends on it with no lock at all. The cache holds no pin,
//! so a sweep may retire the bucket under it; the bucket's
//! compare-and-swap retirement then races the cached spend, and a cached
//! call that finds its bucket retired drops it and goes to the map. Under
//! loom the caches are per model thread, off unless turned on, and a key
//! is promoted on its second lookup. In every interleaving the cached
//! spend is admitted and shows in the key's bucket, whether it landed
//! before the retirement (the bucket is then kept) or after it (on a
//! fresh bucket).
//!
//! The broken twin retires with a blind store (`Flaw::RetireByBlindStore`)
//! and swallows the cached spend. Without the cache no limiter-level
//! model can catch that twin: every other spend runs under a lock that
//! the sweep also takes, or on a bucket a handle pins.

use crate::support::model;
use keyrate::loom_api::{self, Flaw};
use keyrate::TokenBucketLimiter;
use loom::sync::Arc;

/// "k" (capacity 2, 1 token/s) is promoted into the main thread's cache
/// by two spends at 0 s, so its bucket is full again at 2 s: a sweep at
/// 2 s races a third spend at 2 s that the cache serves.
fn a_sweep_races_a_cached_spend() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2).with_hot_key_cache(true));
    assert!(limiter.allow("k", 0.0));
    assert!(limiter.allow("k", 0.0));
    assert_eq!(limiter.stats().hot_key_promotions, 1, "promoted");
    let sweeper = {
        let limiter = Arc::clone(&limiter);
        loom::thread::spawn(move || limiter.sweep(2.0))
    };
    let admitted = limiter.allow("k", 2.0);
    let removed = sweeper.join().expect("the sweeper panicked");
    assert!(admitted, "a full bucket admits");
    assert!(removed <= 1);
    assert_eq!(
        limiter.remaining("k", 2.0),
        Ok(1),
        "an admitted spend was swallowed (removed {removed})"
    );
    assert_eq!(limiter.len(), 1);
}

#[test]
fn a_sweep_races_a_spend_from_a_hot_key_cache() {
    model(
        "10 hot keys: sweep vs a cached spend, capacity 2",
        a_sweep_races_a_cached_spend,
    );
}

#[test]
#[should_panic(expected = "an admitted spend was swallowed")]
fn broken_retire_by_blind_store_swallows_a_cached_spend() {
    loom_api::with_flaw(Flaw::RetireByBlindStore, || {
        model(
            "10 broken: retire by blind store vs a cached spend",
            a_sweep_races_a_cached_spend,
        );
    });
}

#[test]
fn a_sweep_races_a_cached_spend_and_a_keyed_one() {
    model(
        "10 hot keys: sweep vs a cached spend vs a keyed spend, capacity 2",
        || {
            // As above, with a third thread's keyed spend (its first
            // lookup: through the map, to the moved bucket or a fresh one).
            let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2).with_hot_key_cache(true));
            assert!(limiter.allow("k", 0.0));
            assert!(limiter.allow("k", 0.0));
            let sweeper = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.sweep(2.0))
            };
            let keyed = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.allow("k", 2.0))
            };
            let cached = limiter.allow("k", 2.0);
            let removed = sweeper.join().expect("the sweeper panicked");
            let keyed = keyed.join().expect("the keyed caller panicked");
            assert!(cached && keyed, "both spends fit");
            assert_eq!(
                limiter.remaining("k", 2.0),
                Ok(0),
                "an admitted spend was swallowed (removed {removed})"
            );
            assert_eq!(limiter.len(), 1);
        },
    );
}

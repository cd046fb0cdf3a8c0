//! Resets in memory: a reset key admits a full burst again, wherever its
//! bucket lives (its map entry, a handle's `Arc`, a thread's hot-key
//! cache), and resets racing spends, handles, the hot-key cache and the
//! sweep's retirements on real threads never lose or mint a token.
//! `loom_tests/reset.rs` checks the reset's compare-and-swap against
//! spends and retirement in every interleaving.
#![cfg(not(loom))]

mod common;

use common::sync::SetOnDrop;
use keyrate::{Limiter, Quota, TokenBucketLimiter};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[test]
fn a_reset_key_admits_a_full_burst_again() {
    let limiter = TokenBucketLimiter::new(1.0, 5);
    // The lock-out: a quota set by mistake, then reverted.
    limiter.set_quota(Quota::new(1e-9, 5).unwrap()); // 32 years a token
    assert!(limiter.allow_n("inline", 0.0, 5));
    let handle = limiter.bucket("handle");
    assert!(handle.allow_n(0.0, 5));
    // A key hammered from this thread moves into its hot-key cache.
    for _ in 0..1000 {
        let _ = limiter.allow("hot", 0.0);
    }
    limiter.set_quota(Quota::new(1.0, 5).unwrap());
    for key in ["inline", "handle", "hot"] {
        assert_eq!(limiter.remaining(key, 1e6), Ok(0), "{key} locked out");
    }
    for key in ["inline", "handle", "hot"] {
        assert!(limiter.reset(key), "{key}");
        assert_eq!(limiter.remaining(key, 0.0), Ok(5), "{key}");
    }
    assert_eq!(handle.remaining(0.0), Ok(5));
    for _ in 0..5 {
        assert!(limiter.allow("hot", 0.0));
        assert!(limiter.allow("inline", 0.0));
        assert!(handle.allow(0.0));
    }
    assert!(!limiter.allow("hot", 0.0));
    assert!(!limiter.allow("inline", 0.0));
    assert!(!handle.allow(0.0));
    assert!(!limiter.reset("never-seen"));
    assert_eq!(
        limiter.check("hot", 0.0, 1).unwrap_err().retry_after(),
        Some(Duration::from_secs(1))
    );
}

#[test]
fn reset_all_and_handles() {
    let limiter = TokenBucketLimiter::new(1.0, 2);
    let handle = limiter.bucket("h");
    assert!(handle.allow_n(0.0, 2));
    for i in 0..100 {
        assert!(limiter.allow_n(&format!("k{i}"), 0.0, 2));
    }
    assert_eq!(limiter.reset_all(), 101);
    assert!(handle.allow_n(0.0, 2));
    for i in 0..100 {
        assert!(limiter.allow_n(&format!("k{i}"), 0.0, 2));
    }
    handle.reset();
    assert!(limiter.allow_n("h", 0.0, 2));
    // A reset bucket is full: the sweep may evict it, and nothing changes.
    assert_eq!(limiter.reset_all(), 101);
    assert_eq!(limiter.sweep(0.0), 100, "the handle's bucket stays");
    assert!(limiter.allow_n("k0", 0.0, 2));
}

/// Waits for `done()`, failing the test if it never comes (a lost or
/// minted token would leave the resetter waiting for ever).
fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::yield_now();
    }
}

/// Resets racing spends on real threads, at one frozen instant: after
/// each reset the spenders take the whole burst, and only then comes the
/// next reset, so the tokens admitted must be exactly `capacity` per
/// epoch. Spends go through the map, a handle and the hot-key cache, each
/// reset is a different call (by key, by handle, of every key), and a
/// fourth thread races the sweep's retirement against resets of another
/// key, whose tokens are bounded by its resets.
#[test]
fn resets_racing_spends_never_corrupt_a_bucket() {
    const CAPACITY: u64 = 50;
    const RESETS: u64 = 1000;
    let limiter = TokenBucketLimiter::new(1.0, CAPACITY);
    let handle = limiter.bucket("hot");
    let tokens = AtomicU64::new(0);
    let cold_tokens = AtomicU64::new(0);
    let cold_resets = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Stops the spenders however the resetter's part ends: a failed
        // assertion or `until` deadline unwinds through here, and without
        // the flag the three loops would spin on and the scope never end.
        let _stop = SetOnDrop(&stop);
        // By key, cost 1: takes the last token of every epoch. The key is
        // hot in this thread, so it soon spends through its cache.
        scope.spawn(|| {
            while !stop.load(Relaxed) {
                if limiter.allow("hot", 1.0) {
                    tokens.fetch_add(1, Relaxed);
                }
            }
        });
        // Through the handle, costs 1 to 3.
        scope.spawn(|| {
            let mut cost = 0;
            while !stop.load(Relaxed) {
                cost = cost % 3 + 1;
                if handle.allow_n(1.0, cost) {
                    tokens.fetch_add(cost, Relaxed);
                }
            }
        });
        // Another key, cached by this thread but pinned by no handle, so
        // that the sweep retires it whenever a reset has left it full;
        // and keys created and evicted around it.
        scope.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Relaxed) {
                if limiter.allow("cold", 1.0) {
                    cold_tokens.fetch_add(1, Relaxed);
                }
                i += 1;
                if i % 64 == 0 {
                    let _ = limiter.allow(&format!("churn{}", i % 4096), 1.0);
                    limiter.sweep(1.0);
                }
            }
        });
        // The resetter.
        for epoch in 1..=RESETS {
            until("the epoch's burst spent", || {
                tokens.load(Relaxed) >= CAPACITY * epoch
            });
            assert_eq!(tokens.load(Relaxed), CAPACITY * epoch, "a token minted");
            match epoch % 3 {
                0 => assert!(limiter.reset("hot")),
                1 => handle.reset(),
                _ => {
                    limiter.reset_all();
                    cold_resets.fetch_add(1, Relaxed);
                }
            }
            if limiter.reset("cold") {
                cold_resets.fetch_add(1, Relaxed);
            }
        }
        until("the last burst spent", || {
            tokens.load(Relaxed) >= CAPACITY * (RESETS + 1)
        });
    });
    assert_eq!(tokens.load(Relaxed), CAPACITY * (RESETS + 1));
    // Nothing after the last burst: the bucket is empty, and whole.
    assert_eq!(limiter.remaining("hot", 1.0), Ok(0));
    assert_eq!(handle.remaining(1.0), Ok(0));
    let cold = cold_tokens.load(Relaxed);
    let bound = CAPACITY * (cold_resets.load(Relaxed) + 1);
    assert!(cold <= bound, "cold: {cold} tokens, at most {bound}");
    // Every path still agrees on one bucket.
    assert!(limiter.reset("hot"));
    assert!(limiter.allow_n("hot", 1.0, CAPACITY - 1));
    assert!(handle.allow(1.0));
    assert!(!limiter
        .under(&Quota::new(1.0, CAPACITY).unwrap())
        .allow("hot", 1.0));
}

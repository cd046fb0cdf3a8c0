//! Counters and top offenders: exact counts under concurrency, the
//! offenders' error bound, and memory that a flood of keys cannot grow.
#![cfg(not(loom))]

mod common;

use common::api_key;
use common::sync::Barrier;
use keyrate::{Denial, Stats, TokenBucketLimiter, OFFENDER_SLOTS};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

#[test]
fn every_outcome_is_counted_once() {
    let limiter = TokenBucketLimiter::new(1.0, 3).with_max_buckets(2);
    assert!(limiter.allow_n("a", 0.0, 2));
    assert!(limiter.allow_n("a", 0.0, 0));
    assert_eq!(
        limiter.check("a", 0.0, 2),
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_secs(1)
        })
    );
    assert!(!limiter.allow_n("a", 0.0, 4));
    assert!(!limiter.allow("a", -1.0));
    assert!(limiter.allow("b", 0.0));
    assert!(!limiter.allow("c", 0.0)); // the cap
    let handle = limiter.bucket("a");
    assert!(handle.allow_n(1.0, 2));
    assert!(!handle.allow(1.0));
    let stats = limiter.stats();
    let mut expected = Stats::default();
    expected.admitted = 4;
    expected.admitted_cost = 5;
    expected.denied_insufficient_tokens = 2;
    expected.denied_exceeds_capacity = 1;
    expected.denied_invalid_timestamp = 1;
    expected.denied_limiter_full = 1;
    expected.buckets_created = 2;
    assert_eq!(stats, expected);
    assert_eq!(stats.denied(), 5);

    drop(handle);
    assert_eq!(limiter.sweep(100.0), 2);
    let stats = limiter.stats();
    assert_eq!((stats.buckets_evicted, stats.sweeps), (2, 1));
}

#[test]
fn stats_off_count_nothing() {
    let limiter = TokenBucketLimiter::new(1.0, 1).with_stats(false);
    let handle = limiter.bucket("k");
    assert!(handle.allow(0.0));
    assert!(!limiter.allow("k", 0.0));
    drop(handle);
    assert_eq!(limiter.sweep(10.0), 1);
    assert_eq!(limiter.stats(), Stats::default());
    assert!(limiter.top_offenders(10).top.is_empty());
}

/// A limiter keeps at most this many per-thread stripes of counters
/// (twice the cores, clamped to 4..=64: src/observe/slot.rs); threads
/// beyond them share one overflow stripe.
const MAX_STRIPES: u64 = 64;

/// Many threads, each counting what its own calls returned: the sums must
/// match the limiter's counters exactly. The threads all hold their slots
/// at once (each waits, after its first counted call, for the others), and
/// there are more of them than a limiter has stripes on any machine, so
/// some count in the shared overflow stripe.
#[test]
fn concurrent_counts_add_up_exactly() {
    const THREADS: u64 = MAX_STRIPES + 4;
    const CALLS: u64 = 5_000;
    let limiter = Arc::new(TokenBucketLimiter::new(1000.0, 50));
    let keys: Arc<Vec<String>> = Arc::new((0..8).map(api_key).collect());
    let all_counting = Arc::new(Barrier::new(THREADS as usize));
    let totals: Vec<(u64, u64, u64)> = (0..THREADS)
        .map(|t| {
            let limiter = Arc::clone(&limiter);
            let keys = Arc::clone(&keys);
            let all_counting = Arc::clone(&all_counting);
            thread::spawn(move || {
                let _guard = all_counting.guard();
                let (mut admitted, mut cost_admitted, mut denied) = (0, 0, 0);
                let handle = limiter.bucket(keys[t as usize % keys.len()].as_str());
                for i in 0..CALLS {
                    if i == 1 {
                        // Every thread has counted a call: each holds its
                        // own slot, so at least THREADS - MAX_STRIPES of
                        // them are beyond the limiter's stripes.
                        all_counting.wait();
                    }
                    let cost = 1 + (i + t) % 3;
                    let at = i as f64 * 1e-4;
                    let ok = match i % 4 {
                        0 => handle.allow_n(at, cost),
                        1 => handle.check(at, cost).is_ok(),
                        2 => limiter
                            .check(keys[(i % 8) as usize].as_str(), at, cost)
                            .is_ok(),
                        _ => limiter.allow_n(keys[0].as_str(), at, cost),
                    };
                    if ok {
                        admitted += 1;
                        cost_admitted += cost;
                    } else {
                        denied += 1;
                    }
                }
                (admitted, cost_admitted, denied)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let stats = limiter.stats();
    assert_eq!(stats.admitted, totals.iter().map(|t| t.0).sum::<u64>());
    assert_eq!(stats.admitted_cost, totals.iter().map(|t| t.1).sum::<u64>());
    assert_eq!(stats.denied(), totals.iter().map(|t| t.2).sum::<u64>());
    assert_eq!(stats.denied(), stats.denied_insufficient_tokens);
    assert!(stats.denied() > 0 && stats.admitted > 0);
    assert_eq!(stats.buckets_created, 8);
}

/// One key hammering among 100,000 legitimate keys, split over threads:
/// legitimate keys are admitted but for one denial in every hundredth
/// key, plus a flood of one-off denied keys (a cost above the capacity,
/// which is no offence: it spends nothing); the abuser comes first, with
/// a count within the bound.
#[test]
fn the_abuser_among_100_000_keys_is_reported_first_within_the_bound() {
    const KEYS: u64 = 100_000;
    const THREADS: u64 = 4;
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2).with_top_offenders(true));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let mut abuser_denied = 0;
                for i in (t..KEYS).step_by(THREADS as usize) {
                    let key = api_key(i);
                    let calls = if i % 100 == 0 { 3 } else { 2 };
                    for _ in 0..calls {
                        let _ = limiter.allow(key.as_str(), 1.0);
                    }
                    // A one-off denial: a cost no bucket can ever admit.
                    let _ = limiter.allow_n(api_key(KEYS + i).as_str(), 1.0, 3);
                    if i % 16 == 0 {
                        abuser_denied += u64::from(!limiter.allow("abuser", 1.0));
                    }
                }
                abuser_denied
            })
        })
        .collect();
    let abuser: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(abuser > 5_000, "the abuser was denied {abuser} times");
    let stats = limiter.stats();
    let offenders = limiter.top_offenders(5);
    assert_eq!(offenders.denials, stats.denied_insufficient_tokens);
    assert_eq!(stats.denied_exceeds_capacity, KEYS);
    assert!(offenders.max_error <= offenders.denials / OFFENDER_SLOTS as u64);
    let (first, count) = &offenders.top[0];
    assert_eq!(first, "abuser", "{:?}", offenders);
    assert!(
        count.abs_diff(abuser) <= offenders.max_error,
        "counted {count}, denied {abuser}, bound {}",
        offenders.max_error
    );
    // Every other key was denied once: within the bound of 1.
    for (_, count) in &offenders.top[1..] {
        assert!(*count <= 1 + offenders.max_error);
    }
}

#[test]
fn counts_are_exact_while_no_sketch_fills_up() {
    let limiter = TokenBucketLimiter::new(1.0, 1).with_top_offenders(true);
    for (key, times) in [("a", 5), ("b", 3), ("c", 9)] {
        for _ in 0..=times {
            let _ = limiter.allow(key, 0.0);
        }
    }
    let handle = limiter.bucket("b");
    assert!(!handle.allow(0.0));
    let offenders = limiter.top_offenders(2);
    assert_eq!(offenders.max_error, 0);
    assert_eq!(offenders.denials, 18);
    let top = offenders.top;
    assert_eq!(top, vec![("c".to_string(), 9), ("a".to_string(), 5)]);
    assert_eq!(limiter.top_offenders(3).top[2], ("b".to_string(), 4));
}

#[test]
fn the_window_forgets_old_denials() {
    let limiter = TokenBucketLimiter::new(0.001, 1)
        .with_top_offenders(true)
        .with_offender_window(Duration::from_secs(10));
    for t in [0.0, 0.0, 0.0, 12.0, 25.0] {
        let _ = limiter.allow("old", t);
    }
    for t in [25.0, 25.0, 26.0, 27.0] {
        let _ = limiter.allow("new", t);
    }
    // Epochs [10 s, 20 s) and [20 s, 30 s) are recent; 0 s is not.
    let offenders = limiter.top_offenders(5);
    assert_eq!(
        offenders.top,
        vec![("new".to_string(), 3), ("old".to_string(), 2)]
    );
    // Much later, only the latest epoch's denial counts.
    let _ = limiter.allow("new", 1000.0);
    assert_eq!(limiter.top_offenders(5).top, vec![("new".to_string(), 1)]);
}

/// A key that counts its live copies and how many were ever made.
#[derive(Debug, PartialEq, Eq)]
struct Counted(u64);

static LIVE: AtomicI64 = AtomicI64::new(0);
static MADE: AtomicU64 = AtomicU64::new(0);

impl Counted {
    fn new(n: u64) -> Self {
        LIVE.fetch_add(1, Relaxed);
        Counted(n)
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        MADE.fetch_add(1, Relaxed);
        Counted::new(self.0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Relaxed);
    }
}

impl Hash for Counted {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

#[test]
fn a_flood_of_distinct_keys_does_not_grow_the_sketch() {
    const THREADS: u64 = 2;
    let limiter = Arc::new(
        TokenBucketLimiter::<Counted>::with_quota(keyrate::Quota::new(1.0, 1).unwrap())
            .with_top_offenders(true)
            .with_hot_key_cache(false),
    );
    // Each key spends its bucket at `at`, then is denied for want of
    // tokens (an offence); a sweep then evicts every bucket, so every live
    // copy of a key beyond the callers' own is in the sketches. Each flood
    // is stamped after the previous sweep: a key without a bucket is full
    // only from the latest instant a swept bucket was full from.
    let flood = |from: u64, to: u64, at: f64| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || {
                    for i in (from + t..to).step_by(THREADS as usize) {
                        let key = Counted::new(i);
                        assert!(limiter.allow(&key, at));
                        assert!(!limiter.allow(&key, at));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(limiter.sweep(at + 9.0) as u64, to - from);
        LIVE.load(Relaxed)
    };
    let after_small = flood(0, 1_000, 1.0);
    let after_large = flood(1_000, 300_000, 11.0);
    let bound = ((THREADS + 1) * 2 * OFFENDER_SLOTS as u64) as i64;
    // Each thread's sketch holds at most `2 * OFFENDER_SLOTS` keys (two
    // epochs), and threads beyond the limiter's stripes share one more.
    assert!(after_small <= bound, "{after_small} live keys");
    assert!(
        after_large <= bound,
        "the sketch grew to {after_large} keys"
    );
    assert_eq!(limiter.len(), 0);
    assert_eq!(limiter.stats().denied_insufficient_tokens, 300_000);

    // A key already in the sketch is not copied again.
    let key = Counted::new(u64::MAX);
    assert!(limiter.allow(&key, 30.0)); // its bucket's copy
    let made = MADE.load(Relaxed);
    for _ in 0..10_000 {
        assert!(!limiter.allow(&key, 30.0));
    }
    assert_eq!(MADE.load(Relaxed) - made, 1);
}

//! Model 10: the decision counters' single-writer stripes, and the thread
//! slots that give each stripe its one writer.
//!
//! A thread takes the lowest free slot index under the slots' lock the
//! first time it records, and gives it back (under the same lock) when it
//! exits; the index picks its counter stripe, which it then writes with a
//! plain load and store, as its only writer. Threads past the stripe count
//! share an overflow stripe, written with `fetch_add`. Under loom the
//! slots are per model thread, the lock is loom's, a limiter keeps one
//! exclusive stripe, and the stripes are loom atomics, so these models run
//! the real slot and stripe code: two threads record at once (one on the
//! exclusive stripe, one on the overflow), the first exits, and a third
//! takes its slot and stripe. In every interleaving every decision is
//! counted exactly once.
//!
//! The broken twin takes a new index in two steps under two locks
//! (`Flaw::SlotTakenInTwoLocks`): two threads can get the same index, and
//! each writes "its" stripe with a load and a store, losing counts.

use crate::support::{key_in, model};
use keyrate::loom_api::{self, Flaw};
use keyrate::TokenBucketLimiter;
use loom::sync::Arc;

/// One admitted unit call on `key` at 0 s, on its own thread.
fn call(limiter: &Arc<TokenBucketLimiter>, key: &str) -> loom::thread::JoinHandle<bool> {
    let (limiter, key) = (Arc::clone(limiter), key.to_owned());
    loom::thread::spawn(move || limiter.allow(key.as_str(), 0.0))
}

fn every_decision_is_counted_once() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 4));
    // Keys in two shards: a thread's first record (the bucket it creates)
    // runs under its key's shard lock, which would otherwise order the two
    // threads' first records, and so their slot taking. The main thread
    // records nothing: the callers race for the first slot.
    let (a, b) = (key_in("a", 0, 2), key_in("b", 1, 2));
    let first = call(&limiter, &a);
    let second = call(&limiter, &b);
    assert!(first.join().expect("a caller panicked"));
    // The first caller has exited and given its slot back: the third
    // takes it (or the second's, if that one exited too).
    let third = call(&limiter, &a);
    assert!(second.join().expect("a caller panicked"));
    assert!(third.join().expect("a caller panicked"));
    let stats = limiter.stats();
    assert_eq!(
        (stats.admitted, stats.admitted_cost, stats.buckets_created),
        (3, 3, 2),
        "a count was lost: (admitted, admitted cost, buckets created)"
    );
}

#[test]
fn every_decision_is_counted_once_as_slots_are_reused() {
    loom_api::with_shards(2, || {
        model(
            "9 counters: 2 threads record, a third reuses a slot",
            every_decision_is_counted_once,
        );
    });
}

#[test]
#[should_panic(expected = "a count was lost")]
fn broken_slot_taken_in_two_locks_loses_counts() {
    loom_api::with_shards(2, || {
        loom_api::with_flaw(Flaw::SlotTakenInTwoLocks, || {
            model(
                "9 broken: a slot index taken under two locks",
                every_decision_is_counted_once,
            );
        });
    });
}

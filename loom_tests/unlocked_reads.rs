//! Model 6: eviction when the map's readers are not excluded by its writers.
//!
//! The limiter's DashMap store holds a shard's write lock while a spend runs,
//! so a sweep (under the write lock) never overlaps one. A store whose
//! reads take no lock (such as the `scc::HashIndex` prototype measured in
//! `benches/common`) gives no such exclusion: a spend can still be running
//! on a bucket that a sweep has just removed from the map. What keeps the
//! limiter exact then is the bucket's own protocol, which `src/bucket.rs`
//! already implements and promises: eviction retires the word with a
//! compare-and-swap *before* removing it, so a spend that reaches a removed
//! bucket fails with `Retired` and looks the key up again. These models
//! check that protocol with the real `Bucket::spend` and
//! `Bucket::try_retire`, over a one-key map built here:
//!
//! - the map holds one key; its value is the index of the current bucket
//!   (0: absent) in a fixed array of buckets, one per generation;
//! - readers load the index with `Acquire` and spend on that bucket with no
//!   lock, as `scc::HashIndex::peek_with` runs a reader on the value it
//!   found, and the array keeps every bucket alive as scc's epochs do;
//! - writers (insert, evict) hold a loom `Mutex`, as scc's per-bucket lock
//!   serialises writers on one key, and publish with `Release`.
//!
//! No store in the library reads without a lock, so the map is built here;
//! the protocol under test is the real bucket's. The broken twin breaks
//! the real retirement (`Flaw::RetireWithoutMarking`: `try_retire` checks
//! that the bucket is full and reports it retired without writing the
//! marker, as an eviction trusting a lock the readers do not take would),
//! and must swallow an admitted spend.

use crate::support::{model, quota, SEC};
use keyrate::loom_api::{self, Bucket, Flaw, SpendError};
use keyrate::{Denial, Quota};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};

/// Buckets a model can create for its key: the first, plus re-creations.
const GENERATIONS: usize = 4;

/// A one-key map whose reads take no lock.
struct UnlockedReads {
    /// The current bucket's index in `buckets`; 0 when the key is absent.
    current: AtomicUsize,
    /// Every bucket the key can have; index 0 is unused.
    buckets: Vec<Bucket>,
    /// Serialises writers; holds the next unused generation.
    writer: Mutex<usize>,
}

impl UnlockedReads {
    /// A map whose key has a bucket holding `word`.
    fn with_word(word: u64) -> Self {
        let mut buckets: Vec<Bucket> = (0..GENERATIONS).map(|_| Bucket::new()).collect();
        buckets[1] = Bucket::with_word(word);
        UnlockedReads {
            current: AtomicUsize::new(1),
            buckets,
            writer: Mutex::new(2),
        }
    }

    /// The limiter's spend loop: a lock-free lookup and spend, then, if the
    /// key is absent or its bucket retired, an insert under the writer lock.
    fn spend(&self, now: u64, cost: u64, quota: &Quota) -> Result<u64, Denial> {
        loop {
            // Acquire pairs with the writers' Release: the bucket a reader
            // finds is the one the writer published.
            let found = self.current.load(Ordering::Acquire);
            if found != 0 {
                match self.buckets[found].spend(now, cost, quota) {
                    Ok(word) => return Ok(word),
                    Err(SpendError::Denied(denial)) => return Err(denial),
                    // Retired (nothing here moves a bucket): look again.
                    Err(_) => {}
                }
            }
            let mut next = self.writer.lock().unwrap();
            // Acquire/Release as above; the writer lock already orders
            // writers, the Release publishes the new bucket to readers.
            let mut found = self.current.load(Ordering::Acquire);
            if found == 0 {
                found = *next;
                *next += 1;
                self.current.store(found, Ordering::Release);
            }
            match self.buckets[found].spend(now, cost, quota) {
                Ok(word) => return Ok(word),
                Err(SpendError::Denied(denial)) => return Err(denial),
                Err(_) => {}
            }
        }
    }

    /// The sweep, for this key: remove its bucket if full at `now`.
    fn evict(&self, now: u64) -> bool {
        let _writer = self.writer.lock().unwrap();
        // Acquire/Release: as in `spend`'s insert.
        let found = self.current.load(Ordering::Acquire);
        if found == 0 {
            return false;
        }
        // Retire before removing: a reader that already found the bucket
        // then fails with `Retired` and looks the key up again.
        let evict = self.buckets[found].try_retire(now);
        if evict {
            self.current.store(0, Ordering::Release);
        }
        evict
    }

    /// The whole tokens the key holds at `now` (an absent key is full).
    fn remaining(&self, now: u64, quota: &Quota) -> u64 {
        // Acquire: pairs with the writers' Release.
        match self.current.load(Ordering::Acquire) {
            0 => quota.capacity(),
            found => loom_api::tokens_at(self.buckets[found].word(), now, quota),
        }
    }
}

/// The key spent 1 of 2 tokens at 0 s, so its bucket is full again at 1 s:
/// `spenders` threads spend 1 token each at 1 s while the main thread
/// evicts at 1 s. Every admitted spend must show in the tokens left.
fn check_evict_races_unlocked_spends(spenders: usize) {
    let quota = quota(1.0, 2);
    let map = Arc::new(UnlockedReads::with_word(SEC));
    let threads: Vec<_> = (0..spenders)
        .map(|_| {
            let map = Arc::clone(&map);
            loom::thread::spawn(move || map.spend(SEC, 1, &quota).is_ok())
        })
        .collect();
    let evicted = map.evict(SEC);
    let admitted = threads
        .into_iter()
        .map(|thread| thread.join().expect("a spender panicked"))
        .filter(|&admitted| admitted)
        .count() as u64;
    assert_eq!(
        admitted, spenders as u64,
        "every spend fits in a full bucket"
    );
    assert_eq!(
        map.remaining(SEC, &quota),
        quota.capacity() - admitted,
        "an admitted spend was swallowed (evicted: {evicted})"
    );
}

#[test]
fn eviction_races_an_unlocked_spend() {
    model("6 unlocked reads: evict vs 1 spender, capacity 2", || {
        check_evict_races_unlocked_spends(1);
    });
}

#[test]
fn eviction_races_two_unlocked_spends() {
    model("6 unlocked reads: evict vs 2 spenders, capacity 2", || {
        check_evict_races_unlocked_spends(2);
    });
}

/// The real retirement broken (`Flaw::RetireWithoutMarking`): the sweep
/// removes a bucket whose word is still live, and the spend that found it
/// before lands where no lookup reaches.
#[test]
#[should_panic(expected = "an admitted spend was swallowed")]
fn broken_eviction_without_retiring_swallows_a_spend() {
    loom_api::with_flaw(Flaw::RetireWithoutMarking, || {
        model(
            "6 broken: real bucket, retirement without the marker",
            || {
                check_evict_races_unlocked_spends(1);
            },
        );
    });
}

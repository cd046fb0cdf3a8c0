//! One bucket: a single atomic word, its compare-and-swap loop for buckets
//! moved into an `Arc`, and a plain update for a map entry held under
//! its shard's write lock.

use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::sync::{AtomicU64, Ordering};
use crate::time::Nanos;

/// The word of a bucket that has been removed from its map.
///
/// A live word is at most `2^64 - 3` (a timestamp below `2^63` plus a
/// refill window below `2^63 - 1`), so the two marker words below are never
/// live values.
pub(crate) const RETIRED: u64 = u64::MAX;

/// The word of a map entry whose bucket has moved to an `Arc` (see
/// `keyed::TokenBucketLimiter::bucket`): spends go to the moved bucket.
/// Set under the map shard's write lock, and final.
pub(crate) const MOVED: u64 = u64::MAX - 1;

/// Why a spend did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpendError {
    /// A plain denial; the word was not written.
    Denied(Denial),
    /// The bucket was retired (evicted) before this spend could land: the
    /// caller must look the key up again.
    Retired,
    /// The bucket now lives in an `Arc`: the caller must spend there.
    Moved,
}

impl SpendError {
    /// What a caller makes of a spend's outcome: the new word, a denial, or
    /// `None` when the bucket was retired or moved, and the key must be
    /// looked up again. The one place that maps a `SpendError` to a
    /// [`Denial`].
    #[inline]
    pub(crate) fn decision(spent: Result<Nanos, SpendError>) -> Option<Result<Nanos, Denial>> {
        match spent {
            Ok(word) => Some(Ok(word)),
            Err(SpendError::Denied(denial)) => Some(Err(denial)),
            Err(SpendError::Retired | SpendError::Moved) => None,
        }
    }
}

/// The word a spend of `cost` at `now` would leave in place of `current`
/// (the atomic's value), or why there is none: a marker word, or a denial.
#[inline]
fn next_word(current: u64, now: Nanos, cost: u64, quota: &Quota) -> Result<Nanos, SpendError> {
    match current {
        RETIRED => Err(SpendError::Retired),
        MOVED => Err(SpendError::Moved),
        live => gcra::decide(Nanos::new(live), now, cost, quota).map_err(SpendError::Denied),
    }
}

/// One key's token bucket.
#[derive(Debug)]
pub(crate) struct Bucket {
    /// `full_at`: the instant, in nanoseconds of the caller's timeline, at
    /// which this bucket holds `capacity` tokens again (see `gcra`): a
    /// [`Nanos`] as its `u64`, converted where it is loaded. Values
    /// `0..=2^64 - 3` are live and only grow, except that an operator's
    /// [`reset`](Self::reset) sets them back to 0 (full); [`RETIRED`]
    /// marks a bucket that eviction has taken out of its map and [`MOVED`]
    /// an entry whose bucket moved to an `Arc`; both are final, and a reset
    /// never touches them.
    full_at: AtomicU64,
}

impl Bucket {
    /// A new bucket: full at every timestamp.
    pub(crate) fn new() -> Self {
        Self::with_word(0)
    }

    pub(crate) fn with_word(word: u64) -> Self {
        Bucket {
            full_at: AtomicU64::new(word),
        }
    }

    /// Tries to spend `cost` tokens at `now`. Returns the new word.
    ///
    /// A denial returns after one load and writes nothing, so a key that is
    /// hammered while empty keeps its cache line shared between cores.
    #[inline(always)]
    pub(crate) fn spend(&self, now: Nanos, cost: u64, quota: &Quota) -> Result<Nanos, SpendError> {
        // Relaxed: the decision depends on this word alone, and no other
        // memory is published through it. The compare-exchange below checks
        // the value we decided on against the latest one in the word's
        // modification order, so a stale load costs a retry, never a wrong
        // decision.
        let mut current = self.full_at.load(Ordering::Relaxed);
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::SpendByLoadThenStore) {
            // BROKEN (a model's twin): decide on the load, then a blind store.
            let next = next_word(current, now, cost, quota)?;
            self.full_at.store(next.as_u64(), Ordering::Relaxed);
            return Ok(next);
        }
        loop {
            let next = next_word(current, now, cost, quota)?;
            if next.as_u64() == current {
                // Cost 0: admitted, nothing to write.
                return Ok(next);
            }
            // Relaxed on success and failure: read-modify-writes on one
            // location are totally ordered, so each admitted spend moves the
            // word from exactly the value it was decided on; no spend is lost
            // and none is counted twice. Nothing else needs to become visible.
            match self.full_at.compare_exchange_weak(
                current,
                next.as_u64(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(next),
                Err(actual) => current = actual,
            }
        }
    }

    /// [`spend`](Self::spend) for a bucket held exclusively: a map entry
    /// under its shard's write lock. No other access to the word can run
    /// meanwhile, so a plain load and store decide exactly, with no
    /// compare-and-swap.
    #[inline]
    pub(crate) fn spend_locked(
        &mut self,
        now: Nanos,
        cost: u64,
        quota: &Quota,
    ) -> Result<Nanos, SpendError> {
        // Relaxed load and store, no read-modify-write: `&mut self` (the
        // shard's write lock) excludes every other access to the word, and
        // the lock's release publishes the store to the next holder.
        let current = self.full_at.load(Ordering::Relaxed);
        let next = next_word(current, now, cost, quota)?;
        if next.as_u64() != current {
            self.full_at.store(next.as_u64(), Ordering::Relaxed);
        }
        Ok(next)
    }

    /// Moves this entry's bucket out: returns its word and leaves
    /// [`MOVED`] in its place.
    ///
    /// Only called under the map shard's write lock, so no spend on this
    /// word is in flight and none can start until the lock is released.
    pub(crate) fn move_out(&self) -> u64 {
        // Relaxed: the shard lock's release orders this store before any
        // later reader of the entry; `swap` returns the value moved.
        self.full_at.swap(MOVED, Ordering::Relaxed)
    }

    /// Sets the bucket back to full (the word 0), as if its key had never
    /// been seen: the operator's undo of a lock-out. A marker word is left
    /// as it is: `Retired` (the bucket was full and evicted: its key is
    /// full already) or `Moved` (reset the moved bucket instead).
    ///
    /// The one write that makes a live word smaller. Every other reader
    /// stays exact, because none of them relies on the word growing: a
    /// spend decides on the value its compare-and-swap checks, so one
    /// racing a reset either lands first (and the reset then erases it:
    /// the spend, then the reset) or fails its compare-and-swap and
    /// decides again on the full bucket; eviction retires only a word that
    /// is full at its instant, and a reset only makes a word fuller.
    pub(crate) fn reset(&self) -> Result<(), SpendError> {
        // Relaxed, as in `spend`: the compare-exchange alone orders a reset
        // against racing spends and retirements, on this one word.
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::ResetByPlainStore) {
            // BROKEN (a model's twin): a plain store of 0, markers or not.
            self.full_at.store(0, Ordering::Relaxed);
            return Ok(());
        }
        let mut current = self.full_at.load(Ordering::Relaxed);
        loop {
            match current {
                RETIRED => return Err(SpendError::Retired),
                MOVED => return Err(SpendError::Moved),
                0 => return Ok(()),
                _ => {}
            }
            match self.full_at.compare_exchange_weak(
                current,
                0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => current = actual,
            }
        }
    }

    /// The current word (possibly a marker).
    #[inline]
    pub(crate) fn word(&self) -> u64 {
        // Relaxed: a snapshot for reporting; it orders nothing else.
        self.full_at.load(Ordering::Relaxed)
    }

    /// Retires the bucket if it is full at `now`; returns the word it
    /// retired (the instant the bucket was full from, which the sweep
    /// keeps: `Pace::removed`), or `None` if it did not.
    ///
    /// After a `Some` return every later [`spend`](Self::spend) on this
    /// bucket fails with [`SpendError::Retired`], so a spend racing with
    /// eviction (on a moved bucket; a map entry's spends hold the same
    /// shard lock as the sweep) either lands before the retirement (and the
    /// bucket is then not full, so it is kept) or is sent back to the map.
    /// No admitted spend is ever swallowed.
    pub(crate) fn retire_if_full(&self, now: Nanos) -> Option<Nanos> {
        // Relaxed for the same reason as in `spend`: the compare-exchange
        // alone decides which of a racing spend and the retirement wins.
        let mut current = self.full_at.load(Ordering::Relaxed);
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::RetireByBlindStore) {
            // BROKEN (a model's twin): check, then a blind store.
            let full = gcra::is_full(Nanos::new(current), now);
            if full {
                self.full_at.store(RETIRED, Ordering::Relaxed);
            }
            return full.then_some(Nanos::new(current));
        }
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::RetireWithoutMarking) {
            // BROKEN (a model's twin): the fullness check alone; the word
            // is left live for a spend that already found the bucket.
            return gcra::is_full(Nanos::new(current), now).then_some(Nanos::new(current));
        }
        loop {
            // Marker words are never full: `is_full` needs `current <= now`,
            // and `now < 2^63`.
            if !gcra::is_full(Nanos::new(current), now) {
                return None;
            }
            match self.full_at.compare_exchange_weak(
                current,
                RETIRED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(Nanos::new(current)),
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn reset_fills_a_live_bucket_and_leaves_the_markers_alone() {
        let bucket = Bucket::with_word(5_000);
        assert_eq!(bucket.reset(), Ok(()));
        assert_eq!(bucket.word(), 0);
        assert_eq!(bucket.reset(), Ok(()));
        assert_eq!(bucket.word(), 0);
        let retired = Bucket::with_word(RETIRED);
        assert_eq!(retired.reset(), Err(SpendError::Retired));
        assert_eq!(retired.word(), RETIRED);
        let moved = Bucket::with_word(MOVED);
        assert_eq!(moved.reset(), Err(SpendError::Moved));
        assert_eq!(moved.word(), MOVED);
    }
}

//! Eviction of full buckets: every one by hand ([`sweep`]), the idle ones
//! by the automatic sweep, a slice at a time (`sweep_step`, paced by
//! `occupancy`). Each bucket is retired by `life`.
//!
//! [`sweep`]: TokenBucketLimiter::sweep

use super::TokenBucketLimiter;
use crate::guard::Tally;
use crate::pace::ghosts::Ghosts;
use crate::pace::{one_in, SWEEP_SLICE};
use crate::time::{At, Nanos};
use std::hash::{BuildHasher, Hash};

/// # Housekeeping: eviction and memory
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Removes every bucket that is full at `at` ([`Now`](crate::Now): the limiter's clock) and has no live
    /// [`BucketHandle`](crate::BucketHandle); returns how many were removed.
    ///
    /// A full bucket is indistinguishable from a key never seen, so this
    /// changes no later decision made at or after `at`. With the automatic
    /// sweep on, a key it removes starts again from its bucket's word (see
    /// [`with_auto_sweep`](Self::with_auto_sweep)), so no decision stamped
    /// earlier changes either; with it off, such decisions are not
    /// promised. An invalid instant removes nothing.
    ///
    /// # Locking behaviour
    ///
    /// Takes each shard's write lock in turn.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert!(limiter.allow("a", 0.0));
    /// assert!(limiter.allow("b", 0.0));
    /// assert!(limiter.allow("b", 0.0));
    /// assert_eq!(limiter.sweep(1.0), 1); // "a" is full again at 1 s
    /// assert_eq!(limiter.len(), 1);
    /// assert_eq!(limiter.sweep(2.0), 1);
    /// assert!(limiter.is_empty());
    /// ```
    pub fn sweep(&self, at: impl Into<At>) -> usize {
        match at.into().nanos(&*self.clock) {
            Some(now) => self.sweep_nanos(now),
            None => 0,
        }
    }

    pub(super) fn sweep_nanos(&self, now: Nanos) -> usize {
        let started = std::time::Instant::now();
        // Places given back however the sweep ends (a key's `Drop` may
        // panic on eviction).
        let removed = Tally::new(|n| self.occupancy.release(n));
        let mut recorded = self.start_word();
        self.buckets.retain(|key, bucket| {
            let evict = self.evict(key, bucket, now, &mut recorded);
            removed.add(evict);
            !evict
        });
        let removed = removed.settle();
        self.observer.counters.swept(removed, started.elapsed());
        removed
    }

    /// One step of the automatic sweep: sweeps the next slice of the
    /// current shard, at `now`, by the second-chance rule (see
    /// [`Occupancy::position`]). Called by a creation that won
    /// [`Occupancy::step_due`].
    pub(super) fn sweep_step(&self, now: Nanos) {
        let started = std::time::Instant::now();
        let occupancy = &self.occupancy;
        let step = occupancy.position(now);
        // If a key's `Hash` or `Drop` panics in the slice, the step is
        // abandoned on the way out: its evictions counted, the flag let go
        // (a sweep stuck for good would let the map grow without bound),
        // and the next step starts at the next shard.
        let removed = Tally::new(|n| occupancy.abandoned(n));
        let mut recorded = self.start_word();
        let next = self
            .buckets
            .retain_slice(step.shard, step.at, SWEEP_SLICE, |key, bucket| {
                // Hashed before the bucket is retired: a key's `Hash` that
                // panics leaves its bucket live in the map, not retired
                // there (every later call on the key would find it dead).
                // Drawn only for a bucket `evict` may take, as evictions
                // were sampled.
                let may_go = Self::may_evict(bucket, step.full_at);
                let sampled = (may_go && Ghosts::sampled(one_in)).then(|| self.buckets.hash(key));
                let evict = self.evict(key, bucket, step.full_at, &mut recorded);
                removed.add(evict);
                if let (true, Some(hash)) = (evict, sampled) {
                    occupancy.pace.ghosts.evicted(hash);
                }
                !evict
            });
        // Settled by `stepped`, which counts the evictions and lets go.
        let removed = removed.forget();
        occupancy.stepped(removed, next);
        self.observer.counters.swept(removed, started.elapsed());
    }

    /// Under loom: the shard the automatic sweep's next step sweeps, and
    /// the steps its pass has taken (see `loom_api::sweep_position`).
    #[cfg(loom)]
    pub(crate) fn sweep_position(&self) -> (usize, usize) {
        self.occupancy.pace.position_now()
    }

    /// Releases memory the map no longer needs after a sweep.
    pub fn shrink_to_fit(&self) {
        self.buckets.shrink_to_fit();
        self.moved.shrink_to_fit();
    }
}

//! Eviction of full buckets, and the accounting behind the cap and the
//! automatic sweep.

use super::TokenBucketLimiter;
use crate::bucket::MOVED;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Ordering};
use crate::time::{nanos_from_duration, nanos_from_secs};
use crossbeam_utils::CachePadded;
use std::hash::{BuildHasher, Hash};

/// # Housekeeping: eviction and memory
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Removes every bucket that is full at `timestamp` and has no live
    /// [`BucketHandle`](crate::BucketHandle); returns how many were removed.
    ///
    /// A full bucket is indistinguishable from a key never seen, so this
    /// changes no later decision made at or after `timestamp`. An invalid
    /// timestamp removes nothing.
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
    pub fn sweep(&self, timestamp: f64) -> usize {
        match nanos_from_secs(timestamp) {
            Some(now) => self.sweep_nanos(now),
            None => 0,
        }
    }

    /// [`sweep`](Self::sweep) at the limiter's clock reading.
    pub fn sweep_now(&self) -> usize {
        match nanos_from_duration(self.clock.now()) {
            Some(now) => self.sweep_nanos(now),
            None => 0,
        }
    }

    pub(super) fn sweep_nanos(&self, now: u64) -> usize {
        let started = std::time::Instant::now();
        let mut removed = 0;
        self.buckets.retain(|key, bucket| {
            let evict = match bucket.word() {
                // Lock order: this shard (held by `retain`), then `moved`.
                // A live handle keeps its bucket. The count cannot rise
                // meanwhile: new handles are made under this shard's lock,
                // and a handle is cloned only from a live one. Hot-key
                // caches hold the bucket but not the pin: retiring it sends
                // their next call back to the map, exactly as a keyed call.
                MOVED => self.moved.remove_if(key, |moved| {
                    Arc::strong_count(&moved.pin) == 1 && moved.bucket.try_retire(now)
                }),
                _ => bucket.try_retire(now),
            };
            removed += usize::from(evict);
            !evict
        });
        self.occupancy.swept(removed, self.buckets.len());
        self.observer.counters.swept(removed, started.elapsed());
        removed
    }

    /// Releases memory the map no longer needs after a sweep.
    pub fn shrink_to_fit(&self) {
        self.buckets.shrink_to_fit();
        self.moved.shrink_to_fit();
    }
}

/// Counts buckets for the cap, and paces the automatic sweep.
pub(super) struct Occupancy {
    /// Buckets held, plus places reserved by creations in flight, bounded
    /// by `max_buckets`. Kept only when there is a cap, so that without one
    /// creating a bucket writes one shared counter (`pressure`), not two.
    pub(super) held: CachePadded<AtomicUsize>,
    /// Calls that tried to create a bucket since the last sweep.
    pressure: CachePadded<AtomicUsize>,
    /// The `pressure` at which the next automatic sweep is due.
    sweep_at: AtomicUsize,
    /// Set while an automatic sweep runs, so that only one thread sweeps.
    sweeping: AtomicBool,
    pub(super) max_buckets: usize,
    pub(super) auto_sweep: bool,
}

/// The fewest creations between two automatic sweeps.
const MIN_SWEEP_INTERVAL: usize = 1024;

impl Occupancy {
    pub(super) fn new() -> Self {
        Occupancy {
            held: CachePadded::new(AtomicUsize::new(0)),
            pressure: CachePadded::new(AtomicUsize::new(0)),
            sweep_at: AtomicUsize::new(MIN_SWEEP_INTERVAL),
            sweeping: AtomicBool::new(false),
            max_buckets: usize::MAX,
            auto_sweep: true,
        }
    }

    /// Counts one attempt to create a bucket; true if this caller should
    /// run the automatic sweep now (and then call `swept`).
    pub(super) fn sweep_due(&self) -> bool {
        if !self.auto_sweep {
            return false;
        }
        // Relaxed: the counters only pace the sweep; an off-by-a-few
        // reading delays or advances it slightly and decides nothing else.
        let pressure = self.pressure.fetch_add(1, Ordering::Relaxed) + 1;
        if pressure < self.sweep_at.load(Ordering::Relaxed) {
            return false;
        }
        // Acquire pairs with the Release in `swept`: the next sweeper sees
        // the counters the previous one left. A thread that loses the race
        // skips the sweep; the winner does it for everyone.
        !self.sweeping.swap(true, Ordering::Acquire)
    }

    /// Records a finished sweep that removed `removed` buckets and left
    /// `remaining`.
    fn swept(&self, removed: usize, remaining: usize) {
        // Relaxed: see `sweep_due`.
        self.release(removed);
        self.pressure.store(0, Ordering::Relaxed);
        self.sweep_at
            .store(remaining.max(MIN_SWEEP_INTERVAL), Ordering::Relaxed);
        // Release pairs with the Acquire in `sweep_due`. An explicit sweep
        // that ran without the flag clears it too, which at worst lets two
        // sweeps overlap; both are correct, just redundant.
        self.sweeping.store(false, Ordering::Release);
    }

    fn capped(&self) -> bool {
        self.max_buckets != usize::MAX
    }

    /// Reserves a place for a new bucket; false when the cap is reached.
    pub(super) fn reserve(&self) -> bool {
        if !self.capped() {
            return true;
        }
        // Relaxed: the counter alone decides; the fetch_add makes concurrent
        // reservations see each other, so at most `max_buckets` succeed.
        let before = self.held.fetch_add(1, Ordering::Relaxed);
        if before < self.max_buckets {
            return true;
        }
        self.release(1);
        false
    }

    /// Counts `n` buckets created outside `reserve` (handles).
    pub(super) fn add(&self, n: usize) {
        if !self.capped() {
            return;
        }
        // Relaxed: see `reserve`.
        self.held.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back `n` places (buckets removed, or a reservation unused).
    fn release(&self, n: usize) {
        if !self.capped() {
            return;
        }
        // Relaxed: see `reserve`.
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

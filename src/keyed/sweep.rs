//! Eviction of full buckets, and the accounting behind the cap and the
//! automatic sweep.

use super::TokenBucketLimiter;
use crate::bucket::{Bucket, MOVED};
use crate::store::Cursor;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::time::{At, Nanos};
use crossbeam_utils::CachePadded;
use std::hash::{BuildHasher, Hash};

/// # Housekeeping: eviction and memory
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Removes every bucket that is full at `at` ([`Now`](crate::Now): the limiter's clock) and has no live
    /// [`BucketHandle`](crate::BucketHandle); returns how many were removed.
    ///
    /// A full bucket is indistinguishable from a key never seen, so this
    /// changes no later decision made at or after `at`. An invalid
    /// instant removes nothing.
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
        let mut removed = 0;
        self.buckets.retain(|key, bucket| {
            let evict = self.evict(key, bucket, now);
            removed += usize::from(evict);
            !evict
        });
        self.occupancy.release(removed);
        self.observer.counters.swept(removed, started.elapsed());
        removed
    }

    /// One step of the automatic sweep: sweeps the next slice of the
    /// current shard at `now`. Called by a creation that won
    /// [`Occupancy::step_due`].
    pub(super) fn sweep_step(&self, now: Nanos) {
        let started = std::time::Instant::now();
        let occupancy = &self.occupancy;
        let (shard, at) = occupancy.position();
        let mut removed = 0;
        let next = self
            .buckets
            .retain_slice(shard, at, SWEEP_SLICE, |key, bucket| {
                let evict = self.evict(key, bucket, now);
                removed += usize::from(evict);
                !evict
            });
        occupancy.stepped(removed, next, self.buckets.shard_count());
        self.observer.counters.swept(removed, started.elapsed());
    }

    /// Whether `key`'s bucket is full at `now` and pinned by no handle; if
    /// so, retires it (and removes its `moved` entry): the caller, holding
    /// the key's shard write lock, then removes the entry.
    fn evict(&self, key: &K, bucket: &Bucket, now: Nanos) -> bool {
        match bucket.word() {
            // Lock order: this shard (held by the caller), then `moved`.
            // A live handle keeps its bucket. The count cannot rise
            // meanwhile: new handles are made under this shard's lock,
            // and a handle is cloned only from a live one. Hot-key
            // caches hold the bucket but not the pin: retiring it sends
            // their next call back to the map, exactly as a keyed call.
            MOVED => self.moved.remove_if(key, |moved| {
                Arc::strong_count(&moved.pin) == 1 && moved.bucket.try_retire(now)
            }),
            _ => bucket.try_retire(now),
        }
    }

    /// Releases memory the map no longer needs after a sweep.
    pub fn shrink_to_fit(&self) {
        self.buckets.shrink_to_fit();
        self.moved.shrink_to_fit();
    }
}

/// Counts buckets for the cap, and paces the automatic sweep.
///
/// The automatic sweep runs in steps of one slice: [`SWEEP_SLICE`] of a
/// shard's table buckets. A pass visits every shard once, in order, slice
/// by slice, and is spread over as many creations as the previous pass
/// left buckets (at least [`MIN_SWEEP_INTERVAL`]): one step every
/// `pass / slices` creations, where `slices` is how many steps the
/// previous pass took. A creation that takes a step pays for one slice,
/// whatever the size of the map, and the cost per created bucket stays
/// amortised O(1). The buckets held stay below what the last pass left
/// plus the creations of one pass: about twice the keys active within the
/// last refill time (or 16,384).
pub(super) struct Occupancy {
    /// Buckets held, plus places reserved by creations in flight, bounded
    /// by `max_buckets`. Kept only when there is a cap, so that without one
    /// creating a bucket writes one shared counter (`pressure`), not two.
    pub(super) held: CachePadded<AtomicUsize>,
    /// Creations (and, at the cap, attempts) since the last sweep step,
    /// counted by sample where steps are far apart (see `step_due`).
    pressure: CachePadded<AtomicUsize>,
    /// The `pressure` at which the next sweep step is due: the last pass's
    /// length divided among the shards, at least 1.
    step_at: AtomicUsize,
    /// Set while a sweep step runs, so that only one thread sweeps; it
    /// guards `cursor` and `left`.
    sweeping: AtomicBool,
    /// The shard the next step sweeps. Written only by the holder of
    /// `sweeping`, as are the four below.
    cursor: AtomicUsize,
    /// Where in that shard the next step starts (a `store::Cursor`).
    from: AtomicUsize,
    layout: AtomicU64,
    /// Steps taken so far in this pass.
    slices: AtomicUsize,
    /// Buckets the shards swept so far in this pass left.
    left: AtomicUsize,
    pub(super) max_buckets: usize,
    pub(super) auto_sweep: bool,
}

/// The fewest creations a pass of the automatic sweep is spread over: a
/// step every 32 creations at least, so that keys created and evicted at
/// a high rate (each step writes the sweep's shared state, which two
/// threads creating keys take turns to own) pay a step per 32 creations,
/// not per 4 (1024 measured 1.02x governor's churn at 2 threads, 8192
/// 1.39x, `benches/paired.rs`); a small map then holds up to 16,384
/// buckets, a megabyte or two.
#[cfg(not(loom))]
const MIN_SWEEP_INTERVAL: usize = 8192;

/// Table buckets a sweep step visits: a few hundred entries at most, tens
/// of microseconds even when each evicted key's memory is cold.
const SWEEP_SLICE: usize = 256;
/// Under loom (one shard), every creation takes a sweep step, so that the
/// models race the automatic sweep's real protocol against every call.
#[cfg(loom)]
const MIN_SWEEP_INTERVAL: usize = 1;

/// Creations sampled for the sweep's pacing: one in this many counts, with
/// this weight (see [`Occupancy::step_due`]). Under loom, every creation
/// counts, so that the models see every step.
#[cfg(not(loom))]
const PRESSURE_ONE_IN: usize = 8;
#[cfg(loom)]
const PRESSURE_ONE_IN: usize = 1;

/// Steps at least this many creations apart sample creations; closer ones
/// count every creation, so that a small map's pace stays exact.
const PRESSURE_SAMPLED_FROM: usize = 32;

/// True about one call in `n` (a power of two), at random, from the
/// calling thread's own [`Dice`](crate::dice::Dice): no key can steer it,
/// and threads that create only a few buckets each still count their share
/// on average.
#[cfg(not(loom))]
fn one_in(n: usize) -> bool {
    use crate::dice::Dice;
    use std::cell::Cell;
    thread_local! {
        static DICE: Cell<Dice> = const { Cell::new(Dice::new()) };
    }
    DICE.try_with(|dice| {
        let mut drawn = dice.get();
        let hit = drawn.one_in(n as u64);
        dice.set(drawn);
        hit
    })
    .unwrap_or(true)
}

#[cfg(loom)]
fn one_in(_: usize) -> bool {
    true
}

impl Occupancy {
    pub(super) fn new(shards: usize) -> Self {
        Occupancy {
            held: CachePadded::new(AtomicUsize::new(0)),
            pressure: CachePadded::new(AtomicUsize::new(0)),
            step_at: AtomicUsize::new((MIN_SWEEP_INTERVAL / shards).max(1)),
            sweeping: AtomicBool::new(false),
            cursor: AtomicUsize::new(0),
            from: AtomicUsize::new(0),
            layout: AtomicU64::new(0),
            slices: AtomicUsize::new(0),
            left: AtomicUsize::new(0),
            max_buckets: usize::MAX,
            auto_sweep: true,
        }
    }

    /// Counts one attempt to create a bucket; true if this caller should
    /// take a sweep step now (and then call `position` and `stepped`).
    pub(super) fn step_due(&self) -> bool {
        if !self.auto_sweep {
            return false;
        }
        // Relaxed: the counters only pace the sweep; an off-by-a-few
        // reading delays or advances it slightly and decides nothing else.
        let step_at = self.step_at.load(Ordering::Relaxed);
        // Where steps are far apart, one creation in `PRESSURE_ONE_IN`,
        // picked at random, counts for that many: the same pace on
        // average, and a shared write for one creation in eight instead of
        // every one (two threads creating keys took turns owning it).
        let weight = if step_at >= PRESSURE_SAMPLED_FROM {
            if !one_in(PRESSURE_ONE_IN) {
                return false;
            }
            PRESSURE_ONE_IN
        } else {
            1
        };
        let pressure = self.pressure.fetch_add(weight, Ordering::Relaxed) + weight;
        if pressure < step_at {
            return false;
        }
        // Acquire pairs with the Release in `stepped`: this step sees the
        // cursor and count the previous step left. A thread that loses the
        // race skips the step; the winner takes it for everyone.
        !self.sweeping.swap(true, Ordering::Acquire)
    }

    /// The shard this step sweeps, and where in it (the caller holds
    /// `sweeping`).
    pub(super) fn position(&self) -> (usize, Cursor) {
        // Relaxed: only the holder of `sweeping` touches the cursor, and
        // the flag's Acquire/Release orders the holders one after another.
        let at = Cursor {
            from: self.from.load(Ordering::Relaxed),
            layout: self.layout.load(Ordering::Relaxed),
        };
        (self.cursor.load(Ordering::Relaxed), at)
    }

    /// Records a sweep step that removed `removed` buckets from its shard,
    /// and stopped at `next` in it, or finished it leaving that many
    /// buckets there, out of `shards` shards; ends the pass after the last
    /// shard and paces the next one.
    pub(super) fn stepped(&self, removed: usize, next: Result<Cursor, usize>, shards: usize) {
        self.release(removed);
        // Relaxed: the cursor fields are guarded by `sweeping` (see
        // `position`); `pressure` and `step_at` only pace (see `step_due`).
        let slices = self.slices.load(Ordering::Relaxed) + 1;
        let (cursor, at) = match next {
            Ok(at) => (self.cursor.load(Ordering::Relaxed), at),
            Err(left) => {
                let left = self.left.load(Ordering::Relaxed) + left;
                self.left.store(left, Ordering::Relaxed);
                (self.cursor.load(Ordering::Relaxed) + 1, Cursor::default())
            }
        };
        self.from.store(at.from, Ordering::Relaxed);
        self.layout.store(at.layout, Ordering::Relaxed);
        if cursor < shards {
            self.cursor.store(cursor, Ordering::Relaxed);
            self.slices.store(slices, Ordering::Relaxed);
        } else {
            // The pass is over: spread the next one over as many creations
            // as this one left buckets, a step per slice.
            let pass = self.left.load(Ordering::Relaxed).max(MIN_SWEEP_INTERVAL);
            self.cursor.store(0, Ordering::Relaxed);
            self.left.store(0, Ordering::Relaxed);
            self.slices.store(0, Ordering::Relaxed);
            self.step_at
                .store((pass / slices).max(1), Ordering::Relaxed);
        }
        self.pressure.store(0, Ordering::Relaxed);
        // Release pairs with the Acquire in `step_due`.
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
    pub(super) fn release(&self, n: usize) {
        if !self.capped() {
            return;
        }
        // Relaxed: see `reserve`.
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

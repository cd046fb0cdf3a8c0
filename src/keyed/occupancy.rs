//! The accounting behind the bucket cap and the automatic sweep: how many
//! buckets are held, and the sweep's pace (whose machine, shared with the
//! compound store, is [`crate::pace`]).

use crate::pace::{Pace, Step};
use crate::store::Cursor;
use crate::sync::{AtomicUsize, Ordering};
use crate::time::Nanos;
use crossbeam_utils::CachePadded;

/// Counts buckets for the cap, and paces the automatic sweep ([`Pace`],
/// the machine both stores' sweeps share: a step of one slice every so
/// many creations, a pass over every shard, the second-chance rule).
///
/// A stream of keys each seen once holds at most three passes' worth of
/// buckets, 3 x 8192 = 24,576 (about 16,384 on average), plus the keys
/// spent within one refill time (`capacity / rate`): see [`crate::pace`].
pub(super) struct Occupancy {
    /// Buckets held, plus places reserved by creations in flight, bounded
    /// by `max_buckets`. Kept only when there is a cap, so that without one
    /// creating a bucket writes one shared counter (`pressure`), not two.
    pub(super) held: CachePadded<AtomicUsize>,
    /// The automatic sweep's pace and place.
    pub(super) pace: Pace,
    pub(super) max_buckets: usize,
    pub(super) auto_sweep: bool,
}

/// The fewest creations a pass of the automatic sweep is spread over: a
/// step every 32 creations at least, so that keys created and evicted at
/// a high rate (each step writes the sweep's shared state, which two
/// threads creating keys take turns to own) pay a step per 32 creations,
/// not per 4 (1024 measured 1.02x governor's churn at 2 threads, 8192
/// 1.39x, `benches/paired.rs`); a small map then holds up to three
/// passes' worth, 24,576 buckets, a megabyte or two.
#[cfg(not(loom))]
const MIN_SWEEP_INTERVAL: usize = 8192;

/// Under loom (one shard), every creation takes a sweep step, so that the
/// models race the automatic sweep's real protocol against every call.
#[cfg(loom)]
const MIN_SWEEP_INTERVAL: usize = 1;

impl Occupancy {
    pub(super) fn new(shards: usize) -> Self {
        Occupancy {
            held: CachePadded::new(AtomicUsize::new(0)),
            pace: Pace::new(MIN_SWEEP_INTERVAL, shards),
            max_buckets: usize::MAX,
            auto_sweep: true,
        }
    }

    /// Counts one attempt to create a bucket; true if this caller should
    /// take a sweep step now (and then call `position`, then `stepped`
    /// or `abandoned`).
    pub(super) fn step_due(&self) -> bool {
        self.auto_sweep && self.pace.counted() && self.pace.take()
    }

    /// Where this step sweeps (the caller holds the step), and the instant
    /// its buckets must be full at to be retired: the second-chance rule's
    /// (see [`Pace::position`]), but `now` at the cap, where new keys are
    /// being refused and room matters more than the buckets the full ones
    /// would cost again.
    pub(super) fn position(&self, now: Nanos) -> Step {
        let mut step = self.pace.position(now);
        // Relaxed: see `reserve`; a stale count only picks the rule for
        // this one step.
        if self.capped() && self.held.load(Ordering::Relaxed) >= self.max_buckets {
            step.full_at = now;
        }
        step
    }

    /// Records a sweep step that removed `removed` buckets from its shard,
    /// and stopped at `next` in it, or finished it leaving that many
    /// buckets there (see [`Pace::stepped`]).
    pub(super) fn stepped(&self, removed: usize, next: Result<Cursor, usize>) {
        self.release(removed);
        self.pace.stepped(next);
    }

    /// Lets go of a sweep step that unwound after removing `removed`
    /// buckets: they are counted, and the next step starts at the next
    /// shard (see [`Pace::abandoned`]).
    pub(super) fn abandoned(&self, removed: usize) {
        self.release(removed);
        self.pace.abandoned();
    }

    fn capped(&self) -> bool {
        self.max_buckets != usize::MAX
    }

    /// Reserves a place for a new bucket; false when the cap is reached.
    pub(super) fn reserve(&self) -> bool {
        if !self.capped() {
            return true;
        }
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::ReserveCheckThenAdd) {
            if self.held.load(Ordering::Relaxed) >= self.max_buckets {
                return false;
            }
            self.held.fetch_add(1, Ordering::Relaxed);
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

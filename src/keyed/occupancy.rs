//! The accounting behind the bucket cap and the automatic sweep: how many
//! buckets are held, when the sweep's next step is due, and where it runs.

use super::ghosts::Ghosts;
use crate::store::Cursor;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::time::Nanos;
use crossbeam_utils::CachePadded;

/// Counts buckets for the cap, paces the automatic sweep, and keeps the
/// timestamps its second-chance rule reads.
///
/// The automatic sweep runs in steps of one slice: [`SWEEP_SLICE`] of a
/// shard's table buckets. A pass visits every shard once, in order, slice
/// by slice, and is spread over [`next_pass`](Self::next_pass) creations:
/// one step every `pass / slices` creations, where `slices` is how many
/// steps the previous pass took. A creation that takes a step pays for one
/// slice, whatever the size of the map; as a pass is spread over at least
/// half the buckets the previous one left, the cost per created
/// bucket stays amortised O(1) (a few buckets visited per creation).
///
/// A pass retires the buckets that are full at the step's timestamp and
/// were not spent since the previous pass started (see
/// [`position`](Self::position)): a bucket of a key that calls at least
/// once a pass is never retired, whatever its rate, and a retired bucket
/// was idle for at least one whole pass. Every bucket held was therefore
/// spent (or made) at a timestamp after the start of the pass before the
/// previous one, less one refill time (`capacity / rate`): the buckets
/// held are at most the keys spent in that window, the current pass and
/// the two before it. Keys each seen once never lengthen the passes (see
/// `next_pass`), so a stream of them holds at most three passes' worth,
/// 3 x 8192 = 24,576 buckets (about 16,384 on average), plus the keys
/// spent within one refill time.
pub(super) struct Occupancy {
    /// Buckets held, plus places reserved by creations in flight, bounded
    /// by `max_buckets`. Kept only when there is a cap, so that without one
    /// creating a bucket writes one shared counter (`pressure`), not two.
    pub(super) held: CachePadded<AtomicUsize>,
    /// Creations (and, at the cap, attempts) since the last sweep step,
    /// counted by sample where steps are far apart (see `step_due`).
    pressure: CachePadded<AtomicUsize>,
    /// The `pressure` at which the next sweep step is due: the pass's
    /// length divided among the previous pass's slices, at least 1.
    step_at: AtomicUsize,
    /// Set while a sweep step runs, so that only one thread sweeps; it
    /// guards the fields from `cursor` to `idle_since`.
    sweeping: AtomicBool,
    /// The shard the next step sweeps. Read and written only by the holder
    /// of `sweeping`, as are the fields below up to `idle_since`.
    cursor: AtomicUsize,
    /// Where in that shard the next step starts (a `store::Cursor`).
    from: AtomicUsize,
    layout: AtomicU64,
    /// Steps taken so far in this pass.
    slices: AtomicUsize,
    /// Buckets the shards swept so far in this pass left.
    left: AtomicUsize,
    /// The creations this pass is spread over (see `next_pass`).
    pass_length: AtomicUsize,
    /// The timestamp (a [`Nanos`] of the callers' timeline) of the step
    /// that started this pass; 0 before the first.
    pass_started: AtomicU64,
    /// The timestamp of the step that started the previous pass (0 before
    /// the second): this pass retires only buckets full at or before it.
    idle_since: AtomicU64,
    /// Ghosts of the keys the sweep evicted, to see them come back.
    pub(super) ghosts: Ghosts,
    pub(super) max_buckets: usize,
    pub(super) auto_sweep: bool,
}

/// Where a sweep step runs, and the instant its buckets must be full at to
/// be retired.
#[derive(Debug, Clone, Copy)]
pub(super) struct Step {
    pub(super) shard: usize,
    pub(super) at: Cursor,
    pub(super) full_at: Nanos,
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

/// Table buckets a sweep step visits: a few hundred entries at most, tens
/// of microseconds even when each evicted key's memory is cold.
pub(crate) const SWEEP_SLICE: usize = 256;
/// Under loom (one shard), every creation takes a sweep step, so that the
/// models race the automatic sweep's real protocol against every call.
#[cfg(loom)]
const MIN_SWEEP_INTERVAL: usize = 1;

/// A pass is spread over at least the buckets the previous one left
/// divided by this: the sweep visits about this many buckets per creation.
/// Below 1.5, a stream of keys each seen once would lengthen every pass
/// (a pass leaves the creations of one pass and a half on average, all
/// spent since the previous one started). At 4, the steps were frequent
/// enough to set the new keys' p99 at 10^6 keys, and with it the whole
/// p99 (`benches/latency.rs`: 3.5-4.6 µs against 3.2-3.8 at 2,
/// `BENCHMARKS.md`, eleventh round).
const LEFT_PER_CREATION: usize = 2;

/// The share of new buckets that must be for returning keys (keys the
/// sweep evicted within the last few hundred passes, counted by sample in
/// [`Ghosts`]) for the next pass to be [`GROWTH`] times as long: one in
/// this many, and at least [`RETURNS_TO_GROW`] of the watched keys (each
/// stands for about 256 returns). A stream of keys each seen once counts
/// none, so the bar can sit this low: at one in eight and four returns,
/// passes of 8,192 creations a third of which were keys first seen (the
/// everyday benchmark at 10^6 keys) stayed at the floor while 6-9% of
/// their creations were returns (`BENCHMARKS.md`, seventh round).
const RETURNING_SHARE: usize = 32;
const RETURNS_TO_GROW: usize = 2;

/// How much longer the next pass is when the returns clear that bar. A
/// pass takes its own length in creations, so passes that must reach a
/// return interval `r` (in creations) from the floor take about `r *
/// GROWTH / (GROWTH - 1)` creations to get there, re-creating returning
/// keys all along: at 2, the everyday benchmark at 10^6 keys was still
/// learning for most of its rounds. 4 learns in two thirds of the
/// creations, for at most four times the length the keys need (not two)
/// until the passes shrink back, a quarter a pass (`BENCHMARKS.md`,
/// seventh round).
const GROWTH: usize = 4;

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

/// The pacing rule of both automatic sweeps (this limiter's and the
/// compound limiter's): the creations the next pass is spread over, after
/// a pass of `length` that left `left` entries, ending the pass in
/// `ghosts`. [`GROWTH`] times `length` while a good share of the new
/// entries are for keys evicted recently, else three quarters of it; at
/// least `left /` [`LEFT_PER_CREATION`] and `floor`.
pub(crate) fn next_pass_length(length: usize, left: usize, ghosts: &Ghosts, floor: usize) -> usize {
    let (watched, returned) = ghosts.end_pass();
    let next = if returned >= RETURNS_TO_GROW && returned * RETURNING_SHARE >= watched {
        length.saturating_mul(GROWTH)
    } else {
        length - length / 4
    };
    next.max(left / LEFT_PER_CREATION).max(floor)
}

/// True about one call in `n` (a power of two), at random, from the
/// calling thread's own [`Dice`](crate::dice::Dice): no key can steer it,
/// and threads that create only a few buckets each still count their share
/// on average.
#[cfg(not(loom))]
pub(crate) fn one_in(n: usize) -> bool {
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
pub(crate) fn one_in(_: usize) -> bool {
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
            pass_length: AtomicUsize::new(MIN_SWEEP_INTERVAL),
            pass_started: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            ghosts: Ghosts::new(),
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
        #[cfg(loom)]
        if let Some(taken) = self.flawed_take() {
            return taken;
        }
        !self.sweeping.swap(true, Ordering::Acquire)
    }

    /// Under loom, a broken twin's way to take the flag (see
    /// `flaw::Flaw`), or `None` for the real one.
    #[cfg(loom)]
    fn flawed_take(&self) -> Option<bool> {
        use crate::flaw::{flawed, Flaw};
        if flawed(Flaw::SweepFlagRelaxed) {
            return Some(!self.sweeping.swap(true, Ordering::Relaxed));
        }
        if flawed(Flaw::SweepFlagCheckThenSet) {
            if self.sweeping.load(Ordering::Acquire) {
                return Some(false);
            }
            self.sweeping.store(true, Ordering::Relaxed);
            return Some(true);
        }
        None
    }

    /// The shard the next step sweeps, and the steps this pass has taken.
    #[cfg(loom)]
    pub(super) fn position_now(&self) -> (usize, usize) {
        // Relaxed: the caller (a model, after joining every thread that
        // stepped) is ordered after the last step by the joins.
        (
            self.cursor.load(Ordering::Relaxed),
            self.slices.load(Ordering::Relaxed),
        )
    }

    /// Where this step sweeps (the caller holds `sweeping`), and the
    /// second-chance rule's bound: the step retires the buckets full at
    /// `min(now, idle_since)`, where `idle_since` is the timestamp of the
    /// step that started the previous pass. An admitted spend at `s` leaves
    /// its bucket full only after `s`, so a bucket spent at or after that
    /// timestamp is kept: only a bucket idle (and full) since before the
    /// previous pass started goes, one that the previous pass already saw
    /// idle. The bound is never above `now`, so what goes is full at `now`
    /// and eviction stays exact; if timestamps run backwards (a pass started
    /// by a call stamped later than this one), it is `now`, and every full
    /// bucket goes, as with `sweep`. At the cap, too, the bound is `now`:
    /// new keys are being refused, and room matters more than the buckets
    /// the full ones would cost again.
    pub(super) fn position(&self, now: Nanos) -> Step {
        // Relaxed: only the holder of `sweeping` touches these fields, and
        // the flag's Acquire/Release orders the holders one after another.
        let at = Cursor {
            from: self.from.load(Ordering::Relaxed),
            layout: self.layout.load(Ordering::Relaxed),
        };
        let idle_since = Nanos::new(if self.slices.load(Ordering::Relaxed) == 0 {
            // The first step of a pass: the pass that started last is now
            // the previous one.
            let previous = self.pass_started.swap(now.as_u64(), Ordering::Relaxed);
            self.idle_since.store(previous, Ordering::Relaxed);
            previous
        } else {
            self.idle_since.load(Ordering::Relaxed)
        });
        // Relaxed: see `reserve`; a stale count only picks the rule for
        // this one step.
        let full = self.capped() && self.held.load(Ordering::Relaxed) >= self.max_buckets;
        Step {
            shard: self.cursor.load(Ordering::Relaxed),
            at,
            full_at: if full { now } else { idle_since.min(now) },
        }
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
            // The pass is over: pace the next one, a step per slice.
            let pass = self.next_pass(self.left.load(Ordering::Relaxed));
            self.pass_length.store(pass, Ordering::Relaxed);
            self.cursor.store(0, Ordering::Relaxed);
            self.left.store(0, Ordering::Relaxed);
            self.slices.store(0, Ordering::Relaxed);
            self.step_at
                .store((pass / slices).max(1), Ordering::Relaxed);
        }
        self.pressure.store(0, Ordering::Relaxed);
        // Release pairs with the Acquire in `step_due`.
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::SweepFlagRelaxed) {
            self.sweeping.store(false, Ordering::Relaxed);
            return;
        }
        self.sweeping.store(false, Ordering::Release);
    }

    /// Lets go of a sweep step that unwound after removing `removed`
    /// buckets: they are counted, and the next step, which may be taken
    /// at once, sweeps the same slice again.
    pub(super) fn abandoned(&self, removed: usize) {
        self.release(removed);
        // Release, as in `stepped`.
        self.sweeping.store(false, Ordering::Release);
    }

    /// The creations the next pass is spread over, at the end of a pass
    /// that left `left` buckets (the caller holds `sweeping`): [`GROWTH`]
    /// times this pass's length while a good share of the new buckets are
    /// for keys the sweep evicted recently (its passes are then too short
    /// for them: evicting them only made them again), else three quarters
    /// of it; and at least half of `left` and [`MIN_SWEEP_INTERVAL`].
    ///
    /// Keys seen once never return, so under a stream of them passes
    /// shrink to the minimum and the map to three passes' worth; keys that
    /// come back lengthen the passes until they are kept, however long
    /// their calls are apart (up to a few hundred passes).
    fn next_pass(&self, left: usize) -> usize {
        // Relaxed: guarded by `sweeping` (see `position`).
        let length = self.pass_length.load(Ordering::Relaxed);
        next_pass_length(length, left, &self.ghosts, MIN_SWEEP_INTERVAL)
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

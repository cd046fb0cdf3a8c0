//! The automatic sweep's pace and place, one machine for both stores (the
//! in-memory limiter's buckets and the compound limiter's cells): when the
//! next step is due, which slice of which shard it sweeps, which thread
//! sweeps, and the second-chance rule's bound.
//!
//! The sweep runs in steps of one slice: [`SWEEP_SLICE`] of a shard's
//! table buckets. A pass visits every shard once, in order, slice by
//! slice, and is spread over a number of new keys ([`next_pass_length`]):
//! one step every `pass / slices` of them, where `slices` is how many
//! steps the previous pass took, until the end of each shard re-paces the
//! rest by the slices the shards swept took (a map that grew since has
//! more: paced by the old count, a pass ran over its length by as much).
//! A new key that takes a step pays for one
//! slice, whatever the size of the map; as a pass is spread over at least
//! half the entries the previous one left, the cost per new key stays
//! amortised O(1) (a few entries visited per new key).
//!
//! A pass removes the entries that are full at the step's timestamp and
//! were not spent since the previous pass started (see
//! [`Pace::position`]): a key that calls at least once a pass is never
//! removed, whatever its rate, and a removed entry was idle for at least
//! one whole pass. Every entry held was therefore spent (or made) at a
//! timestamp after the start of the pass before the previous one, less one
//! refill time: the entries held are at most the keys spent in that
//! window, the current pass and the two before it. Keys each seen once
//! never lengthen the passes, so a stream of them holds at most three
//! passes' worth (at the floor: three times the store's fewest keys a
//! pass), plus the keys spent within one refill time.
//!
//! These bounds count new keys, whatever the threads: a step takes its
//! own count when it begins, so keys made while it runs count toward the
//! next steps. A thread descheduled while it holds a step holds up the
//! sweep, and the keys made meanwhile stay until the steps owed, taken
//! one call after another, have caught up.
//!
//! A removed entry leaves a mark: the latest instant from which any
//! removed entry was full ([`Pace::restart`]). A key that comes back
//! starts from it, full at and after it, not before: a call stamped
//! earlier than a sweep that removed its key (another thread read the
//! clock first, or a caller's timeline lags) then finds the bucket no
//! fuller than it was, where a bucket made full at every instant would
//! have refilled it by as much as the sweep's timestamp is ahead. A key
//! never seen is indistinguishable from a removed one, so it starts from
//! the mark too: the same at and after it, which is every call of a
//! timeline that only moves forward.
//!
//! The protocol: a thread whose new key finds a step due takes `sweeping`
//! with a swap (Acquire); it alone reads and writes the place fields
//! (`shard` to `idle_since`, all `Relaxed`) and lets the flag go with a
//! Release store, so that the next holder sees the place the previous one
//! left. Loom model 9 checks it, over the in-memory limiter.

pub(crate) mod ghosts;

use crate::store::Cursor;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::time::Nanos;
use crossbeam_utils::CachePadded;
use ghosts::Ghosts;

/// Table buckets a sweep step visits: a few hundred entries at most, tens
/// of microseconds even when each removed key's memory is cold (a whole
/// shard at 10^6 keys is thousands of entries: milliseconds).
pub(crate) const SWEEP_SLICE: usize = 256;

/// A pass is spread over at least the entries the previous one left
/// divided by this: the sweep visits about this many entries per new key.
/// Below 1.5, a stream of keys each seen once would lengthen every pass
/// (a pass leaves the new keys of one pass and a half on average, all
/// spent since the previous one started). At 4, the steps were frequent
/// enough to set the new keys' p99 at 10^6 keys, and with it the whole
/// p99 (`benches/latency.rs`: 3.5-4.6 µs against 3.2-3.8 at 2,
/// `BENCHMARKS.md`, eleventh round).
const LEFT_PER_NEW_KEY: usize = 2;

/// The share of new keys that must be returning keys (keys the sweep
/// removed within the last few hundred passes, counted by sample in
/// [`Ghosts`]) for a pass shorter than [`LONG_PASS`] to grow: one in this
/// many, and at least [`RETURNS_TO_GROW`] of the watched keys (each
/// stands for about 16 returns). A stream of keys each seen once counts
/// none, so the bar can sit this low. While a map fills up, most new keys
/// are first sightings, so the returns' share is low even when every key
/// the sweep removes comes back: at one in 32, passes at the floor while
/// the everyday workload met its 10^6 keys (`examples/pacing.rs`) saw
/// 1-3.5% of their new keys return for several passes before clearing
/// the bar (and at one in eight, `BENCHMARKS.md`, seventh round, 6-9%).
/// One in 128 with one eviction in 16 sampled: 0.43-0.97% of the calls
/// made again at 10^6 keys in twenty runs of a scratch copy, against
/// 0.43-1.50% at one in 64 with one in 64 sampled (`BENCHMARKS.md`,
/// fifteenth round).
const RETURNING_SHARE: usize = 128;
const RETURNS_TO_GROW: usize = 2;

/// The bar for a pass of at least [`LONG_PASS`] new keys: one return in
/// this many. Keys that come back at random intervals (a Poisson stream
/// of calls) always leave a tail of gaps longer than the pass, which
/// shrinks only as the pass's length over their mean interval: at one in
/// 128, a million keys calling about once a second beside a stream of
/// keys each seen once (30% of the calls) kept clearing the bar up to
/// passes five times their interval, each growth holding four times the
/// keys seen once: 12 to 14 million buckets after 30 s, and rising
/// (`benches/latency.rs`, `KEYRATE_LATENCY_SECS=30`); at one in 32 the
/// passes settle where the entries they leave put them (see
/// [`LEFT_PER_NEW_KEY`]): 6.0 million.
const LONG_RETURNING_SHARE: usize = 32;

/// A pass that clears its bar grows to this many new keys at once, if
/// shorter, or [`LONG_GROWTH`] times if that is more. A pass takes its own
/// length in new keys, and every pass too short for the keys removes keys
/// that come back: each pass at the floor that the everyday workload at
/// 10^6 keys spent learning re-created about 8,000 (a quarter of a
/// percent of its calls), so its first growth should reach the keys'
/// interval at once (re-creations over the floor, `examples/pacing.rs`,
/// sixteen runs: 0.32-0.60% of the calls at 2^20, 0.76-1.01% at 2^19,
/// 1.00-1.52% growing sixteen times, then four). A pass holds about one
/// and a half passes' worth of the keys each seen once (module docs), so
/// this bounds what a growth from a short pass costs: with 10^5 keys
/// coming back and as many calls on keys each seen once (`pacing --
/// 100000 40 2 3`), 1.8 million buckets held at most (1.0-1.2 at 2^19),
/// where growing sixteen times a pass, as often as the bar was cleared,
/// held 3.6 million.
const LONG_PASS: usize = 1 << 20;
const LONG_GROWTH: usize = 4;

/// New keys sampled for the pacing: one in this many counts, with this
/// weight (see [`Pace::counted`]). Under loom, every new key counts, so
/// that the models see every step.
#[cfg(not(loom))]
const PRESSURE_ONE_IN: usize = 8;
#[cfg(loom)]
const PRESSURE_ONE_IN: usize = 1;

/// Steps at least this many new keys apart sample them; closer ones count
/// every new key, so that a small map's pace stays exact.
const PRESSURE_SAMPLED_FROM: usize = 32;

/// True about one call in `n` (a power of two), at random, from the
/// calling thread's own [`Dice`](crate::dice::Dice): no key can steer it,
/// and threads that make only a few keys each still count their share on
/// average.
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

/// Where a sweep step runs, and the instant its entries must be full at to
/// be removed (the second-chance rule's bound, never after the step's
/// `now`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub(crate) shard: usize,
    pub(crate) at: Cursor,
    pub(crate) full_at: Nanos,
}

/// The automatic sweep's pace and place (see the module docs).
pub(crate) struct Pace {
    /// New keys no step has taken yet (each step takes `step_at` of them
    /// when it begins), counted by sample where steps are far apart (see
    /// `counted`).
    pressure: CachePadded<AtomicUsize>,
    /// The `pressure` at which the next step is due: the pass's length
    /// divided among the previous pass's slices, at least 1.
    step_at: AtomicUsize,
    /// Set while a step runs, so that one thread sweeps at a time; it
    /// guards the fields from `shard` to `idle_since`.
    sweeping: AtomicBool,
    /// The shard the next step sweeps, and where in it.
    shard: AtomicUsize,
    from: AtomicUsize,
    layout: AtomicU64,
    /// Steps taken so far in this pass.
    slices: AtomicUsize,
    /// New keys the steps of this pass took so far (each its `step_at`).
    taken: AtomicUsize,
    /// Entries the shards swept so far in this pass left.
    left: AtomicUsize,
    /// The new keys this pass is spread over (see `next_pass_length`).
    length: AtomicUsize,
    /// The timestamp (a [`Nanos`] of the callers' timeline) of the step
    /// that started this pass; 0 before the first.
    started: AtomicU64,
    /// The timestamp of the step that started the previous pass (0 before
    /// the second): this pass removes only entries full at or before it.
    idle_since: AtomicU64,
    /// Ghosts of the keys the sweep removed, to see them come back.
    pub(crate) ghosts: Ghosts,
    /// The latest word (`full_at`) of an entry removed by a sweep, by hand
    /// or automatic, while the automatic sweep is on (the stores record
    /// only then: one timeline), 0 before the first: where a key without
    /// an entry starts (see the module docs). Raised under the removed entry's
    /// shard lock, before the removal is seen, and read under the lock of
    /// the shard that creates the key, so a creation that finds a key
    /// removed sees at least its word.
    restart: AtomicU64,
    /// The fewest new keys a pass is spread over.
    floor: usize,
    /// The shards a pass visits.
    shards: usize,
}

impl Pace {
    /// A sweep over `shards` shards whose passes are spread over at least
    /// `floor` new keys.
    pub(crate) fn new(floor: usize, shards: usize) -> Self {
        Pace {
            pressure: CachePadded::new(AtomicUsize::new(0)),
            step_at: AtomicUsize::new((floor / shards).max(1)),
            sweeping: AtomicBool::new(false),
            shard: AtomicUsize::new(0),
            from: AtomicUsize::new(0),
            layout: AtomicU64::new(0),
            slices: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            left: AtomicUsize::new(0),
            length: AtomicUsize::new(floor),
            started: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            ghosts: Ghosts::new(),
            restart: AtomicU64::new(0),
            floor,
            shards,
        }
    }

    /// The word of a key without an entry: the latest word of an entry
    /// removed (see the module docs), `Nanos::ZERO` before any was.
    /// Read it under the lock of the shard the key's entry would be in.
    #[inline]
    pub(crate) fn restart(&self) -> Nanos {
        // Relaxed: ordered by the shard locks (see `restart`'s field).
        Nanos::new(self.restart.load(Ordering::Relaxed))
    }

    /// Records the word of an entry being removed, under its shard's
    /// write lock, before the entry leaves the map. `recorded` is the
    /// highest word this caller has recorded (start it at
    /// [`restart`](Self::restart)): a word at or below it is already
    /// covered, and costs no write to the shared word.
    #[inline]
    pub(crate) fn removed(&self, word: Nanos, recorded: &mut Nanos) {
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::RemovedWordForgotten) {
            // BROKEN (a model's twin): the removal leaves no mark.
            return;
        }
        if word > *recorded {
            // Relaxed: the shard lock, released after the entry is gone,
            // publishes it to the creation that finds the key absent.
            self.restart.fetch_max(word.as_u64(), Ordering::Relaxed);
            *recorded = word;
        }
    }

    /// Forgets the words of the entries removed so far: keys without an
    /// entry start full at every instant again (an operator's
    /// `reset_all`).
    pub(crate) fn forget_removed(&self) {
        self.restart.store(0, Ordering::Relaxed);
    }

    /// Counts one new key; true if a step is due now (the caller then
    /// [`take`](Self::take)s it, at once or after its call).
    pub(crate) fn counted(&self) -> bool {
        // Relaxed: the counters only pace the sweep; an off-by-a-few
        // reading delays or advances it slightly and decides nothing else.
        let step_at = self.step_at.load(Ordering::Relaxed);
        // Where steps are far apart, one new key in `PRESSURE_ONE_IN`,
        // picked at random, counts for that many: the same pace on
        // average, and a shared write for one new key in eight instead of
        // every one (two threads making keys took turns owning it).
        let weight = if step_at >= PRESSURE_SAMPLED_FROM {
            if !one_in(PRESSURE_ONE_IN) {
                return false;
            }
            PRESSURE_ONE_IN
        } else {
            1
        };
        let pressure = self.pressure.fetch_add(weight, Ordering::Relaxed) + weight;
        pressure >= step_at
    }

    /// Whether a step is due, for a caller that counted its new keys
    /// earlier (under a lock it has let go since). Inline: every compound
    /// call asks.
    #[inline]
    pub(crate) fn due(&self) -> bool {
        // Relaxed: as in `counted`.
        self.pressure.load(Ordering::Relaxed) >= self.step_at.load(Ordering::Relaxed)
    }

    /// Takes the step that is due: true if this caller sweeps now (and
    /// then calls [`position`](Self::position), then
    /// [`stepped`](Self::stepped) or [`abandoned`](Self::abandoned)). A
    /// thread that loses the race skips the step; the winner takes it for
    /// everyone.
    pub(crate) fn take(&self) -> bool {
        // Acquire pairs with the Release in `let_go`: this step sees the
        // place the previous step left.
        #[cfg(loom)]
        let taken = self
            .flawed_take()
            .unwrap_or_else(|| !self.sweeping.swap(true, Ordering::Acquire));
        #[cfg(not(loom))]
        let taken = !self.sweeping.swap(true, Ordering::Acquire);
        if taken {
            // The step takes its count now, not when it ends, and only its
            // own: the keys other threads make while it runs (or while the
            // thread that holds it is descheduled) count toward the next
            // steps, which follow at once until they have caught up. Wiped
            // instead, two threads flooding new keys stretched each pass
            // over several times its length, and the map with it. Calls
            // that ask whether a step is due while this one runs find none
            // unless more are owed. Relaxed: as in `counted`.
            let step_at = self.step_at.load(Ordering::Relaxed);
            let _ = self
                .pressure
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |pressure| {
                    Some(pressure.saturating_sub(step_at))
                });
            // Relaxed: a place field, guarded by `sweeping` (see `position`).
            let so_far = self.taken.load(Ordering::Relaxed);
            self.taken
                .store(so_far.saturating_add(step_at), Ordering::Relaxed);
        }
        taken
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
    pub(crate) fn position_now(&self) -> (usize, usize) {
        // Relaxed: the caller (a model, after joining every thread that
        // stepped) is ordered after the last step by the joins.
        (
            self.shard.load(Ordering::Relaxed),
            self.slices.load(Ordering::Relaxed),
        )
    }

    /// Where this step sweeps (the caller took the step), and the
    /// second-chance rule's bound: the step removes the entries full at
    /// `min(now, idle_since)`, where `idle_since` is the timestamp of the
    /// step that started the previous pass. An admitted spend at `s` leaves
    /// its entry full only after `s`, so an entry spent at or after that
    /// timestamp is kept: only an entry idle (and full) since before the
    /// previous pass started goes, one that the previous pass already saw
    /// idle. The bound is never above `now`, so what goes is full at `now`
    /// and removal stays exact; if timestamps run backwards (a pass started
    /// by a call stamped later than this one), it is `now`.
    pub(crate) fn position(&self, now: Nanos) -> Step {
        // Relaxed: only the holder of `sweeping` touches these fields, and
        // the flag's Acquire/Release orders the holders one after another.
        let idle_since = Nanos::new(if self.slices.load(Ordering::Relaxed) == 0 {
            // The first step of a pass: the pass that started last is now
            // the previous one.
            let previous = self.started.swap(now.as_u64(), Ordering::Relaxed);
            self.idle_since.store(previous, Ordering::Relaxed);
            previous
        } else {
            self.idle_since.load(Ordering::Relaxed)
        });
        Step {
            shard: self.shard.load(Ordering::Relaxed),
            at: Cursor {
                from: self.from.load(Ordering::Relaxed),
                layout: self.layout.load(Ordering::Relaxed),
            },
            full_at: idle_since.min(now),
        }
    }

    /// Records a step that stopped at `next` in its shard, or finished it
    /// leaving that many entries there; ends the pass after the last
    /// shard, paces the next one, and lets the flag go.
    pub(crate) fn stepped(&self, next: Result<Cursor, usize>) {
        self.advance(next);
        self.let_go();
    }

    /// Lets go of a step that unwound (a key's `Hash` or `Drop` panicked in
    /// its slice): the rest of its shard waits for
    /// the next pass, and the next step, due at once, starts at the next
    /// shard (or the next pass), so that a key that panics every time
    /// cannot hold the sweep on one slice for ever, nor start the pass
    /// again (which would move the second chance's bound).
    pub(crate) fn abandoned(&self) {
        self.advance(Err(0));
        // Relaxed: as in `counted`.
        let step_at = self.step_at.load(Ordering::Relaxed);
        self.pressure.fetch_add(step_at, Ordering::Relaxed);
        self.let_go();
    }

    /// The place after a step (see `stepped`).
    fn advance(&self, next: Result<Cursor, usize>) {
        // Relaxed: the place fields are guarded by `sweeping` (see
        // `position`); `pressure` and `step_at` only pace (see `counted`).
        let slices = self.slices.load(Ordering::Relaxed) + 1;
        let (shard, at) = match next {
            Ok(at) => (self.shard.load(Ordering::Relaxed), at),
            Err(left) => {
                let left = self.left.load(Ordering::Relaxed) + left;
                self.left.store(left, Ordering::Relaxed);
                (self.shard.load(Ordering::Relaxed) + 1, Cursor::default())
            }
        };
        self.from.store(at.from, Ordering::Relaxed);
        self.layout.store(at.layout, Ordering::Relaxed);
        if shard < self.shards {
            self.shard.store(shard, Ordering::Relaxed);
            self.slices.store(slices, Ordering::Relaxed);
            if next.is_err() {
                self.repace(shard, slices);
            }
        } else {
            // The pass is over: pace the next one, a step per slice.
            let length = self.length.load(Ordering::Relaxed);
            let left = self.left.load(Ordering::Relaxed);
            let length = next_pass_length(length, left, &self.ghosts, self.floor);
            self.length.store(length, Ordering::Relaxed);
            self.shard.store(0, Ordering::Relaxed);
            self.left.store(0, Ordering::Relaxed);
            self.slices.store(0, Ordering::Relaxed);
            self.taken.store(0, Ordering::Relaxed);
            self.step_at
                .store((length / slices).max(1), Ordering::Relaxed);
        }
    }

    /// Paces the rest of a pass that has swept `done` shards in `slices`
    /// steps: the new keys it has left, spread over the slices the shards
    /// left will take if they are like the ones swept (at least one
    /// each). The first step of a pass is paced by the previous pass's
    /// slices; a map that grew since has more, and a pass paced by the old
    /// count alone would run over its length by as much: in a map filling
    /// with keys each seen once beside a million that come back
    /// (`benches/latency.rs`, 30 s), the steps came one every 162 new
    /// keys, where the passes asked for one every few dozen.
    fn repace(&self, done: usize, slices: usize) {
        // Relaxed: place fields, guarded by `sweeping` (see `position`);
        // `step_at` only paces (see `counted`).
        let length = self.length.load(Ordering::Relaxed);
        let taken = self.taken.load(Ordering::Relaxed);
        let expected = slices.saturating_mul(self.shards).div_ceil(done);
        let slices_left = expected.saturating_sub(slices).max(self.shards - done);
        let step_at = (length.saturating_sub(taken) / slices_left).max(1);
        self.step_at.store(step_at, Ordering::Relaxed);
    }

    fn let_go(&self) {
        // Release pairs with the Acquire in `take`.
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::SweepFlagRelaxed) {
            self.sweeping.store(false, Ordering::Relaxed);
            return;
        }
        self.sweeping.store(false, Ordering::Release);
    }

    /// Every step due from now on (for the unit tests: as if many keys
    /// had been made since the last one).
    #[cfg(test)]
    pub(crate) fn force_due(&self) {
        self.pressure.store(usize::MAX / 2, Ordering::Relaxed);
    }
}

/// The new keys the next pass is spread over, after a pass of `length`
/// that left `left` entries, ending the pass in `ghosts`: [`LONG_PASS`],
/// or [`LONG_GROWTH`] times `length` if more, while a good share of the
/// new keys are keys removed recently (the passes are then too short for
/// them: removing them only made them again), else three quarters of
/// `length`; at least `left /` [`LEFT_PER_NEW_KEY`] and `floor`.
///
/// Keys seen once never return, so under a stream of them passes shrink
/// to the floor and the map to three passes' worth; keys that come back
/// lengthen the passes until they are kept, however long their calls are
/// apart (up to a few hundred passes).
fn next_pass_length(length: usize, left: usize, ghosts: &Ghosts, floor: usize) -> usize {
    let (watched, returned) = ghosts.end_pass();
    let bar = if length < LONG_PASS {
        RETURNING_SHARE
    } else {
        LONG_RETURNING_SHARE
    };
    let next = if returned >= RETURNS_TO_GROW && returned.saturating_mul(bar) >= watched {
        length.saturating_mul(LONG_GROWTH).max(LONG_PASS)
    } else {
        length - length / 4
    };
    next.max(left / LEFT_PER_NEW_KEY).max(floor)
}

#[cfg(all(test, not(loom)))]
mod tests;

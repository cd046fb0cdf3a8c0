//! The compound store's eviction: sweeps by hand, the automatic sweep's
//! steps, and room for a new key at the cap.
//!
//! # At the cap
//!
//! Each shard keeps, beside its lock, an instant before which none of its
//! cells can be full: the least `full_at` of its cells (the latest of a
//! cell's words), set when a sweep visits the shard and lowered when a
//! cell is made there. A word only rises (a spend moves `full_at` later,
//! a denial writes nothing, a lengthened copy keeps the words), so the
//! instant stays a true bound until the shard changes under its lock. A
//! call for a new key that finds the map full sweeps the one shard whose
//! bound is earliest, if that bound has come, and is refused if that
//! frees nothing ([`Store::make_room`]): a refusal costs a scan of the
//! shards' bounds and at most one shard's sweep (a call of several new
//! keys, one more for each cell it already holds, which it spares), never
//! a pass over the map, and a map whose buckets are all in use refuses
//! with no sweep at all until the first of them can be full. A bound
//! goes stale (too early) when its bucket is spent again: once that
//! instant has come, the next refusal sweeps the shard, finds nothing,
//! and sets the bound again.
//!
//! # The automatic sweep
//!
//! Unless turned off, a call that went through the map and finds enough
//! keys made since the last step sweeps one slice of a shard
//! ([`Store::step`]): [`SWEEP_SLICE`] of its table's buckets, after its
//! decision and with no lock held, the shards in turn, slice by slice
//! (one thread steps at a time; a call that finds a step running skips
//! it). A pass visits every shard once. A step removes only the buckets
//! that were already full when the previous pass started (a second
//! chance: a key called at least once a pass keeps its bucket). A pass
//! is spread over at least `SHARDS * MIN_STEP` new keys and half of
//! those the previous pass kept, a step every so many new keys for each
//! slice the previous pass took; it grows while the keys made are, in a
//! good share, keys it removed recently, and shrinks otherwise (the
//! in-memory limiter's rule, over the same ghosts of removed keys). So
//! the sweep costs a few cell visits per new key, a call pays for one
//! slice, never for a shard or the map (a shard at 10^6 keys is about
//! 15,000 cells: milliseconds, when their memory is cold; only a call
//! refused at the cap sweeps a shard, above), a flood of keys each called
//! once keeps about three passes of new keys (3,072 at the floor, while
//! every shard's table is one slice; tables do not shrink, and a pass
//! takes at least one new key a slice, so after a map of 10^6 keys, about
//! 8,000 slices, a flood keeps about three times that), and keys that
//! come back are kept. The slices of a shard gather its bound for room
//! at the cap as they go (the least `full_at` of the cells they keep and
//! of the cells made meanwhile) and set it when the shard's last slice
//! is done, as a whole shard's sweep does.

use super::{Slot, Store, SHARDS};
use crate::compound::cell::{Cell, Retired};
use crate::compound::decide;
use crate::gcra;
use crate::guard::Tally;
use crate::guard::Unwinding;
use crate::keyed::ghosts::Ghosts;
// Table buckets a step visits: the in-memory limiter's slice, a few
// hundred cells at most whatever the size of the shard (a whole shard at
// 10^6 keys is about 15,000 cells, milliseconds when their memory is cold).
pub(super) use crate::keyed::occupancy::SWEEP_SLICE;
use crate::keyed::occupancy::{next_pass_length, one_in};
use crate::store::Cursor;
use crate::sync::{unmodeled, Ordering};
use crate::time::Nanos;
use std::hash::{BuildHasher, Hash};
use std::ops::Deref;

/// No cells held: what a sweep spares when no call asks it to.
pub(crate) const NO_CELLS: &[Option<&Cell>] = &[];

/// The cells a call holds already, which a sweep that makes room for the
/// call's next key spares.
pub(crate) trait Held {
    /// How many cells.
    fn count(&self) -> usize;
    /// Whether `cell` is one of them.
    fn holds(&self, cell: &Cell) -> bool;
}

impl<C: Deref<Target = Cell>> Held for [Option<C>] {
    fn count(&self) -> usize {
        self.iter().flatten().count()
    }

    fn holds(&self, cell: &Cell) -> bool {
        self.iter()
            .flatten()
            .any(|held| held.address() == cell.address())
    }
}

/// The cells of both lists (a call's cells from a thread's cache, and
/// those from the map).
impl<A: Held + ?Sized, B: Held + ?Sized> Held for (&A, &B) {
    fn count(&self) -> usize {
        self.0.count() + self.1.count()
    }

    fn holds(&self, cell: &Cell) -> bool {
        self.0.holds(cell) || self.1.holds(cell)
    }
}

/// New keys a shard's share of the shortest pass: a pass is spread over
/// at least `SHARDS * MIN_STEP` new keys, and the first pass takes a step
/// every `MIN_STEP` of them.
const MIN_STEP: usize = 16;

/// Where the automatic sweep is and when it steps. Only paces the sweep:
/// `unmodeled` atomics, that loom's models (which never step, see
/// [`Store::step`]) do not explore.
pub(super) struct Pace {
    /// Keys made since the last step.
    pub(super) made: unmodeled::AtomicUsize,
    /// New keys between two steps (at least one): the pass's length over
    /// the previous pass's slices.
    every: unmodeled::AtomicUsize,
    /// Set while a step runs, so that one thread steps at a time; it
    /// guards the fields below. A call that finds it set skips the step.
    sweeping: unmodeled::AtomicBool,
    /// The shard the next step visits, and where in it (a slice of
    /// [`SWEEP_SLICE`] table buckets a step).
    shard: unmodeled::AtomicUsize,
    from: unmodeled::AtomicUsize,
    layout: unmodeled::AtomicU64,
    /// Steps taken so far in this pass.
    slices: unmodeled::AtomicUsize,
    /// The new keys this pass is spread over.
    length: unmodeled::AtomicUsize,
    /// Keys the shards swept so far in this pass kept.
    kept: unmodeled::AtomicUsize,
    /// The timestamp of the step that started this pass.
    started: unmodeled::AtomicU64,
    /// The timestamp of the step that started the previous pass: a step
    /// removes only buckets full since then.
    idle_since: unmodeled::AtomicU64,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            made: unmodeled::AtomicUsize::new(0),
            every: unmodeled::AtomicUsize::new(MIN_STEP),
            sweeping: unmodeled::AtomicBool::new(false),
            shard: unmodeled::AtomicUsize::new(0),
            from: unmodeled::AtomicUsize::new(0),
            layout: unmodeled::AtomicU64::new(0),
            slices: unmodeled::AtomicUsize::new(0),
            length: unmodeled::AtomicUsize::new(SHARDS * MIN_STEP),
            kept: unmodeled::AtomicUsize::new(0),
            started: unmodeled::AtomicU64::new(0),
            idle_since: unmodeled::AtomicU64::new(0),
        }
    }
}

impl<K: Hash + Eq, S: BuildHasher + Clone> Store<K, S> {
    /// One step of the automatic sweep at `now`, if one is due (see the
    /// module docs): sweeps the next slice of the shards, in turn, of the
    /// buckets that were already full when the previous pass started. The
    /// caller holds no lock (a shard's, then its cells', are taken here).
    /// Returns how many keys it removed.
    ///
    /// Under loom, never: the models sweep by hand, and `sweep_cells` is
    /// the code both run.
    #[inline]
    pub(crate) fn step(&self, now: Nanos) -> usize {
        if cfg!(loom) {
            return 0;
        }
        let pace = &self.pace;
        // At least one new key a slice: a pass of the floor's length over
        // tables that grew large (they do not shrink) takes a step per new
        // key, never fewer.
        let every = pace.every.load(unmodeled::Relaxed).max(1);
        // Relaxed: these counts pace the sweep and order nothing (what is
        // removed is decided under the locks). Of two calls that find a
        // step due, the one whose swap takes the count runs it.
        if pace.made.load(unmodeled::Relaxed) < every {
            return 0;
        }
        let made = pace.made.swap(0, unmodeled::Relaxed);
        if made < every {
            // Another call took the count: give back what came since.
            pace.made.fetch_add(made, unmodeled::Relaxed);
            return 0;
        }
        self.take_step(now, made)
    }

    /// The step [`step`](Self::step) found due, for `made` new keys,
    /// unless another thread's step is running (the count is then given
    /// back, for the step after it). Out of line: most calls take none.
    #[inline(never)]
    fn take_step(&self, now: Nanos, made: usize) -> usize {
        let pace = &self.pace;
        // Acquire pairs with the Release below: this step sees the place
        // the previous one left.
        if pace.sweeping.swap(true, unmodeled::Ordering::Acquire) {
            pace.made.fetch_add(made, unmodeled::Relaxed);
            return 0;
        }
        // Let go even if a key's `Drop` or `Hash` unwinds in the sweep.
        let _taken = Unwinding::new(|| pace.sweeping.store(false, unmodeled::Ordering::Release));
        // Relaxed from here on: the flag orders the steps one after another.
        let shard = pace.shard.load(unmodeled::Relaxed);
        // This step is one more slice of the pass, counted before the
        // sweep, so that a slice that unwinds does not start the pass
        // again (which would move the second chance's bound).
        let slices = pace.slices.load(unmodeled::Relaxed) + 1;
        pace.slices.store(slices, unmodeled::Relaxed);
        if shard == 0 && slices == 1 {
            // A pass starts: the previous one's start is now the bound.
            let previous = pace.started.swap(now.as_u64(), unmodeled::Relaxed);
            pace.idle_since.store(previous, unmodeled::Relaxed);
        }
        // Never above `now`: what goes is full at `now`, so the sweep stays
        // exact even when timestamps run backwards.
        let bound = Nanos::new(pace.idle_since.load(unmodeled::Relaxed)).min(now);
        let at = Cursor {
            from: pace.from.load(unmodeled::Relaxed),
            layout: pace.layout.load(unmodeled::Relaxed),
        };
        // A slice that unwinds (a key's `Drop` or `Hash` panics) is not
        // swept again and again: the next step starts past it.
        let past = Unwinding::new(|| {
            let from = at.from.saturating_add(SWEEP_SLICE);
            pace.from.store(from, unmodeled::Relaxed);
        });
        let (removed, next) = self.sweep_cells(shard, bound, NO_CELLS, Some(at));
        past.defuse();
        let at = match next {
            Ok(at) => at,
            Err(kept) => {
                let kept = pace.kept.fetch_add(kept, unmodeled::Relaxed) + kept;
                if shard + 1 < self.shards.len() {
                    pace.shard.store(shard + 1, unmodeled::Relaxed);
                } else {
                    // The pass is over: pace the next one, a step a slice.
                    let length = self.next_pass(pace.length.load(unmodeled::Relaxed), kept);
                    pace.length.store(length, unmodeled::Relaxed);
                    pace.every.store(length / slices, unmodeled::Relaxed);
                    pace.kept.store(0, unmodeled::Relaxed);
                    pace.shard.store(0, unmodeled::Relaxed);
                    pace.slices.store(0, unmodeled::Relaxed);
                }
                Cursor::default()
            }
        };
        pace.from.store(at.from, unmodeled::Relaxed);
        pace.layout.store(at.layout, unmodeled::Relaxed);
        removed
    }

    /// The new keys the next pass is spread over, after a pass of
    /// `length` that kept `kept` keys: the in-memory limiter's rule
    /// ([`next_pass_length`]) over this store's ghosts, with a floor of
    /// `SHARDS * MIN_STEP`. Keys seen once shrink the passes to the floor;
    /// keys that come back lengthen them until they are kept.
    fn next_pass(&self, length: usize, kept: usize) -> usize {
        next_pass_length(length, kept, &self.ghosts, self.shards.len() * MIN_STEP)
    }

    /// Sweeps every shard at `now` (a caller's `sweep`).
    pub(crate) fn sweep(&self, now: Nanos) -> usize {
        (0..self.shards.len())
            .map(|shard| self.sweep_shard(shard, now, NO_CELLS))
            .sum()
    }

    /// Room for a new key when the map holds `max_keys` (see "At the
    /// cap" in the module docs): sweeps the shard whose cells can be full
    /// soonest, if that is by `now`; returns whether that removed any.
    ///
    /// `spare` are the cells the calling call already holds (a call of
    /// several scopes takes its keys' cells one after another): they stay,
    /// full or not, or the call would remove its own new key's cell to
    /// make room for its next one, and again the other way round, for
    /// ever. Each may keep its shard's bound at its own, so the call
    /// sweeps up to one shard more than it spares, in the order of their
    /// bounds.
    pub(crate) fn make_room<H: Held + ?Sized>(&self, now: Nanos, spare: &H) -> bool {
        let mut swept = [false; SHARDS];
        for _ in 0..=spare.count() {
            // Relaxed: a hint (see `Shard::full_from`).
            let earliest = self
                .shards
                .iter()
                .enumerate()
                .filter(|&(i, _)| !swept[i])
                .map(|(i, shard)| (shard.full_from.load(unmodeled::Relaxed), i))
                .min();
            let Some((_, shard)) = earliest.filter(|&(from, _)| Nanos::new(from) <= now) else {
                return false;
            };
            swept[shard] = true;
            #[cfg(loom)]
            if crate::flaw::flawed(crate::flaw::Flaw::CompoundRoomTrustsBound) {
                // BROKEN (a model's twin): every cell taken for full.
                return self.sweep_shard(shard, Nanos::new(u64::MAX), spare) > 0;
            }
            if self.sweep_shard(shard, now, spare) > 0 {
                return true;
            }
        }
        false
    }

    /// Removes shard `shard`'s cells that are full at `now` (see the
    /// module docs), but not those in `spare`; returns how many it removed.
    fn sweep_shard<H: Held + ?Sized>(&self, shard: usize, now: Nanos, spare: &H) -> usize {
        #[cfg(test)]
        self.shard_sweeps.fetch_add(1, Ordering::Relaxed);
        self.sweep_cells(shard, now, spare, None).0
    }

    /// Removes shard `shard`'s cells that are full at `now`, but not those
    /// in `spare`: all of the shard's (`slice` is `None`), or the next
    /// [`SWEEP_SLICE`] table buckets from `slice` (from the shard's start
    /// if its table's layout changed since). Returns how many it removed,
    /// and where the next slice starts, or, when this one finished the
    /// shard, the cells the shard then holds.
    fn sweep_cells<H: Held + ?Sized>(
        &self,
        shard: usize,
        now: Nanos,
        spare: &H,
        slice: Option<Cursor>,
    ) -> (usize, Result<Cursor, usize>) {
        let shard = &self.shards[shard];
        let mut map = shard.map.lock();
        let (ghosts, hasher) = (&self.ghosts, &self.hasher);
        // The least `full_at` of the cells kept.
        let mut full_from = u64::MAX;
        // Counted as they go, and their places given back even if a key's
        // `Drop` or `Hash` panics halfway (the cells removed by then are
        // gone). Relaxed: as in `reserve`.
        let removed = Tally::new(|n| {
            self.len.fetch_sub(n, Ordering::Relaxed);
        });
        let keep = |(key, slot): &mut (K, Slot)| {
            let slot: &Slot = slot;
            // An inline cell's words are the shard lock's; a shared cell
            // is locked, so that it is retired in the same step as it
            // leaves the map.
            let (full_at, mut locked) = match slot {
                Slot::Inline(words) => (decide::full_at(&words.get()), None),
                Slot::Shared(cell) => match cell.lock() {
                    Ok(locked) => (decide::full_at(&locked.words), Some(locked)),
                    // Cells in the map are never retired (both happen
                    // under the shard's lock).
                    Err(Retired) => {
                        removed.add(true);
                        return false;
                    }
                },
            };
            let spared = || match slot {
                Slot::Shared(cell) => spare.holds(cell),
                // A call holds only shared cells.
                Slot::Inline(_) => false,
            };
            let full = gcra::is_full(full_at, now) && !spared();
            if full {
                // Hashed before the cell is retired: a key's `Hash` that
                // panics leaves its cell live and in the map, not retired
                // there (every later call on the key would find it dead).
                let sampled = Ghosts::sampled(one_in).then(|| hasher.hash_one(key));
                removed.add(true);
                if let Some(locked) = &mut locked {
                    locked.retire();
                }
                if let Some(hash) = sampled {
                    ghosts.evicted(hash);
                }
            } else {
                full_from = full_from.min(full_at.as_u64());
            }
            !full
        };
        let next = match slice {
            None => {
                map.retain(keep);
                // Relaxed: a hint (see `Shard::full_from`), written under
                // the lock.
                shard.full_from.store(full_from, unmodeled::Relaxed);
                Err(map.len())
            }
            Some(at) => {
                if at.from == 0 || map.layout() != at.layout {
                    // The shard's first slice, or its table's buckets moved
                    // since the last (the slice starts the shard over): the
                    // bound its slices gather starts over (new keys lower
                    // it meanwhile, see `with_cell`).
                    shard.slices_from.store(u64::MAX, unmodeled::Relaxed);
                }
                let next = map.retain_slice(at, SWEEP_SLICE, keep);
                // Relaxed: hints, written under the lock (see
                // `Shard::slices_from`).
                shard.slices_from.fetch_min(full_from, unmodeled::Relaxed);
                if next.is_err() {
                    // Every cell counted: the bound is exact again, as
                    // after a whole shard's sweep.
                    let bound = shard.slices_from.load(unmodeled::Relaxed);
                    shard.full_from.store(bound, unmodeled::Relaxed);
                }
                next
            }
        };
        drop(map);
        (removed.settle(), next)
    }
}

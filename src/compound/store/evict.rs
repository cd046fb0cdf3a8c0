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
//! Unless turned off, the in-memory limiter's sweep machine
//! ([`Pace`](crate::pace::Pace), the same code): a call that finds a step
//! due (new keys counted, by sample, as they are made) sweeps one slice of a
//! shard ([`Store::step`]): [`SWEEP_SLICE`] of its table's buckets, after
//! its decision and with no lock held, the shards in turn, slice by slice
//! (one thread steps at a time; a call that finds a step running skips
//! it). A step removes only the cells that were already full when the
//! previous pass started (a second chance: a key called at least once a
//! pass keeps its cell). A pass is spread over at least `SHARDS *
//! MIN_STEP` new keys (the in-memory limiter's floor is 8,192) and half
//! of those the previous pass kept; it grows while the keys made are, in
//! a good share, keys it removed recently, and shrinks otherwise. So the
//! sweep costs a few cell visits per new key, a call pays for one slice,
//! never for a shard or the map (a shard at 10^6 keys is about 15,000
//! cells: milliseconds, when their memory is cold; only a call refused at
//! the cap sweeps a shard, above), a flood of keys each called once keeps
//! about three passes of new keys (3,072 at the floor, while every
//! shard's table is one slice; a pass takes at least one new key a
//! slice, so while the tables of a map of 10^6 keys, about 8,000 slices,
//! are that large, a flood keeps about three times that, until the
//! sweep has thinned them out and they shrink, a step at a time, see
//! `store::Table`), and keys that
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
use crate::pace::ghosts::Ghosts;
use crate::pace::{one_in, SWEEP_SLICE};
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
pub(super) const MIN_STEP: usize = 16;

impl<K: Hash + Eq, S: BuildHasher + Clone> Store<K, S> {
    /// One step of the automatic sweep at `now`, if one is due (see the
    /// module docs): sweeps the next slice of the shards, in turn, of the
    /// cells that were already full when the previous pass started. The
    /// caller holds no lock (a shard's, then its cells', are taken here).
    /// Returns how many keys it removed.
    ///
    /// Under loom, never: the models sweep by hand, and `sweep_cells` is
    /// the code both run (the pace's protocol is model 9's, over the
    /// in-memory limiter).
    #[inline]
    pub(crate) fn step(&self, now: Nanos) -> usize {
        if cfg!(loom) || !self.pace.due() {
            return 0;
        }
        self.take_step(now)
    }

    /// The step [`step`](Self::step) found due, unless another thread's
    /// step is running. Out of line: most calls take none.
    #[inline(never)]
    fn take_step(&self, now: Nanos) -> usize {
        let pace = &self.pace;
        if !pace.take() {
            return 0;
        }
        let step = pace.position(now);
        // A slice that unwinds (a key's `Drop` or `Hash` panics) lets the
        // step go, and the next step starts at the next shard (the rest
        // of this one, and its bound for room at the cap, wait for the
        // next pass).
        let abandoned = Unwinding::new(|| pace.abandoned());
        let (removed, next) = self.sweep_cells(step.shard, step.full_at, NO_CELLS, Some(step.at));
        abandoned.defuse();
        pace.stepped(next);
        removed
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
        let (ghosts, hasher) = (&self.pace.ghosts, &self.hasher);
        // The least `full_at` of the cells kept.
        let mut full_from = u64::MAX;
        // The latest `full_at` of the cells removed, kept for their keys'
        // return (see `Pace::restart`), under the shard's lock.
        let mut recorded = self.pace.restart();
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
                // Kept only on one timeline (see the keyed limiter's
                // `evict`): with the automatic sweep on.
                if self.auto_sweep {
                    self.pace.removed(full_at, &mut recorded);
                }
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

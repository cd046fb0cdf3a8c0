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
//! keys made since the last step sweeps one shard ([`Store::step`]),
//! after its decision and with no lock held, the shards in turn: a pass
//! visits each once. A step removes only the buckets that were already
//! full when the previous pass started (a second chance: a key called at
//! least once a pass keeps its bucket). A pass is spread over at least
//! `SHARDS * MIN_STEP` new keys and half of those the previous pass
//! kept; it grows while the keys made are, in a good share, keys it
//! removed recently, and shrinks otherwise (the in-memory limiter's rule,
//! over the same ghosts of removed keys). So the sweep costs a few cell
//! visits per new key, a call pays for one shard, never for the map, a
//! flood of keys each called once keeps about three passes of new keys
//! (3,072 at the floor), and keys that come back are kept.

use super::{Slot, Store, SHARDS};
use crate::compound::cell::{Cell, Retired};
use crate::compound::decide;
use crate::gcra;
use crate::guard::Tally;
use crate::keyed::ghosts::Ghosts;
use crate::keyed::occupancy::{next_pass_length, one_in};
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

/// The fewest new keys between two steps of the automatic sweep.
const MIN_STEP: usize = 16;

/// Where the automatic sweep is and when it steps. Only paces the sweep:
/// `unmodeled` atomics, that loom's models (which never step, see
/// [`Store::step`]) do not explore.
#[derive(Default)]
pub(super) struct Pace {
    /// Keys made since the last step.
    pub(super) made: unmodeled::AtomicUsize,
    /// New keys between two steps, before the floor [`MIN_STEP`]: a
    /// shard's share of the pass's length (see [`Store::next_pass`]).
    every: unmodeled::AtomicUsize,
    /// The shard the next step visits (wrapping).
    cursor: unmodeled::AtomicUsize,
    /// Keys kept by this pass's steps so far.
    kept: unmodeled::AtomicUsize,
    /// The timestamp of the step that started this pass.
    started: unmodeled::AtomicU64,
    /// The timestamp of the step that started the previous pass: a step
    /// removes only buckets full since then.
    idle_since: unmodeled::AtomicU64,
}

impl<K: Hash + Eq, S: BuildHasher + Clone> Store<K, S> {
    /// One step of the automatic sweep at `now`, if one is due (see the
    /// module docs): sweeps the next shard of the buckets that were
    /// already full when the previous pass started. The caller holds no
    /// lock (a shard's, then its cells', are taken here). Returns how many
    /// keys it removed.
    ///
    /// Under loom, never: the models sweep by hand, and `sweep_shard` is
    /// the code both run.
    #[inline]
    pub(crate) fn step(&self, now: Nanos) -> usize {
        if cfg!(loom) {
            return 0;
        }
        let pace = &self.pace;
        let every = pace.every.load(unmodeled::Relaxed).max(MIN_STEP);
        // Relaxed, here and below: these counts pace the sweep and order
        // nothing (what is removed is decided under the locks). Of two
        // calls that find a step due, the one whose swap takes the count
        // runs it.
        if pace.made.load(unmodeled::Relaxed) < every
            || pace.made.swap(0, unmodeled::Relaxed) < every
        {
            return 0;
        }
        let shards = self.shards.len();
        let shard = pace.cursor.fetch_add(1, unmodeled::Relaxed) % shards;
        if shard == 0 {
            // A pass starts: the previous one's start is now the bound, and
            // the pass it ended paces this one.
            let previous = pace.started.swap(now.as_u64(), unmodeled::Relaxed);
            pace.idle_since.store(previous, unmodeled::Relaxed);
            let length = self.next_pass(every * shards, pace.kept.swap(0, unmodeled::Relaxed));
            pace.every.store(length / shards, unmodeled::Relaxed);
        }
        // Never above `now`: what goes is full at `now`, so the sweep stays
        // exact even when timestamps run backwards.
        let bound = Nanos::new(pace.idle_since.load(unmodeled::Relaxed)).min(now);
        let (removed, kept) = self.sweep_shard(shard, bound, NO_CELLS);
        pace.kept.fetch_add(kept, unmodeled::Relaxed);
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
            .map(|shard| self.sweep_shard(shard, now, NO_CELLS).0)
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
                return self.sweep_shard(shard, Nanos::new(u64::MAX), spare).0 > 0;
            }
            if self.sweep_shard(shard, now, spare).0 > 0 {
                return true;
            }
        }
        false
    }

    /// Removes shard `shard`'s cells that are full at `now` (see the
    /// module docs), but not those in `spare`; returns how many it removed
    /// and how many it kept.
    fn sweep_shard<H: Held + ?Sized>(&self, shard: usize, now: Nanos, spare: &H) -> (usize, usize) {
        #[cfg(test)]
        self.shard_sweeps.fetch_add(1, Ordering::Relaxed);
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
        map.retain(|(key, slot)| {
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
        });
        // Relaxed: a hint (see `Shard::full_from`), written under the lock.
        shard.full_from.store(full_from, unmodeled::Relaxed);
        let kept = map.len();
        drop(map);
        (removed.settle(), kept)
    }
}

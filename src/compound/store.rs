//! The compound limiter's keyed store: each key's compound bucket behind
//! an `Arc`, in shards of plain hash maps, each behind a small lock.
//!
//! Not `crate::store::Map`: that map keeps one bucket word inline per
//! entry and retires evicted words with a marker that spends check; a
//! compound bucket is several words under a lock, and the simplest exact
//! eviction rule for it is the one below, which needs the `Arc` itself.
//!
//! # Eviction
//!
//! The sweep, under a shard's lock, locks each of its cells and, when
//! every word is full, marks the cell retired and removes it, in that one
//! step. A call that holds the cell (a thread's cache of hot cells, or a
//! call of several scopes that cloned its `Arc` from the map) then finds
//! it retired when it locks or reads it, spends nothing on it, and goes
//! back to the map, where a missing bucket is a full one: so no spend can
//! land on a removed bucket, and a full bucket dropped is the same as a
//! new one. A retired cell lives on only in the caches that still hold
//! it, a few per thread (see `hot.rs`). Lock order: a shard's lock, then a
//! cell's, never the other way (a call of one key holds both while it
//! decides through the map; a call of several holds cell locks only).
//!
//! A cell holds as many words as the policy that made it has quotas; a
//! call whose policy has more finds it too short, and the map replaces it
//! (under the shard's lock) by a longer copy, retiring the old one.
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
//! `SHARDS * MIN_STEP` new keys and a quarter of those the previous pass
//! kept; it grows while the keys made are, in a good share, keys it
//! removed recently, and shrinks otherwise (the in-memory limiter's rule,
//! over the same ghosts of removed keys). So the sweep costs a few cell
//! visits per new key, a call pays for one shard, never for the map, a
//! flood of keys each called once keeps about three passes of new keys
//! (3,072 at the floor), and keys that come back are kept.

use super::cell::{Cell, Retired};
use super::decide;
#[cfg(loom)]
use super::policy::MAX_QUOTAS;
use crate::gcra;
use crate::keyed::ghosts::Ghosts;
use crate::keyed::occupancy::{next_pass_length, one_in};
use crate::sync::{unmodeled, Arc, AtomicUsize, Lock, Ordering};
use crate::time::Nanos;
use hashbrown::HashTable;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// Shards of the map: a few per core is enough to keep the locks, held
/// for one hash lookup, uncontended. One under loom: a small model.
#[cfg(not(loom))]
const SHARDS: usize = 64;
#[cfg(loom)]
const SHARDS: usize = 1;

/// The fewest new keys between two steps of the automatic sweep.
const MIN_STEP: usize = 16;

/// One shard: its keys and their cells, placed by the store's hash (a
/// table, not a map, so that a call hashes its key once, for its shard,
/// its place here and a thread's cache).
struct Shard<K> {
    map: Lock<HashTable<(K, Arc<Cell>)>>,
    /// No cell of `map` is full before this instant (`Nanos` as `u64`;
    /// `u64::MAX` while the shard is empty). Written under `map`'s lock,
    /// read without it by [`Store::make_room`], for which it is a hint:
    /// it orders nothing, and a stale read only sends a refused call to
    /// another shard or refuses it.
    full_from: unmodeled::AtomicU64,
}

impl<K> Shard<K> {
    fn new() -> Self {
        Shard {
            map: Lock::new(HashTable::new()),
            full_from: unmodeled::AtomicU64::new(u64::MAX),
        }
    }
}

/// A new key could not be stored: the map holds `max_keys`.
#[derive(Debug)]
pub(crate) struct Full;

/// A place under the cap, reserved for a new entry: given back on drop
/// unless [`taken`](Self::taken), so that a panic between the reservation
/// and the insertion (a key's `Clone` or `Hash`) leaks no place.
struct Place<'a>(&'a AtomicUsize);

impl Place<'_> {
    /// The entry is in the map: the place is its own now.
    fn taken(self) {
        std::mem::forget(self);
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        // Relaxed: as in `reserve`.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) struct Store<K, S> {
    hasher: S,
    shards: Box<[Shard<K>]>,
    /// Entries over all shards. Changed under the entry's shard lock, read
    /// by the cap's reservation; it publishes nothing (see `reserve`).
    len: AtomicUsize,
    /// The most entries the map holds.
    max_keys: usize,
    /// Whether calls run the automatic sweep's steps.
    auto_sweep: bool,
    /// The automatic sweep's pace and place.
    pace: Pace,
    /// A sample of the keys the automatic sweep removed, to tell keys
    /// that come back from keys seen once (see `next_pass`).
    ghosts: Ghosts,
    /// Shards swept so far (for the unit tests).
    #[cfg(test)]
    shard_sweeps: AtomicUsize,
}

/// Where the automatic sweep is and when it steps. Only paces the sweep:
/// `unmodeled` atomics, that loom's models (which never step, see
/// [`Store::step`]) do not explore.
#[derive(Default)]
struct Pace {
    /// Keys made since the last step.
    made: unmodeled::AtomicUsize,
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
    pub(crate) fn new(hasher: S) -> Self {
        let shards = (0..SHARDS).map(|_| Shard::new()).collect();
        Store {
            hasher,
            shards,
            len: AtomicUsize::new(0),
            max_keys: usize::MAX,
            auto_sweep: true,
            pace: Pace::default(),
            ghosts: Ghosts::new(),
            #[cfg(test)]
            shard_sweeps: AtomicUsize::new(0),
        }
    }

    pub(crate) fn set_auto_sweep(&mut self, on: bool) {
        self.auto_sweep = on;
    }

    pub(crate) fn set_max_keys(&mut self, max_keys: usize) {
        self.max_keys = max_keys;
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys
    }

    pub(crate) fn len(&self) -> usize {
        // Relaxed: a count for reports; it orders nothing.
        self.len.load(Ordering::Relaxed)
    }

    /// The key's hash: its shard, and its place in a thread's cache.
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    // Under loom, one shard: every key is in it.
    #[cfg_attr(loom, allow(clippy::modulo_one))]
    fn shard(&self, hash: u64) -> &Shard<K> {
        // Bits hashbrown does not use for its own tags or low bucket bits;
        // `SHARDS`, a constant power of two, makes the remainder a mask.
        &self.shards[((hash >> 32) as usize) % SHARDS]
    }

    /// The key's cell, if it has one.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<Arc<Cell>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let shard = self.shard(hash).map.lock();
        let entry = shard.find(hash, |(k, _)| k.borrow() == key)?;
        Some(Arc::clone(&entry.1))
    }

    /// Runs `f` on the key's cell of at least `len` words (whose hash is
    /// `hash`), made full or lengthened if need be (unless the map holds
    /// `max_keys` entries), under its shard's lock: no sweep can retire
    /// the cell meanwhile. `f` may lock the cell (the one lock order: a
    /// call of several keys holds cell locks only, and takes no shard
    /// lock meanwhile).
    pub(crate) fn with_cell<Q, T>(
        &self,
        hash: u64,
        key: &Q,
        len: usize,
        f: impl FnOnce(&Arc<Cell>) -> T,
    ) -> Result<T, Full>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shard = self.shard(hash);
        let mut map = shard.map.lock();
        if let Some((_, cell)) = map.find_mut(hash, |(k, _)| k.borrow() == key) {
            if cell.len() < len {
                *cell = lengthened(cell, len);
            }
            return Ok(f(cell));
        }
        let place = self.reserve()?;
        if self.auto_sweep {
            self.ghosts.created(hash);
        }
        let cell = Cell::new(len);
        let result = f(&cell);
        // The new cell is not shared yet: its read sees what `f` wrote.
        // Relaxed: a hint (see `Shard::full_from`), written under the lock.
        let full_at = cell
            .read()
            .ok()
            .flatten()
            .map_or(Nanos::ZERO, |w| decide::full_at(&w));
        shard
            .full_from
            .fetch_min(full_at.as_u64(), unmodeled::Relaxed);
        let hasher = &self.hasher;
        map.insert_unique(hash, (key.to_owned(), cell), |(k, _)| hasher.hash_one(k));
        place.taken();
        Ok(result)
    }

    /// Takes a place under the cap for a new entry: given back when the
    /// [`Place`] is dropped, unless the entry took it.
    fn reserve(&self) -> Result<Place<'_>, Full> {
        // Relaxed: the count guards only itself (one read-modify-write
        // decides, so two inserts cannot both take the last place); the
        // entry is published by its shard's lock, not by this counter.
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |len| {
                (len < self.max_keys).then_some(len + 1)
            })
            .map_err(|_| Full)?;
        if self.auto_sweep {
            // Relaxed: only paces the automatic sweep (see `step`).
            self.pace.made.fetch_add(1, unmodeled::Relaxed);
        }
        Ok(Place(&self.len))
    }

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
        let (removed, kept) = self.sweep_shard(shard, bound, &[]);
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
            .map(|shard| self.sweep_shard(shard, now, &[]).0)
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
    pub(crate) fn make_room(&self, now: Nanos, spare: &[Option<Arc<Cell>>]) -> bool {
        let mut swept = [false; SHARDS];
        for _ in 0..=spare.len() {
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
    fn sweep_shard(&self, shard: usize, now: Nanos, spare: &[Option<Arc<Cell>>]) -> (usize, usize) {
        #[cfg(test)]
        self.shard_sweeps.fetch_add(1, Ordering::Relaxed);
        let shard = &self.shards[shard];
        let mut map = shard.map.lock();
        let before = map.len();
        let (ghosts, hasher) = (&self.ghosts, &self.hasher);
        // The least `full_at` of the cells kept.
        let mut full_from = u64::MAX;
        map.retain(|(key, cell)| match cell.lock() {
            Ok(mut locked) => {
                let full_at = decide::full_at(&locked.words);
                let spared = || spare.iter().flatten().any(|held| Arc::ptr_eq(held, cell));
                let full = gcra::is_full(full_at, now) && !spared();
                if full {
                    locked.retire();
                    if Ghosts::sampled(one_in) {
                        ghosts.evicted(hasher.hash_one(key));
                    }
                } else {
                    full_from = full_from.min(full_at.as_u64());
                }
                !full
            }
            // Cells in the map are never retired (both happen under
            // the shard's lock).
            Err(Retired) => false,
        });
        // Relaxed: a hint (see `Shard::full_from`), written under the lock.
        shard.full_from.store(full_from, unmodeled::Relaxed);
        let kept = map.len();
        drop(map);
        // Relaxed: as in `reserve`.
        self.len.fetch_sub(before - kept, Ordering::Relaxed);
        (before - kept, kept)
    }

    /// The words of the key's cell, if it has one (for the loom models).
    #[cfg(loom)]
    pub(crate) fn words<Q>(&self, key: &Q) -> Option<[u64; MAX_QUOTAS]>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key)
            .and_then(|cell| Some(cell.lock().ok()?.words.map(Nanos::as_u64)))
    }
}

/// A copy of `cell` of `len` words, the rest full; `cell` is retired
/// (its holders go back to the map, and find the copy).
fn lengthened(cell: &Cell, len: usize) -> Arc<Cell> {
    let longer = Cell::new(len);
    // Neither can be retired: `cell` is in the map, under its shard's
    // lock, and `longer` is new.
    if let (Ok(mut old), Ok(mut new)) = (cell.lock(), longer.lock()) {
        new.words = old.words;
        new.commit();
        old.retire();
    }
    longer
}

#[cfg(all(test, not(loom)))]
mod tests;

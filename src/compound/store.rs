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
//! Eviction, the automatic sweep and room at the cap: `evict`.

use super::cell::Cell;
use super::decide;
#[cfg(loom)]
use super::policy::MAX_QUOTAS;
use crate::guard::Unwinding;
use crate::keyed::ghosts::Ghosts;
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
        place.defuse();
        Ok(result)
    }

    /// Takes a place under the cap for a new entry: given back when the
    /// guard is dropped, unless the entry took it first (`defuse`), so that
    /// a panic between the two (a key's `Clone` or `Hash`) leaks no place.
    fn reserve(&self) -> Result<Unwinding<impl FnOnce() + '_>, Full> {
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
        Ok(Unwinding::new(|| {
            // Relaxed: as above.
            self.len.fetch_sub(1, Ordering::Relaxed);
        }))
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

mod evict;

use evict::Pace;

#[cfg(all(test, not(loom)))]
mod tests;

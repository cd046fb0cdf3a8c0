//! The compound limiter's keyed store: each key's compound bucket in
//! shards of plain hash maps, each behind a small lock; its words inline
//! in the key's entry, or in a cell behind an `Arc`.
//!
//! Not `crate::store::Map`: that map keeps one bucket word per entry and
//! retires evicted words with a marker that spends check; a compound
//! bucket is several words decided together, and the simplest exact
//! eviction rule for it is the one below.
//!
//! # Inline and shared cells
//!
//! A key whose policies have at most [`INLINE_WORDS`] quotas keeps its
//! words in its map entry ([`Slot::Inline`]): they are read and written
//! only under the shard's lock, so a call through the map decides on
//! them with no other lock, no allocation, and no memory read beyond the
//! entry and its key. A key needs its words where other calls can reach
//! them without the shard's lock when a thread caches it (`hot.rs`), when
//! a call of several scopes charges it (it locks its keys' cells, not
//! their shards), or when a policy has more quotas than fit: its words
//! then move, under the shard's lock, into a cell behind an `Arc`
//! ([`Slot::Shared`]), for as long as that bucket lives. Nothing held an
//! inline cell's words, so the move loses no spend.
//!
//! The entry is 40 bytes (a 24-byte `String` key and a 16-byte slot)
//! where a single-quota limiter's is 32: the slot needs no tag of its
//! own (see [`InlineWords`]). A shared cell adds its own allocation (two
//! counts, the state word, the words).
//!
//! # Eviction
//!
//! The sweep, under a shard's lock, removes each inline cell whose words
//! are all full, and locks each shared cell and, when every word is
//! full, marks it retired and removes it, in that one step. A call that
//! holds a shared cell (a thread's cache of hot cells, or a call of
//! several scopes that cloned its `Arc` from the map) then finds it
//! retired when it locks or reads it, spends nothing on it, and goes back
//! to the map, where a missing bucket is a full one: so no spend can land
//! on a removed bucket, and a full bucket dropped is the same as a new
//! one. A retired cell lives on only in the caches that still hold it, a
//! few per thread (see `hot.rs`). Lock order: a shard's lock, then a
//! cell's, never the other way (a call of one key holds both while it
//! decides through the map on a shared cell; a call of several holds
//! cell locks only).
//!
//! A shared cell holds as many words as the policy that made it has
//! quotas (at least [`INLINE_WORDS`] if it was inline); a call whose
//! policy has more finds it too short, and the map replaces it (under
//! the shard's lock) by a longer copy, retiring the old one.
//!
//! Eviction, the automatic sweep and room at the cap: `evict`.

use super::decide::{self, Words};
use super::policy::MAX_QUOTAS;
use crate::guard::Unwinding;
use crate::store::Table;
use crate::sync::{unmodeled, AtomicUsize, Lock, Ordering};
#[cfg(loom)]
use crate::time::Nanos;
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
/// its place here and a thread's cache). The in-memory limiter's table,
/// which grows a few entries per insertion, never in one whole-shard
/// rehash, and which the automatic sweep visits a slice at a time.
/// Insertions alone empty a table set aside by growth: every call holds
/// its shard's lock, so moves made by updates too would keep the calls
/// behind them waiting (live keys' p99.9 at 10^6 keys, 2 threads: 4.7-6.8
/// µs without them, 19.6-32.5 with, `benches/latency.rs`).
struct Shard<K> {
    map: Lock<Table<(K, Slot)>>,
    /// No cell of `map` is full before this instant (`Nanos` as `u64`;
    /// `u64::MAX` while the shard is empty). Written under `map`'s lock,
    /// read without it by [`Store::make_room`], for which it is a hint:
    /// it orders nothing, and a stale read only sends a refused call to
    /// another shard or refuses it.
    full_from: unmodeled::AtomicU64,
    /// The same bound as the automatic sweep's slices gather it: the
    /// least `full_at` of the cells its slices of this shard kept so far,
    /// and of the cells made since its first slice. When the last slice
    /// has counted every cell, it becomes `full_from`, which slices that
    /// removed cells would otherwise leave early for ever (sending refused
    /// calls at the cap to sweep shards with nothing full). Written under
    /// `map`'s lock.
    slices_from: unmodeled::AtomicU64,
}

impl<K> Shard<K> {
    fn new() -> Self {
        Shard {
            map: Lock::new(Table::default()),
            full_from: unmodeled::AtomicU64::new(u64::MAX),
            slices_from: unmodeled::AtomicU64::new(u64::MAX),
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
    /// The automatic sweep's pace and place, and a sample of the keys it
    /// removed (to tell keys that come back from keys seen once).
    pace: Pace,
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
            pace: Pace::new(SHARDS * MIN_STEP, SHARDS),
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
    #[inline]
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

    /// The words of a key without a bucket, each the sweep's
    /// [`restart`](Pace::restart): read after a lookup under the key's
    /// shard lock found it absent.
    pub(crate) fn absent_words(&self) -> Words {
        [self.pace.restart(); MAX_QUOTAS]
    }

    /// The words of the key's bucket at one instant, if it has one (past
    /// its cell's, the sweep's [`restart`](Pace::restart), as for a key
    /// without a bucket). Read under the shard's lock (and, for a shared
    /// cell, by a read of it or under its lock: the one lock order).
    pub(crate) fn words<Q>(&self, key: &Q) -> Option<Words>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let map = self.shard(hash).map.lock();
        let (_, slot) = map.find(hash, |(k, _)| k.borrow() == key)?;
        Some(slot.words_now(self.pace.restart()))
    }

    /// Runs `f` on the key's cell of at least `len` words (whose hash is
    /// `hash`), made full or lengthened if need be (unless the map holds
    /// `max_keys` entries), under its shard's lock: no sweep can retire
    /// the cell meanwhile. The cell is inline in its entry if it is (or is
    /// new), `len` fits and `share` is false; else behind an `Arc` (moved
    /// there now if it was inline), which `f` may clone and lock (the one
    /// lock order: a
    /// call of several keys holds cell locks only, and takes no shard
    /// lock meanwhile).
    pub(crate) fn with_cell<Q, T>(
        &self,
        hash: u64,
        key: &Q,
        len: usize,
        share: bool,
        f: impl FnOnce(InMap<'_>) -> T,
    ) -> Result<T, Full>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shard = self.shard(hash);
        let hasher = &self.hasher;
        let rehash = |(k, _): &(K, Slot)| hasher.hash_one(k);
        let mut map = shard.map.lock();
        if let Some((_, slot)) = map.find_mut(hash, |(k, _)| k.borrow() == key) {
            return Ok(f(slot.in_map(len, share, || self.pace.restart())));
        }
        let place = self.reserve()?;
        if self.auto_sweep {
            self.pace.ghosts.created(hash);
        }
        let start = self.pace.restart();
        let mut slot = Slot::new(len, share, start);
        let result = f(slot.in_map(len, share, || start));
        // The new slot is not in the map yet: a shared cell's read sees
        // what `f` wrote. Relaxed: a hint (see `Shard::full_from`),
        // written under the lock.
        let full_at = decide::full_at(&slot.words_now(start));
        shard
            .full_from
            .fetch_min(full_at.as_u64(), unmodeled::Relaxed);
        shard
            .slices_from
            .fetch_min(full_at.as_u64(), unmodeled::Relaxed);
        map.insert(hash, (key.to_owned(), slot), rehash);
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
        if self.auto_sweep && !cfg!(loom) {
            // Its step is taken after the call, with no lock held (see
            // `step`); under loom, none is.
            self.pace.counted();
        }
        Ok(Unwinding::new(|| {
            // Relaxed: as above.
            self.len.fetch_sub(1, Ordering::Relaxed);
        }))
    }

    /// The words of the key's bucket, if it has one (for the loom models).
    #[cfg(loom)]
    pub(crate) fn words_u64<Q>(&self, key: &Q) -> Option<[u64; MAX_QUOTAS]>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.words(key).map(|words| words.map(Nanos::as_u64))
    }
}

mod evict;
mod slot;

pub(crate) use slot::{InMap, InlineWords, Slot, INLINE_WORDS};

use crate::pace::Pace;
#[cfg(all(test, not(loom)))]
use crate::pace::SWEEP_SLICE;
use evict::MIN_STEP;
pub(crate) use evict::{Held, NO_CELLS};

#[cfg(all(test, not(loom)))]
mod tests;

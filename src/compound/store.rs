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
//! A call clones a key's `Arc` under its shard's lock, then locks and
//! charges the bucket with no shard lock held. The sweep removes an entry
//! under the shard's lock only when the map holds the only reference to
//! its `Arc` (`Arc::get_mut`) and every word is full. No call can hold
//! that bucket then, and none can get it without the shard's lock, so no
//! spend can land on a removed bucket; a full bucket dropped is the same
//! as a new one. Lock order: a shard's lock, then a bucket's, never the
//! other way (a call of one key holds both while it decides; a call of
//! several holds bucket locks only).

use super::decide::{self, Words};
#[cfg(loom)]
use super::policy::MAX_QUOTAS;
use crate::sync::{Arc, AtomicUsize, Lock, LockGuard, Ordering};
use crate::time::Nanos;
use hashbrown::HashMap;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// Shards of the map: a few per core is enough to keep the locks, held
/// for one hash lookup, uncontended. One under loom: a small model.
#[cfg(not(loom))]
const SHARDS: usize = 64;
#[cfg(loom)]
const SHARDS: usize = 1;

/// One key's compound bucket: its words under one lock, read, decided and
/// written together.
#[derive(Debug, Default)]
pub(crate) struct Cell {
    words: Lock<Words>,
}

impl Cell {
    /// Locks the words.
    pub(crate) fn lock(&self) -> LockGuard<'_, Words> {
        self.words.lock()
    }

    /// The cell's address: the global order in which a call takes the
    /// locks of several cells (see `CompoundLimiter::check_scopes`).
    pub(crate) fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

/// One shard: its keys' cells.
type Shard<K, S> = Lock<HashMap<K, Arc<Cell>, S>>;

/// A new key could not be stored: the map holds `max_keys`.
#[derive(Debug)]
pub(crate) struct Full;

pub(crate) struct Store<K, S> {
    hasher: S,
    shards: Box<[Shard<K, S>]>,
    /// Entries over all shards. Changed under the entry's shard lock, read
    /// by the cap's reservation; it publishes nothing (see `reserve`).
    len: AtomicUsize,
    /// The most entries the map holds.
    max_keys: usize,
}

impl<K: Hash + Eq, S: BuildHasher + Clone> Store<K, S> {
    pub(crate) fn new(hasher: S) -> Self {
        let shards = (0..SHARDS)
            .map(|_| Lock::new(HashMap::with_hasher(hasher.clone())))
            .collect();
        Store {
            hasher,
            shards,
            len: AtomicUsize::new(0),
            max_keys: usize::MAX,
        }
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

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &Shard<K, S> {
        // Bits hashbrown does not use for its own tags or low bucket bits.
        let hash = self.hasher.hash_one(key);
        &self.shards[((hash >> 32) as usize) % self.shards.len()]
    }

    /// The key's cell, if it has one.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<Arc<Cell>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).lock().get(key).cloned()
    }

    /// The key's cell, made (full) if it has none, unless the map holds
    /// `max_keys` entries.
    pub(crate) fn get_or_insert<Q>(&self, key: &Q) -> Result<Arc<Cell>, Full>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut shard = self.shard(key).lock();
        if let Some(cell) = shard.get(key) {
            return Ok(Arc::clone(cell));
        }
        self.reserve()?;
        let cell = Arc::new(Cell::default());
        shard.insert(key.to_owned(), Arc::clone(&cell));
        Ok(cell)
    }

    /// Runs `f` on the key's words, made full if new (unless the map
    /// holds `max_keys` entries), under its shard's lock and then its
    /// own: the one lock order (a call of several keys holds bucket locks
    /// only, and takes no shard lock meanwhile).
    pub(crate) fn with_words<Q, T>(
        &self,
        key: &Q,
        f: impl FnOnce(&mut Words) -> T,
    ) -> Result<T, Full>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut shard = self.shard(key).lock();
        if let Some(cell) = shard.get(key) {
            return Ok(f(&mut cell.lock()));
        }
        self.reserve()?;
        let cell = Arc::new(Cell::default());
        let result = f(&mut cell.lock());
        shard.insert(key.to_owned(), cell);
        Ok(result)
    }

    /// Takes a place under the cap for a new entry.
    fn reserve(&self) -> Result<(), Full> {
        // Relaxed: the count guards only itself (one read-modify-write
        // decides, so two inserts cannot both take the last place); the
        // entry is published by its shard's lock, not by this counter.
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |len| {
                (len < self.max_keys).then_some(len + 1)
            })
            .map(drop)
            .map_err(|_| Full)
    }

    /// Removes every entry that no call holds and whose words are all full
    /// at `now`; returns how many it removed.
    pub(crate) fn sweep(&self, now: Nanos) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut map = shard.lock();
            let before = map.len();
            map.retain(|_, cell| match Arc::get_mut(cell) {
                // Unique: no call holds it, and none can get it while the
                // shard is locked.
                Some(cell) => !decide::all_full(&cell.lock(), now),
                None => true,
            });
            removed += before - map.len();
        }
        // Relaxed: as in `reserve`.
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// The words of the key's cell, if it has one (for the loom models).
    #[cfg(loom)]
    pub(crate) fn words<Q>(&self, key: &Q) -> Option<[u64; MAX_QUOTAS]>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).map(|cell| cell.lock().map(Nanos::as_u64))
    }
}

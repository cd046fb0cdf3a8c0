//! The keyed store: a concurrent map from keys to values, used only through
//! the handful of operations below, over one of two stores ([`Store`]):
//! the default, [`sharded`] (256 hashbrown tables of our own, swept a slice
//! at a time and grown a few entries per write), or [`dash`] (a
//! `DashMap`). Each method takes `hash`, the key's hash computed once per
//! call by [`Map::hash`], where the store can use it.
//!
//! Under `cfg(loom)` the map is [`model`]'s single `loom`-locked shard.

#[cfg(not(loom))]
use std::borrow::Borrow;
#[cfg(not(loom))]
use std::hash::{BuildHasher, Hash};

#[cfg(not(loom))]
mod dash;
#[cfg(loom)]
mod model;
#[cfg(not(loom))]
mod sharded;
/// A shard's table; under loom too, for the compound store's shards.
mod table;
pub(crate) use table::Table;

#[cfg(loom)]
pub(crate) use model::{shard_of, Map, FEW_SHARDS, SHARDS};
#[cfg(not(loom))]
pub(crate) use sharded::{FEW_SHARDS, SHARDS};

/// Where the automatic sweep stopped in a shard: the next bucket, and the
/// layout the index refers to (see `Map::retain_slice`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(crate) from: usize,
    pub(crate) layout: u64,
}

/// Which map holds a limiter's buckets (see
/// [`TokenBucketLimiter::with_store`](crate::TokenBucketLimiter::with_store)).
///
/// Decisions are the same in both: the store only decides how fast calls
/// are, and how long the slowest one takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Store {
    /// keyrate's own: 256 shards, each a hashbrown table behind a
    /// read-write lock. The automatic sweep visits 256 table buckets per
    /// step, and a table that runs out of room is replaced by a bigger one
    /// a few entries per write, so no call pays for a whole pass or a whole
    /// rehash.
    #[default]
    Sharded,
    /// A `DashMap` with the same number of shards. Its shards cannot be
    /// visited a slice at a time without `unsafe` code, so a step of the
    /// automatic sweep is a whole pass over the map, and a shard that runs
    /// out of room rehashes all its entries in the growing call: expect
    /// calls that stall for milliseconds at a million keys.
    DashMap,
}

/// The map, over the store chosen when the limiter was made.
#[cfg(not(loom))]
pub(crate) struct Map<K, V, S> {
    /// The keys' hasher, a copy of the store's: a call hashes its key
    /// here once, with no store to tell apart.
    hasher: S,
    store: Stored<K, V, S>,
}

#[cfg(not(loom))]
enum Stored<K, V, S> {
    Sharded(sharded::Sharded<K, V, S>),
    Dash(dash::Dash<K, V, S>),
}

#[cfg(not(loom))]
impl<K: Hash + Eq, V, S: BuildHasher + Clone> Map<K, V, S> {
    /// An empty map of `shards` shards (a power of two above 1).
    pub(crate) fn new(store: Store, hasher: S, shards: usize) -> Self {
        let store = match store {
            Store::Sharded => {
                Stored::Sharded(sharded::Sharded::with_hasher(hasher.clone(), shards))
            }
            Store::DashMap => Stored::Dash(dash::Dash::with_hasher(hasher.clone(), shards)),
        };
        Map { hasher, store }
    }

    /// Which store this is.
    pub(crate) fn store(&self) -> Store {
        match &self.store {
            Stored::Sharded(_) => Store::Sharded,
            Stored::Dash(_) => Store::DashMap,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match &self.store {
            Stored::Sharded(map) => map.len(),
            Stored::Dash(map) => map.len(),
        }
    }

    /// The shards the sweep visits in turn (see
    /// [`retain_slice`](Self::retain_slice)): a `DashMap` counts as one.
    pub(crate) fn shard_count(&self) -> usize {
        match &self.store {
            Stored::Sharded(map) => map.shard_count(),
            Stored::Dash(_) => 1,
        }
    }

    /// `key`'s hash: computed once per call by the caller, and handed to
    /// the methods that take a `hash` (which must be this key's).
    #[inline]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Runs `f` on `key`'s value, if present, under the shard's read lock.
    #[inline]
    pub(crate) fn read<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match &self.store {
            Stored::Sharded(map) => map.read(key, f),
            Stored::Dash(map) => map.read(key, f),
        }
    }

    /// Runs `f` on `key`'s value, if present, under the shard's write
    /// lock. `hash` is [`hash`](Self::hash)`(key)`.
    #[inline]
    pub(crate) fn update<Q, R>(&self, hash: u64, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match &self.store {
            Stored::Sharded(map) => map.update(hash, key, f),
            Stored::Dash(map) => map.update(key, f),
        }
    }

    /// Runs `f` on `key`'s value under the shard's write lock, as
    /// [`update`](Self::update) does; if the key is absent, inserts
    /// `init()` first, unless `init` declines (`None`); `unreserve` gives
    /// back what `init` reserved if the insertion unwinds. `hash` is
    /// [`hash`](Self::hash)`(key)`. A `DashMap` only updates (`None` when
    /// the key is absent: the caller then creates it with
    /// [`try_write`](Self::try_write)), so that `init` is never handed
    /// to a call the fast path cannot inline.
    #[inline(always)]
    pub(crate) fn update_or_insert<Q, R>(
        &self,
        hash: u64,
        key: &Q,
        f: impl FnOnce(&mut V) -> R,
        init: impl FnOnce() -> Option<V>,
        unreserve: impl FnOnce(),
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match &self.store {
            Stored::Sharded(map) => map.update_or_insert(hash, key, f, init, unreserve),
            Stored::Dash(map) => map.update(key, f),
        }
    }

    /// Runs `f` on `key`'s value under the shard's write lock, inserting
    /// `init()` first if the key is absent. The key is cloned only here.
    pub(crate) fn write<Q, R>(
        &self,
        key: &Q,
        init: impl FnOnce() -> V,
        f: impl FnOnce(&mut V) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_write(self.hash(key), key, || Some(init()), f, || {})
            .expect("init always inserts")
    }

    /// Like [`write`](Self::write), but `init` may decline to insert
    /// (returning `None`), in which case nothing is inserted and `None` is
    /// returned. `init` runs under the shard's write lock, only if the key
    /// is absent; `unreserve` gives back what it reserved if the insertion
    /// unwinds. `hash` is [`hash`](Self::hash)`(key)`.
    pub(crate) fn try_write<Q, R>(
        &self,
        hash: u64,
        key: &Q,
        init: impl FnOnce() -> Option<V>,
        f: impl FnOnce(&mut V) -> R,
        unreserve: impl FnOnce(),
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match &self.store {
            Stored::Sharded(map) => map.update_or_insert(hash, key, f, init, unreserve),
            Stored::Dash(map) => map.try_write(key, init, f, unreserve),
        }
    }

    /// Keeps the entries for which `keep` returns true, each shard under
    /// its write lock in turn.
    pub(crate) fn retain(&self, keep: impl FnMut(&K, &V) -> bool) {
        match &self.store {
            Stored::Sharded(map) => map.retain(keep),
            Stored::Dash(map) => map.retain(keep),
        }
    }

    /// One slice of the automatic sweep: [`retain`](Self::retain) over up
    /// to `len` buckets of shard `index` from `at` (a `DashMap`: over the
    /// whole map). Returns where the next slice of this shard starts, or,
    /// when this slice finished the shard, the entries it then holds.
    pub(crate) fn retain_slice(
        &self,
        index: usize,
        at: Cursor,
        len: usize,
        keep: impl FnMut(&K, &V) -> bool,
    ) -> Result<Cursor, usize> {
        match &self.store {
            Stored::Sharded(map) => map.retain_slice(index, at, len, keep),
            Stored::Dash(map) => map.retain_slice(keep),
        }
    }

    /// Removes `key` if `remove` returns true for its value, under the
    /// shard's write lock; returns whether it did.
    pub(crate) fn remove_if<Q>(&self, key: &Q, remove: impl FnOnce(&V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match &self.store {
            Stored::Sharded(map) => map.remove_if(key, remove),
            Stored::Dash(map) => map.remove_if(key, remove),
        }
    }

    pub(crate) fn shrink_to_fit(&self) {
        match &self.store {
            Stored::Sharded(map) => map.shrink_to_fit(),
            Stored::Dash(map) => map.shrink_to_fit(),
        }
    }
}

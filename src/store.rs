//! The keyed store: a concurrent map from keys to values, used only through
//! the handful of operations below.
//!
//! The production map is a sharded [`DashMap`](dashmap::DashMap). Under
//! `cfg(loom)` it is replaced by one `loom` read-write lock around a
//! `HashMap`, standing in for a single shard: loom cannot see DashMap's own
//! locks, and would report false races through them. The model assumes what
//! DashMap documents: `read` runs under a shard read lock, and `update`,
//! `write` and `retain` under the shard's write lock, so those never overlap
//! any other access to the same key.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

#[cfg(not(loom))]
pub(crate) struct Map<K, V, S> {
    inner: dashmap::DashMap<K, V, S>,
}

#[cfg(not(loom))]
impl<K: Hash + Eq, V, S: BuildHasher + Clone> Map<K, V, S> {
    pub(crate) fn with_hasher(hasher: S) -> Self {
        Map {
            inner: dashmap::DashMap::with_hasher(hasher),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.len()
    }

    /// Runs `f` on `key`'s value, if present, under the shard's read lock.
    pub(crate) fn read<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.get(key).map(|value| f(&value))
    }

    /// Runs `f` on `key`'s value, if present, under the shard's write lock.
    pub(crate) fn update<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.get_mut(key).map(|mut value| f(&mut value))
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
        let mut value = self.inner.entry(key.to_owned()).or_insert_with(init);
        f(&mut value)
    }

    /// Like [`write`](Self::write), but `init` may decline to insert
    /// (returning `None`), in which case nothing is inserted and `None` is
    /// returned. `init` runs under the shard's write lock, only if the key
    /// is absent.
    pub(crate) fn try_write<Q, R>(
        &self,
        key: &Q,
        init: impl FnOnce() -> Option<V>,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.inner.entry(key.to_owned()) {
            dashmap::Entry::Occupied(mut entry) => Some(f(entry.get_mut())),
            dashmap::Entry::Vacant(entry) => Some(f(&mut entry.insert(init()?))),
        }
    }

    /// Keeps the entries for which `keep` returns true, each shard under
    /// its write lock.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        self.inner.retain(|key, value| keep(key, value));
    }

    /// Removes `key` if `remove` returns true for its value, under the
    /// shard's write lock; returns whether it did.
    pub(crate) fn remove_if<Q>(&self, key: &Q, remove: impl FnOnce(&V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner
            .remove_if(key, |_, value| remove(value))
            .is_some()
    }

    pub(crate) fn shrink_to_fit(&self) {
        self.inner.shrink_to_fit();
    }
}

#[cfg(loom)]
pub(crate) struct Map<K, V, S> {
    inner: loom::sync::RwLock<std::collections::HashMap<K, V, S>>,
}

#[cfg(loom)]
impl<K: Hash + Eq, V, S: BuildHasher + Clone> Map<K, V, S> {
    pub(crate) fn with_hasher(hasher: S) -> Self {
        Map {
            inner: loom::sync::RwLock::new(std::collections::HashMap::with_hasher(hasher)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.read().unwrap().len()
    }

    pub(crate) fn read<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.read().unwrap().get(key).map(f)
    }

    pub(crate) fn update<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.write().unwrap().get_mut(key).map(f)
    }

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
        let mut map = self.inner.write().unwrap();
        f(map.entry(key.to_owned()).or_insert_with(init))
    }

    pub(crate) fn try_write<Q, R>(
        &self,
        key: &Q,
        init: impl FnOnce() -> Option<V>,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        use std::collections::hash_map::Entry;
        let mut map = self.inner.write().unwrap();
        match map.entry(key.to_owned()) {
            Entry::Occupied(mut entry) => Some(f(entry.get_mut())),
            Entry::Vacant(entry) => Some(f(entry.insert(init()?))),
        }
    }

    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        self.inner
            .write()
            .unwrap()
            .retain(|key, value| keep(key, value));
    }

    pub(crate) fn remove_if<Q>(&self, key: &Q, remove: impl FnOnce(&V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = self.inner.write().unwrap();
        if map.get(key).is_some_and(remove) {
            map.remove(key);
            return true;
        }
        false
    }

    pub(crate) fn shrink_to_fit(&self) {
        self.inner.write().unwrap().shrink_to_fit();
    }
}

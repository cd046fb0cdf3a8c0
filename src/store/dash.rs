//! The DashMap store, for users who prefer it ([`Store::DashMap`](crate::Store::DashMap)):
//! the same operations over a `DashMap`. Its shards cannot be visited a
//! slice at a time without `unsafe` code, so it counts as one shard, a
//! sweep step is a whole pass, and a shard that grows rehashes all of
//! its entries in the growing call: the stalls the default store avoids.

use super::Cursor;
use crate::guard::Unwinding;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

pub(crate) struct Dash<K, V, S> {
    map: DashMap<K, V, S>,
}

impl<K: Hash + Eq, V, S: BuildHasher + Clone> Dash<K, V, S> {
    /// An empty map of `shards` shards (a power of two above 1).
    pub(crate) fn with_hasher(hasher: S, shards: usize) -> Self {
        Dash {
            map: DashMap::with_hasher_and_shard_amount(hasher, shards),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn read<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key).map(|entry| f(entry.value()))
    }

    // Out of line, as every method here: the default store's fast path,
    // which shares the caller, stays small.
    #[inline(never)]
    pub(crate) fn update<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(key).map(|mut entry| f(entry.value_mut()))
    }

    pub(crate) fn try_write<Q, R>(
        &self,
        key: &Q,
        init: impl FnOnce() -> Option<V>,
        f: impl FnOnce(&mut V) -> R,
        unreserve: impl FnOnce(),
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.map.entry(key.to_owned()) {
            Entry::Occupied(mut entry) => Some(f(entry.get_mut())),
            Entry::Vacant(entry) => {
                let value = init()?;
                let unwinding = Unwinding::new(unreserve);
                let mut inserted = entry.insert(value);
                unwinding.defuse();
                Some(f(inserted.value_mut()))
            }
        }
    }

    /// A slice is the whole map: the entries it then holds.
    pub(crate) fn retain_slice(&self, keep: impl FnMut(&K, &V) -> bool) -> Result<Cursor, usize> {
        self.retain(keep);
        Err(self.map.len())
    }

    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        self.map.retain(|key, value| keep(key, value));
    }

    pub(crate) fn remove_if<Q>(&self, key: &Q, remove: impl FnOnce(&V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.remove_if(key, |_, value| remove(value)).is_some()
    }

    pub(crate) fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }
}

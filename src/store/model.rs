//! The store under `cfg(loom)`: one `loom` read-write lock around a
//! `HashMap`, standing in for a single shard. loom cannot see a
//! `parking_lot` lock, and would report false races through it. The model
//! assumes what the real stores guarantee: `read` runs under a shard read
//! lock, and `update`, `write` and the `retain*` under the shard's write
//! lock, so those never overlap any other access to the same key.
//!
//! One shard unless a model asks for more (`loom_api::with_shards`): a
//! key's shard is then fixed by its hash, and the automatic sweep takes a
//! step per shard, as over the real store.

use super::Cursor;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

pub(crate) const SHARDS: usize = 1;
pub(crate) const FEW_SHARDS: usize = 1;

/// The loom map's hasher: fixed keys, so that a sweep visits the entries
/// in the same order in every execution (loom replays each schedule and
/// requires the same operations in the same order; a randomly seeded
/// hasher would reorder the sweep's retirements between runs).
type FixedHasher = std::hash::BuildHasherDefault<std::hash::DefaultHasher>;

type Shard<K, V> = loom::sync::RwLock<std::collections::HashMap<K, V, FixedHasher>>;

pub(crate) struct Map<K, V, S> {
    shards: Box<[Shard<K, V>]>,
    _hasher: std::marker::PhantomData<S>,
}

/// The shard of `key` among `shards`: with one shard, no hash at all.
pub(crate) fn shard_of<Q: Hash + ?Sized>(key: &Q, shards: usize) -> usize {
    if shards == 1 {
        return 0;
    }
    (FixedHasher::default().hash_one(key) % shards as u64) as usize
}

impl<K: Hash + Eq, V, S: BuildHasher + Clone> Map<K, V, S> {
    pub(crate) fn new(_store: super::Store, _hasher: S, _shards: usize) -> Self {
        Map {
            shards: (0..crate::flaw::shards())
                .map(|_| loom::sync::RwLock::new(std::collections::HashMap::default()))
                .collect(),
            _hasher: std::marker::PhantomData,
        }
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &Shard<K, V> {
        &self.shards[shard_of(key, self.shards.len())]
    }

    /// The model stands for one shard of the default store.
    pub(crate) fn store(&self) -> super::Store {
        super::Store::Sharded
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().unwrap().len()).sum()
    }

    pub(crate) fn read<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).read().unwrap().get(key).map(f)
    }

    /// One shard: no hash is needed to find it.
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, _key: &Q) -> u64 {
        0
    }

    pub(crate) fn update<Q, R>(&self, _hash: u64, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).write().unwrap().get_mut(key).map(f)
    }

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
        self.try_write(hash, key, init, f, unreserve)
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
        let mut map = self.shard(key).write().unwrap();
        f(map.entry(key.to_owned()).or_insert_with(init))
    }

    pub(crate) fn try_write<Q, R>(
        &self,
        _hash: u64,
        key: &Q,
        init: impl FnOnce() -> Option<V>,
        f: impl FnOnce(&mut V) -> R,
        // The model's keys do not panic: nothing is given back here.
        _unreserve: impl FnOnce(),
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        use std::collections::hash_map::Entry;
        if crate::flaw::flawed(crate::flaw::Flaw::InsertWithoutRecheck) {
            // BROKEN: the lookup's lock is released before the insert.
            if let Some(value) = self.shard(key).write().unwrap().get_mut(key) {
                return Some(f(value));
            }
            let value = init()?;
            let mut map = self.shard(key).write().unwrap();
            map.insert(key.to_owned(), value);
            return map.get_mut(key).map(f);
        }
        let mut map = self.shard(key).write().unwrap();
        match map.entry(key.to_owned()) {
            Entry::Occupied(mut entry) => Some(f(entry.get_mut())),
            Entry::Vacant(entry) => Some(f(entry.insert(init()?))),
        }
    }

    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        for index in 0..self.shards.len() {
            self.retain_shard(index, &mut keep);
        }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn retain_shard(&self, index: usize, mut keep: impl FnMut(&K, &V) -> bool) -> usize {
        let mut map = self.shards[index].write().unwrap();
        map.retain(|key, value| keep(key, value));
        map.len()
    }

    /// The whole shard in one slice.
    pub(crate) fn retain_slice(
        &self,
        index: usize,
        _at: Cursor,
        _len: usize,
        keep: impl FnMut(&K, &V) -> bool,
    ) -> Result<Cursor, usize> {
        Err(self.retain_shard(index, keep))
    }

    pub(crate) fn remove_if<Q>(&self, key: &Q, remove: impl FnOnce(&V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = self.shard(key).write().unwrap();
        if map.get(key).is_some_and(remove) {
            map.remove(key);
            return true;
        }
        false
    }

    pub(crate) fn shrink_to_fit(&self) {
        for shard in self.shards.iter() {
            shard.write().unwrap().shrink_to_fit();
        }
    }
}

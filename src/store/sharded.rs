//! The default store: [`SHARDS`] hashbrown tables, each behind its own
//! read-write lock (the shape of a `DashMap`, whose shards cannot be
//! reached one at a time without `unsafe`). A key's hash, computed once per
//! call, picks its shard and then its slot. Owning the shards lets the
//! automatic sweep visit a slice of one shard at a time
//! ([`Sharded::retain_slice`]), and each shard's table grows a few entries
//! per write rather than in one rehash (`table`), so no call stalls for a
//! whole-map pass, a whole-shard pass or a whole-shard rehash.

use super::table::Table;
use super::Cursor;
use crate::guard::Unwinding;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// Shards in the main map: a power of two. 256 spreads two threads' calls
/// over enough locks that they rarely meet, for 22 KiB of locks and table
/// headers (a sweep step and a table's growth are bounded per call
/// whatever the shard's size). The
/// shards are not padded to a cache line each (that would cost 32 KiB, 3
/// bytes a key at 10,000 keys): two threads meet on one line only when
/// they call neighbouring shards at once.
pub(crate) const SHARDS: usize = 256;

/// Shards in the side map of moved buckets (handles and hot keys): it
/// stays small.
pub(crate) const FEW_SHARDS: usize = 8;

type Shard<K, V> = parking_lot::RwLock<Table<(K, V)>>;

pub(crate) struct Sharded<K, V, S> {
    shards: Box<[Shard<K, V>]>,
    /// `64 - log2(shards.len())`: the shift that leaves a shard index.
    shift: u32,
    hasher: S,
}

impl<K: Hash + Eq, V, S: BuildHasher + Clone> Sharded<K, V, S> {
    /// An empty map of `shards` shards (a power of two).
    pub(crate) fn with_hasher(hasher: S, shards: usize) -> Self {
        assert!(shards.is_power_of_two() && shards > 1);
        Sharded {
            shards: (0..shards).map(|_| Shard::default()).collect(),
            shift: 64 - shards.trailing_zeros(),
            hasher,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.read().len()).sum()
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// `key`'s hash, and the shard it lives in.
    #[inline]
    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, &Shard<K, V>) {
        let hash = self.hasher.hash_one(key);
        (hash, self.shard(hash))
    }

    /// The shard of a key whose hash is `hash`.
    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K, V> {
        // The bits below hashbrown's 7-bit tag (the hash's top bits), so
        // that the keys of one shard still spread over all tags.
        &self.shards[((hash << 7) >> self.shift) as usize]
    }

    /// Runs `f` on `key`'s value, if present, under the shard's read lock.
    #[inline]
    pub(crate) fn read<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.locate(key);
        let shard = shard.read();
        shard
            .find(hash, |(k, _)| k.borrow() == key)
            .map(|(_, value)| f(value))
    }

    /// Runs `f` on `key`'s value, if present, under the shard's write
    /// lock. `hash` is the key's (`Map::hash`).
    #[inline(always)]
    pub(crate) fn update<Q, R>(&self, hash: u64, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut shard = self.shard(hash).write();
        let result = shard
            .find_mut(hash, |(k, _)| k.borrow() == key)
            .map(|(_, value)| f(value));
        shard.step(|(k, _)| self.hasher.hash_one(k));
        result
    }

    /// Runs `f` on `key`'s value under the shard's write lock, as
    /// [`update`](Self::update) does; if the key is absent, inserts
    /// `init()` first, unless `init` declines (`None`). One lock and one
    /// lookup either way. `hash` is the key's (`Map::hash`).
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
        let mut shard = self.shard(hash).write();
        let rehash = |(k, _): &(K, V)| self.hasher.hash_one(k);
        if let Some((_, value)) = shard.find_mut(hash, |(k, _)| k.borrow() == key) {
            let result = f(value);
            shard.step(rehash);
            return Some(result);
        }
        let value = init()?;
        Some(f(insert_new(
            &mut shard, hash, key, value, unreserve, rehash,
        )))
    }

    /// Keeps the entries for which `keep` returns true, each shard under
    /// its write lock in turn.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        for index in 0..self.shards.len() {
            self.retain_shard(index, &mut keep);
        }
    }

    /// [`retain`](Self::retain) over shard `index` alone (below
    /// [`shard_count`](Self::shard_count)), under its write lock; returns
    /// the entries it then holds.
    pub(crate) fn retain_shard(&self, index: usize, mut keep: impl FnMut(&K, &V) -> bool) -> usize {
        let mut shard = self.shards[index].write();
        shard.retain(|(key, value)| keep(key, value));
        shard.len()
    }

    /// One slice of the automatic sweep: [`retain`](Self::retain) over up
    /// to `len` buckets of shard `index`, from bucket `at.from` if the
    /// shard's layout is still `at.layout` (else from its start), under
    /// the shard's write lock. Returns where the next slice of this shard
    /// starts, or, when this slice finished the shard, the entries it then
    /// holds.
    pub(crate) fn retain_slice(
        &self,
        index: usize,
        at: Cursor,
        len: usize,
        mut keep: impl FnMut(&K, &V) -> bool,
    ) -> Result<Cursor, usize> {
        self.shards[index]
            .write()
            .retain_slice(at, len, |(key, value)| keep(key, value))
    }

    /// Removes `key` if `remove` returns true for its value, under the
    /// shard's write lock; returns whether it did.
    pub(crate) fn remove_if<Q>(&self, key: &Q, remove: impl FnOnce(&V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.locate(key);
        shard
            .write()
            .remove_if(hash, |(k, _)| k.borrow() == key, |(_, value)| remove(value))
    }

    pub(crate) fn shrink_to_fit(&self) {
        for shard in self.shards.iter() {
            shard
                .write()
                .shrink_to_fit(|(k, _)| self.hasher.hash_one(k));
        }
    }
}

/// Inserts `key`'s new `value` (absent from `table`, whose hash is
/// `hash`), with a copy of the key; `unreserve` gives back the place
/// `value`'s `init` reserved if the copy or the insertion unwinds (a
/// key's `Clone` or `Hash` that panics). Out of line: only a key's first
/// call takes it.
#[cold]
#[inline(never)]
fn insert_new<'t, K, V, Q>(
    table: &'t mut Table<(K, V)>,
    hash: u64,
    key: &Q,
    value: V,
    unreserve: impl FnOnce(),
    rehash: impl Fn(&(K, V)) -> u64,
) -> &'t mut V
where
    K: Borrow<Q>,
    Q: ToOwned<Owned = K> + ?Sized,
{
    let unwinding = Unwinding::new(unreserve);
    let (_, value) = table.insert(hash, (key.to_owned(), value), rehash);
    unwinding.defuse();
    value
}

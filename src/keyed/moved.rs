//! Moving a bucket out of its map entry into an `Arc` that handles and
//! hot-key caches hold.

use super::TokenBucketLimiter;
use crate::bucket::{Bucket, MOVED};
use crate::observe::Cell;
use crate::sync::Arc;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// A bucket moved out of its map entry into an `Arc` (see
/// [`TokenBucketLimiter::bucket`]).
#[derive(Clone)]
pub(super) struct Moved {
    pub(super) bucket: Arc<Bucket>,
    /// Held by every [`BucketHandle`](super::BucketHandle) on this bucket, and by the entry: a
    /// count above 1 keeps the bucket from being evicted. Hot-key caches
    /// hold `bucket` only, so they never keep it.
    pub(super) pin: Arc<()>,
}

/// # Moving buckets into an `Arc`: hot-key promotion and handles
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Caches `key`'s bucket in the calling thread's hot-key cache, moving
    /// it to an `Arc` first if it is still inline (`hash` is the key's). Does
    /// nothing if the key has no bucket any more.
    #[cold]
    pub(super) fn promote<Q>(&self, hash: u64, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let moved =
            self.buckets
                .try_write(hash, key, || None, |bucket| self.move_to_arc(key, bucket));
        if let Some(moved) = moved {
            // The cache holds the bucket, not the pin: a sweep may retire it.
            self.hot.insert(hash, key.to_owned(), moved.bucket);
            self.observer.counters.add(Cell::Promotions, 1);
        }
    }

    /// Moves the bucket of `key`'s entry (held under its shard's write
    /// lock) to `moved`, if it is not there yet; returns a clone of the
    /// `moved` entry.
    pub(super) fn move_to_arc<Q>(&self, key: &Q, bucket: &mut Bucket) -> Moved
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Under the shard's write lock no spend is in flight on the inline
        // word, so moving its value out loses nothing; later keyed calls
        // see `MOVED` and follow it to the `Arc`.
        let moved = match bucket.word() {
            MOVED => 0, // already moved: `init` below does not run
            _ => bucket.move_out(),
        };
        // Lock order: this shard, then `moved`.
        self.moved.write(
            key,
            || Moved {
                bucket: Arc::new(Bucket::with_word(moved)),
                pin: Arc::new(()),
            },
            |moved| moved.clone(),
        )
    }
}

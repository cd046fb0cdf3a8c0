//! A bucket's life, in one place: created in its key's map entry
//! (`new_bucket`, under the cap), moved out of the entry into an `Arc` that
//! handles and hot-key caches share (`move_to_arc`, `promote`), and retired
//! by a sweep (`evict`), after which a spend on it goes back to the map.
//!
//! # Lock order
//!
//! A call takes at most one shard lock of `buckets`, and may take the lock
//! of `moved`'s shard for the same key while holding it: **an entry's
//! shard in `buckets` first, then `moved`**, everywhere (the map path,
//! `move_to_arc`, the sweep's `evict`, handles). No code takes a `buckets`
//! lock while holding a `moved` one, and none holds two `buckets` shards at
//! once, so no two calls can wait on each other. Under a lock only the key
//! type's `Hash`, `Eq` and `Drop` run.
//!
//! A moved bucket's word is the truth for its key; the entry's word is
//! `MOVED`. A moved bucket never moves back: a sweep retires it (its word
//! becomes `RETIRED`, only while no handle pins it) and removes both
//! entries, under the same two locks in the same order.

use super::TokenBucketLimiter;
use crate::bucket::{Bucket, MOVED};
use crate::gcra;
use crate::observe::Cell;
use crate::sync::Arc;
use crate::time::Nanos;
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

/// # A bucket's life: created, moved to an `Arc`, retired
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// A new bucket for the key whose hash is `hash`, of word `start`
    /// (the sweep's [`restart`](crate::pace::Pace::restart), read under
    /// the same lock), counted (and shown to the sweep's ghosts), with its
    /// place under the cap reserved; `None` at the cap. Called under the
    /// shard's write lock, only for a key that is absent.
    #[inline]
    pub(super) fn new_bucket(&self, hash: u64, start: Nanos) -> Option<Bucket> {
        let occupancy = &self.occupancy;
        occupancy.reserve().then(|| {
            occupancy.pace.ghosts.created(hash);
            self.observer.created(start)
        })
    }

    /// The word of a key without a bucket (see
    /// [`Pace::restart`](crate::pace::Pace::restart)): read under the lock
    /// of the key's shard, or after a lookup under it found the key absent.
    #[inline]
    pub(super) fn start_word(&self) -> Nanos {
        self.occupancy.pace.restart()
    }

    /// Takes back a creation [`new_bucket`](Self::new_bucket) counted
    /// whose entry never made it into the map (the key's `Clone` or `Hash`
    /// panicked while it was inserted): its place under the cap, and its
    /// count in `buckets_created`.
    #[cold]
    pub(super) fn creation_undone(&self) {
        self.occupancy.release(1);
        // The counters wrap: adding 2^64 - 1 takes one back.
        self.observer
            .counters
            .add(Cell::Created, 1u64.wrapping_neg());
    }

    /// Caches `key`'s bucket in the calling thread's hot-key cache, moving
    /// it to an `Arc` first if it is still inline (`hash` is the key's). Does
    /// nothing if the key has no bucket any more.
    #[cold]
    pub(super) fn promote<Q>(&self, hash: u64, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let moved = self.buckets.try_write(
            hash,
            key,
            || None,
            |bucket| self.move_to_arc(key, bucket),
            || {},
        );
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
        // The lock order (see above): this shard, then `moved`.
        self.moved.write(
            key,
            || Moved {
                bucket: Arc::new(Bucket::with_word(moved)),
                pin: Arc::new(()),
            },
            |moved| moved.clone(),
        )
    }

    /// Whether [`evict`](Self::evict) may take `bucket` at `at`: its word
    /// read once, full then or moved (whose pin `evict` checks). A hint,
    /// not a decision: a spend may land before `evict` runs.
    pub(super) fn may_evict(bucket: &Bucket, at: Nanos) -> bool {
        let word = bucket.word();
        word == MOVED || gcra::is_full(Nanos::new(word), at)
    }

    /// Whether `key`'s bucket is full at `at` and pinned by no handle; if
    /// so, retires it (and removes its `moved` entry), records its word
    /// for the keys that come back (`recorded`: see
    /// [`Pace::removed`](crate::pace::Pace::removed)) if the automatic
    /// sweep is on, and returns true: the caller, holding the key's shard
    /// write lock, then removes the entry.
    ///
    /// With the automatic sweep off the words are not kept: that is the
    /// setting for keys on timelines of their own (see the type's docs),
    /// where one key's word says nothing of another's instants, and a
    /// sweep by hand at `at` promises only decisions at or after `at`.
    pub(super) fn evict(&self, key: &K, bucket: &Bucket, at: Nanos, recorded: &mut Nanos) -> bool {
        let word = self.retire(key, bucket, at);
        if let (Some(word), true) = (word, self.occupancy.auto_sweep) {
            self.occupancy.pace.removed(word, recorded);
        }
        word.is_some()
    }

    /// The retirement of [`evict`](Self::evict): the word retired, if it
    /// did retire the bucket.
    fn retire(&self, key: &K, bucket: &Bucket, at: Nanos) -> Option<Nanos> {
        match bucket.word() {
            // The lock order (see above): this shard, held by the caller,
            // then `moved`.
            // A live handle keeps its bucket. The count cannot rise
            // meanwhile: new handles are made under this shard's lock,
            // and a handle is cloned only from a live one. Hot-key
            // caches hold the bucket but not the pin: retiring it sends
            // their next call back to the map, exactly as a keyed call.
            MOVED => {
                let mut retired = None;
                self.moved.remove_if(key, |moved| {
                    #[cfg(loom)]
                    if crate::flaw::flawed(crate::flaw::Flaw::EvictIgnoringHandles) {
                        retired = moved.bucket.retire_if_full(at);
                        return retired.is_some();
                    }
                    if Arc::strong_count(&moved.pin) == 1 {
                        retired = moved.bucket.retire_if_full(at);
                    }
                    retired.is_some()
                });
                retired
            }
            _ => bucket.retire_if_full(at),
        }
    }
}

//! Per-thread caches of hot keys: a key that one thread calls again and
//! again is spent there with no map lookup at all.
//!
//! A keyed call normally looks its key up in the sharded map, and taking a
//! shard's lock writes the shard's lock word: a line that every core
//! calling that shard takes turns to own. When one key is hammered from
//! several threads (the attack a limiter exists for), that write, not the
//! bucket, is what limits throughput. So each thread counts which bucket
//! its lookups keep finding (Misra-Gries counters, eight per thread: a key
//! that makes up more than a ninth of a thread's calls keeps gaining
//! votes), and once one bucket has won 64 net votes, the limiter moves it
//! to an `Arc`, exactly
//! as for a [`BucketHandle`](crate::BucketHandle), and the thread keeps a
//! clone with the key. Later calls on that key compare the key with the
//! cached one and spend on the `Arc` directly: a denial then writes nothing
//! shared, and an admission writes only the bucket's own word.
//!
//! Decisions do not change: a cached `Arc` is the very bucket the map's
//! entry points to (its word says `MOVED`), so every path spends on one
//! word. Unlike a handle, a cache does not pin the bucket: a sweep may
//! retire it once it is full, and the thread's next call on the key then
//! finds it retired, drops the entry and goes to the map. Each thread caches
//! at most eight buckets, so an abuser rotating over up to eight keys is
//! served from the cache; a newly promoted key takes the slot with the fewest
//! recent hits, and the cache is dropped when the thread exits.
//!
//! Under `cfg(loom)` the cache is compiled out (loom runs its threads on one
//! OS thread, so `std` thread-locals would be shared between them); what it
//! adds to the protocol is a handle's `Arc`, which the loom models check.

#[cfg(not(loom))]
pub(crate) use imp::HotKeys;
#[cfg(loom)]
pub(crate) use off::HotKeys;

#[cfg(not(loom))]
mod imp {
    use crate::bucket::Bucket;
    use crate::sync::unmodeled::{AtomicU64, Relaxed};
    use crate::sync::Arc;
    use std::any::Any;
    use std::borrow::Borrow;
    use std::cell::RefCell;

    /// Buckets cached per thread, over all limiters (and vote counters).
    const SLOTS: usize = 8;

    /// Net votes (calls on one bucket minus calls on others) that promote a
    /// bucket into the calling thread's cache.
    const PROMOTE_AFTER: u32 = 64;

    /// The most hits an entry counts: halved at each promotion, so an entry
    /// that stopped being called loses its slot within a few promotions.
    const MAX_HITS: u32 = 4 * PROMOTE_AFTER;

    /// Gives every limiter its own identity in the caches; never reused.
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);

    thread_local! {
        static CACHE: RefCell<Cache> = const { RefCell::new(Cache::EMPTY) };
    }

    /// One limiter's face on the per-thread caches.
    #[derive(Debug)]
    pub(crate) struct HotKeys {
        /// Tags this limiter's entries; unique in the process.
        id: u64,
        /// Whether this limiter uses the caches at all.
        on: bool,
    }

    /// One cached bucket.
    struct Entry {
        limiter: u64,
        /// The key, a `K` of that limiter.
        key: Box<dyn Any>,
        bucket: Arc<Bucket>,
        /// Hits since the last promotion halved it; the coldest entry
        /// gives up its slot.
        hits: u32,
    }

    /// One thread's cache and its vote counters.
    struct Cache {
        entries: [Option<Entry>; SLOTS],
        /// Misra-Gries counters, one per slot: a limiter and bucket address
        /// (`(0, 0)` when free) and its net votes. With eight counters, any
        /// key that makes up more than a ninth of a thread's lookups keeps
        /// gaining votes, so up to eight keys hammered together all get
        /// cached.
        candidates: [((u64, usize), u32); SLOTS],
    }

    impl Cache {
        const FREE: Option<Entry> = None;
        const EMPTY: Cache = Cache {
            entries: [Self::FREE; SLOTS],
            candidates: [((0, 0), 0); SLOTS],
        };
    }

    impl HotKeys {
        pub(crate) fn new() -> Self {
            // Relaxed: only uniqueness matters, and fetch_add gives it.
            HotKeys {
                id: NEXT_ID.fetch_add(1, Relaxed),
                on: true,
            }
        }

        pub(crate) fn set_on(&mut self, on: bool) {
            self.on = on;
        }

        /// Runs `f` on this thread's cached bucket for `key`, if it has one.
        /// `f` returns `None` when the bucket has been retired: the entry is
        /// then dropped.
        #[inline]
        pub(crate) fn with<K, Q, R>(
            &self,
            key: &Q,
            f: impl FnOnce(&Bucket) -> Option<R>,
        ) -> Option<R>
        where
            K: Borrow<Q> + 'static,
            Q: Eq + ?Sized,
        {
            if !self.on {
                return None;
            }
            // `try_*`: during thread teardown, or if `K`'s drop code calls a
            // limiter from inside the cache, the call goes to the map.
            CACHE
                .try_with(|cache| {
                    let mut cache = cache.try_borrow_mut().ok()?;
                    let slot = cache.entries.iter_mut().find(|slot| {
                        slot.as_ref().is_some_and(|entry| {
                            entry.limiter == self.id
                                && entry
                                    .key
                                    .downcast_ref::<K>()
                                    .is_some_and(|cached| cached.borrow() == key)
                        })
                    })?;
                    let entry = slot.as_mut()?;
                    let result = f(&entry.bucket);
                    if result.is_some() {
                        entry.hits = (entry.hits + 1).min(MAX_HITS);
                    } else {
                        // Retired by a sweep: forget it (dropped under the
                        // borrow, see `insert`).
                        drop(slot.take());
                    }
                    result
                })
                .ok()
                .flatten()
        }

        /// Counts a map lookup that found the bucket at `found` (only the
        /// address is used, so the lookup's lock may already be released);
        /// true when the calling thread should now cache that key (see
        /// [`insert`](Self::insert)).
        #[inline]
        pub(crate) fn vote(&self, found: *const Bucket) -> bool {
            // The address stands for the key: stable while the entry stays
            // put. A rehash or a reused address only misdirects a vote, and
            // a promotion looks the key up again.
            if !self.on {
                return false;
            }
            let candidate = (self.id, found as usize);
            CACHE
                .try_with(|cache| {
                    let Ok(mut cache) = cache.try_borrow_mut() else {
                        return false;
                    };
                    let counters = &mut cache.candidates;
                    if let Some(counter) = counters.iter_mut().find(|c| c.0 == candidate) {
                        counter.1 += 1;
                        if counter.1 < PROMOTE_AFTER {
                            return false;
                        }
                        *counter = ((0, 0), 0);
                        return true;
                    }
                    if let Some(counter) = counters.iter_mut().find(|c| c.1 == 0) {
                        *counter = (candidate, 1);
                    } else {
                        for counter in counters.iter_mut() {
                            counter.1 -= 1;
                        }
                    }
                    false
                })
                .unwrap_or(false)
        }

        /// Caches `key`'s moved bucket in the calling thread, in a free
        /// slot or the coldest one.
        pub(crate) fn insert<K: 'static>(&self, key: K, bucket: Arc<Bucket>) {
            let entry = Entry {
                limiter: self.id,
                key: Box::new(key),
                bucket,
                // It just won the vote: as hot as any entry that has
                // earned that many hits since.
                hits: PROMOTE_AFTER,
            };
            let _ = CACHE.try_with(|cache| {
                let Ok(mut cache) = cache.try_borrow_mut() else {
                    return;
                };
                let Some(slot) = cache
                    .entries
                    .iter_mut()
                    .min_by_key(|slot| slot.as_ref().map_or(0, |e| u64::from(e.hits) + 1))
                else {
                    return;
                };
                let evicted = slot.replace(entry);
                for entry in cache.entries.iter_mut().flatten() {
                    entry.hits /= 2;
                }
                // Dropped under the borrow: a reentrant call from `K`'s drop
                // finds the cache busy and goes to the map.
                drop(evicted);
            });
        }
    }
}

#[cfg(loom)]
mod off {
    use crate::bucket::Bucket;
    use crate::sync::Arc;
    use std::borrow::Borrow;

    /// The cache, switched off: every call goes to the map.
    #[derive(Debug)]
    pub(crate) struct HotKeys;

    impl HotKeys {
        pub(crate) fn new() -> Self {
            HotKeys
        }

        pub(crate) fn set_on(&mut self, _: bool) {}

        // Same signature as the real cache's, so that callers compile
        // unchanged.
        #[allow(clippy::extra_unused_type_parameters)]
        pub(crate) fn with<K, Q, R>(&self, _: &Q, _: impl FnOnce(&Bucket) -> Option<R>) -> Option<R>
        where
            K: Borrow<Q> + 'static,
            Q: Eq + ?Sized,
        {
            None
        }

        pub(crate) fn vote(&self, _: *const Bucket) -> bool {
            false
        }

        pub(crate) fn insert<K: 'static>(&self, _: K, _: Arc<Bucket>) {}
    }
}

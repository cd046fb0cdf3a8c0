//! Per-thread caches of hot keys: a key that one thread calls again and
//! again is spent there with no map lookup at all.
//!
//! A keyed call normally looks its key up in the sharded map, and taking a
//! shard's lock writes the shard's lock word: a line that every core
//! calling that shard takes turns to own. When keys are hammered from
//! several threads (the attack a limiter exists for), that write, not the
//! bucket, is what limits throughput. So each thread counts which keys its
//! map lookups keep asking for (one lookup in four, picked at random,
//! votes), and once a key has won 16 net votes, the limiter moves its
//! bucket to an
//! `Arc`, exactly as for a [`BucketHandle`](crate::BucketHandle), and the
//! thread keeps a clone with the key. Later calls on that key find it in
//! the cache and spend on the `Arc` directly: a denial then writes nothing
//! shared, and an admission writes only the bucket's own word.
//!
//! Both the cache and the votes are indexed by the key's hash, which the
//! call computes once for the map anyway: a probe reads one word of tag
//! bytes for its set (every set's tags fit in four cache lines) and
//! compares a full hash and key only where a tag matches, and a vote
//! touches one set of four counters, however many keys are cached. The cache holds 32 sets of 8 buckets per
//! thread, so an abuser rotating over dozens of keys is served from it;
//! each vote set is a small Misra-Gries summary (a key gains votes while it
//! makes up more than a fifth of its set's lookups), so random traffic
//! over many keys promotes nothing.
//!
//! Decisions do not change: a cached `Arc` is the very bucket the map's
//! entry points to (its word says `MOVED`), so every path spends on one
//! word, and a denial served from the cache reports the exact wait. Unlike
//! a handle, a cache does not pin the bucket: a sweep may retire it once it
//! is full, and the thread's next call on the key then finds it retired,
//! drops the entry and goes to the map. A newly promoted key takes the way
//! of its set with the fewest recent hits; the cache is allocated on a
//! thread's first keyed call and dropped when the thread exits.
//!
//! Under `cfg(loom)` the caches are per model thread (loom's thread-locals),
//! off unless a model turns them on, and a key is promoted on its second
//! lookup, so that model 10 checks the share/retire protocol.

pub(crate) use imp::HotKeys;

mod quick;
mod tags;

/// What a probe of the calling thread's cache found.
pub(crate) enum Probe<R> {
    /// The key's bucket is cached here: the spend's outcome.
    Hit(R),
    /// Not cached; `promote` when the key has just won its slot's vote and
    /// should now be cached (see [`HotKeys::insert`]).
    Miss { promote: bool },
}

mod imp {
    use super::tags::{set_of, tag_of, vote_of, ways_tagged};
    use super::{quick, Probe};
    use crate::bucket::Bucket;
    use crate::sync::unmodeled::{AtomicU64, Relaxed};
    use crate::sync::Arc;
    use crate::votes::Votes;
    use crossbeam_utils::CachePadded;
    use std::any::Any;
    use std::borrow::Borrow;
    use std::cell::RefCell;

    /// Sets of cached buckets per thread (over all limiters); a power of
    /// two.
    pub(crate) const SETS: usize = 32;

    /// Buckets per set. Eight ways make a set's hashes one cache line, and
    /// let 64 hot keys share 32 sets with no set over-full in practice (a
    /// ninth key in a set is left out, or takes the coldest way).
    pub(crate) const WAYS: usize = 8;

    /// Sets of vote counters per thread; a power of two.
    pub(crate) const VOTE_SETS: usize = 128;

    /// Net votes that promote a key into the calling thread's cache: with
    /// one miss in [`VOTE_ONE_IN`] voting, a key hammered alone is cached
    /// after about 64 calls.
    #[cfg(not(loom))]
    pub(crate) const PROMOTE_AFTER: u32 = 16;
    /// Under loom, a key's second lookup promotes it.
    #[cfg(loom)]
    pub(crate) const PROMOTE_AFTER: u32 = 1;

    /// One miss in this many votes, picked at random: random traffic over
    /// many keys pays for a vote a quarter of the time. Random, not every
    /// fourth call: keys called in turn would alias with a fixed stride.
    #[cfg(not(loom))]
    pub(crate) const VOTE_ONE_IN: u64 = 4;
    /// Under loom, every miss votes.
    #[cfg(loom)]
    pub(crate) const VOTE_ONE_IN: u64 = 1;

    /// The most hits an entry counts: halved when a promotion lands in its
    /// set, so an entry that stopped being called loses its way to the next
    /// hot key.
    const MAX_HITS: u32 = 4 * PROMOTE_AFTER;

    /// Gives every limiter its own identity in the caches; never reused.
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);

    #[cfg(not(loom))]
    std::thread_local! {
        /// Allocated on the thread's first keyed call (about 4.5 KiB, and
        /// 12 KiB more on its first promotion), so that threads that never
        /// call a limiter carry a null pointer.
        static CACHE: RefCell<Option<Box<CachePadded<Cache>>>> = const { RefCell::new(None) };
    }

    #[cfg(loom)]
    loom::thread_local! {
        static CACHE: RefCell<Option<Box<CachePadded<Cache>>>> = RefCell::new(None);
    }

    /// One limiter's face on the per-thread caches.
    #[derive(Debug)]
    pub(crate) struct HotKeys {
        /// Tags this limiter's entries and votes; unique in the process.
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
        /// Hits since a promotion into this set last halved it; the coldest
        /// way gives up its place.
        hits: u32,
    }

    /// One set of the cache: the hashes apart, so that a probe reads one
    /// line.
    struct Set {
        /// The hash of each way's key (meaningless for a free way).
        hashes: [u64; WAYS],
        ways: [Option<Entry>; WAYS],
    }

    /// One thread's cache and its vote counters.
    struct Cache {
        /// Each set's ways' tags (see [`tag_of`]), a byte a way, so that a
        /// probe that finds nothing reads one word: all the sets' tags
        /// fit in four cache lines, which random traffic keeps warm. A
        /// free way's byte is meaningless.
        tags: [u64; SETS],
        /// The cached buckets, allocated on the thread's first promotion
        /// (12 KiB): a thread that only ever sees spread traffic carries
        /// the tags and votes alone.
        sets: Option<Box<[Set; SETS]>>,
        /// Misra-Gries counters of 32-bit tags of a limiter and key hash
        /// (see [`vote_of`]).
        votes: [Votes<u32>; VOTE_SETS],
    }

    /// Under loom, a model that failed drops its threads' caches outside
    /// the model, where loom's `Arc`s cannot be dropped (and nothing is
    /// checked any more): leak them.
    #[cfg(loom)]
    impl Drop for Cache {
        fn drop(&mut self) {
            if std::thread::panicking() {
                std::mem::forget(self.sets.take());
            }
        }
    }

    impl Cache {
        /// A new cache, padded so that no other allocation shares a cache
        /// line with it: its entries' hit counts are written on every hit.
        fn new() -> Box<CachePadded<Self>> {
            Box::new(CachePadded::new(Cache {
                tags: [0; SETS],
                sets: None,
                votes: [Votes::new(0); VOTE_SETS],
            }))
        }

        /// Counts one lookup of the key tagged `(set, tag)`; true when it
        /// has just won [`PROMOTE_AFTER`] net votes.
        #[inline]
        fn vote(&mut self, (set, tag): (usize, u32)) -> bool {
            self.votes[set].vote(tag, PROMOTE_AFTER)
        }
    }

    impl HotKeys {
        pub(crate) fn new() -> Self {
            // Relaxed: only uniqueness matters, and fetch_add gives it.
            HotKeys {
                id: NEXT_ID.fetch_add(1, Relaxed),
                // Under loom, off unless a model turns it on: the other
                // models check the map path.
                on: !cfg!(loom),
            }
        }

        pub(crate) fn set_on(&mut self, on: bool) {
            self.on = on;
        }

        pub(crate) fn is_on(&self) -> bool {
            self.on
        }

        /// Runs `f` on this thread's cached bucket for `key` (whose hash is
        /// `hash`), if it has one; otherwise counts the lookup that follows
        /// as a vote for `key`. `f` returns `None` when the bucket has been
        /// retired: the entry is then dropped, and the lookup votes. For
        /// calls that [`cached_here`](Self::cached_here) lets through.
        #[inline]
        pub(crate) fn probe<K, Q, R>(
            &self,
            hash: u64,
            key: &Q,
            f: impl FnOnce(&Bucket) -> Option<R>,
        ) -> Probe<R>
        where
            K: Borrow<Q> + 'static,
            Q: Eq + ?Sized,
        {
            // `try_*`: during thread teardown, or if `K`'s drop code calls a
            // limiter from inside the cache, the call goes to the map.
            CACHE
                .try_with(|cache| {
                    let Ok(mut cache) = cache.try_borrow_mut() else {
                        return Probe::Miss { promote: false };
                    };
                    let cache = cache.get_or_insert_with(Cache::new);
                    let index = set_of(hash);
                    let mut candidates = ways_tagged(cache.tags[index], tag_of(hash));
                    // No sets: nothing cached yet (every tag is 0).
                    if let (true, Some(sets)) = (candidates != 0, cache.sets.as_deref_mut()) {
                        let set = &mut sets[index];
                        while candidates != 0 {
                            let way = candidates.trailing_zeros() as usize / 8;
                            candidates &= candidates - 1;
                            if set.hashes[way] != hash {
                                continue;
                            }
                            let slot = &mut set.ways[way];
                            let Some(entry) = slot.as_mut() else {
                                continue;
                            };
                            let same = entry.limiter == self.id
                                && entry
                                    .key
                                    .downcast_ref::<K>()
                                    .is_some_and(|cached| cached.borrow() == key);
                            if !same {
                                continue;
                            }
                            if let Some(result) = f(&entry.bucket) {
                                if entry.hits < MAX_HITS {
                                    entry.hits += 1;
                                }
                                return Probe::Hit(result);
                            }
                            // Retired by a sweep: forget it (dropped under the
                            // borrow, see `insert`), and vote below.
                            drop(slot.take());
                            break;
                        }
                    }
                    Probe::Miss {
                        promote: quick::votes() && cache.vote(vote_of(self.id, hash)),
                    }
                })
                .unwrap_or(Probe::Miss { promote: false })
        }

        /// Whether a call should [`probe`](Self::probe) the calling
        /// thread's cache: it is on, and the thread has cached a bucket.
        /// Otherwise the call goes to the map, and
        /// [`missed`](Self::missed) counts its vote.
        #[inline]
        pub(crate) fn cached_here(&self) -> bool {
            self.on && quick::cached()
        }

        /// A lookup that did not probe the cache (see
        /// [`cached_here`](Self::cached_here)), counted as
        /// [`probe`](Self::probe) counts a miss: true when the key whose
        /// hash is `hash` has just won its vote. Only a miss that votes
        /// touches the cache (see `Quick`).
        #[inline]
        pub(crate) fn missed(&self, hash: u64) -> bool {
            self.on && quick::votes() && self.vote(hash)
        }

        /// Counts a lookup of the key whose hash is `hash` as a vote (see
        /// [`Cache::vote`]): true when the key should now be cached.
        #[inline(never)]
        fn vote(&self, hash: u64) -> bool {
            CACHE
                .try_with(|cache| {
                    let Ok(mut cache) = cache.try_borrow_mut() else {
                        return false;
                    };
                    let cache = cache.get_or_insert_with(Cache::new);
                    cache.vote(vote_of(self.id, hash))
                })
                .unwrap_or(false)
        }

        /// Caches `key`'s moved bucket in the calling thread, in a free way
        /// of its set or the coldest one.
        pub(crate) fn insert<K: 'static>(&self, hash: u64, key: K, bucket: Arc<Bucket>) {
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
                let cache: &mut Cache = cache.get_or_insert_with(Cache::new);
                let index = set_of(hash);
                let sets = cache.sets.get_or_insert_with(|| {
                    quick::mark_cached();
                    Box::new(std::array::from_fn(|_| Set {
                        hashes: [0; WAYS],
                        ways: std::array::from_fn(|_| None),
                    }))
                });
                let set = &mut sets[index];
                let Some(way) = (0..WAYS)
                    .min_by_key(|&way| set.ways[way].as_ref().map_or(0, |e| u64::from(e.hits) + 1))
                else {
                    return;
                };
                let evicted = set.ways[way].replace(entry);
                set.hashes[way] = hash;
                let mut tags = cache.tags[index].to_le_bytes();
                tags[way] = tag_of(hash);
                cache.tags[index] = u64::from_le_bytes(tags);
                for entry in set.ways.iter_mut().flatten() {
                    entry.hits /= 2;
                }
                // Dropped under the borrow: a reentrant call from `K`'s drop
                // finds the cache busy and goes to the map.
                drop(evicted);
            });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

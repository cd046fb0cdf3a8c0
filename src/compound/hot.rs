//! Per-thread caches of hot compound cells: a key that one thread calls
//! again and again is decided there with no map lookup, so no shard lock.
//!
//! Taking a shard's lock writes its lock word, a line that every core
//! calling that shard takes turns to own: on a hammered key that write,
//! not the decision, limits throughput. So each thread counts the keys of
//! its one-scope calls that went to the map (one lookup in
//! [`VOTE_ONE_IN`] votes, at random), and a key that wins
//! [`PROMOTE_AFTER`] votes in a row in its vote slot (no other key of that
//! slot voting in between) gets its cell cached in the thread, with a
//! copy of the key. A cached call reads the cell's words without writing
//! anything (`Cell::read`), so a denial served here writes no shared
//! memory at all; an admission locks only the cell.
//!
//! A cache holds a strong `Arc`, but does not pin the bucket: the sweep
//! retires a full cell under its lock and removes it from the map, and a
//! cached call that finds its cell retired drops the entry, spends
//! nothing on it, and goes to the map. A thread's cache is [`WAYS`]
//! entries over all compound limiters (a retired cell lives on in at most
//! that many per thread, until the thread calls that key again, or a
//! promotion takes its way, or the thread exits), and [`VOTES`] vote
//! slots.
//!
//! Under `cfg(loom)` the caches are per model thread (loom's
//! thread-locals), off unless a model turns them on, and a key is
//! promoted on its second lookup, so that the models check the
//! read/retire protocol.

use super::cell::Cell;
use crate::dice::Dice;
use crate::sync::unmodeled::{AtomicU64, Relaxed};
use crate::sync::Arc;
use std::any::Any;
use std::borrow::Borrow;
use std::cell::RefCell;

/// Cached cells per thread, over all compound limiters.
const WAYS: usize = 8;

/// Vote slots per thread; a power of two.
const VOTES: usize = 64;

/// Votes in a row (in its vote slot) that promote a key: with one lookup
/// in [`VOTE_ONE_IN`] voting, a key hammered alone is cached after about
/// 64 calls.
#[cfg(not(loom))]
const PROMOTE_AFTER: u32 = 16;
/// Under loom, a key's second lookup promotes it.
#[cfg(loom)]
const PROMOTE_AFTER: u32 = 1;

/// One lookup in this many votes, picked at random (not every fourth:
/// keys called in turn would alias with a fixed stride), so that random
/// traffic over many keys pays for a vote a quarter of the time.
#[cfg(not(loom))]
const VOTE_ONE_IN: u64 = 4;
/// Under loom, every lookup votes.
#[cfg(loom)]
const VOTE_ONE_IN: u64 = 1;

/// Gives every limiter its own identity in the caches; never reused.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(not(loom))]
std::thread_local! {
    /// Allocated on the thread's first vote (about 1.3 KiB), so that
    /// threads that never call a compound limiter carry a null pointer.
    static CACHE: RefCell<Option<Box<Cache>>> = const { RefCell::new(None) };
}

#[cfg(loom)]
loom::thread_local! {
    static CACHE: RefCell<Option<Box<Cache>>> = RefCell::new(None);
}

/// One limiter's face on the per-thread caches.
#[derive(Debug)]
pub(crate) struct HotCells {
    /// Tags this limiter's entries and votes; unique in the process.
    id: u64,
    /// Whether this limiter uses the caches at all.
    on: bool,
}

/// One cached cell.
struct Entry {
    limiter: u64,
    /// The key, a `K` of that limiter.
    key: Box<dyn Any>,
    cell: Arc<Cell>,
}

/// One thread's cache and its votes.
struct Cache {
    /// Each way's key hash (meaningless for a free way), apart, so that a
    /// probe reads one line.
    hashes: [u64; WAYS],
    ways: [Option<Entry>; WAYS],
    /// How many ways hold an entry: a probe of an empty cache (random
    /// traffic) reads no way.
    cached: usize,
    /// Picks the lookups that vote (see [`VOTE_ONE_IN`]).
    dice: Dice,
    /// The way the next promotion takes when none is free.
    next: usize,
    /// Each slot's last tag (see [`tag_of`]) and how many lookups in a
    /// row it has had.
    votes: [(u64, u32); VOTES],
}

impl Cache {
    fn new() -> Box<Self> {
        Box::new(Cache {
            hashes: [0; WAYS],
            ways: std::array::from_fn(|_| None),
            cached: 0,
            dice: Dice::new(),
            next: 0,
            votes: [(0, 0); VOTES],
        })
    }

    /// Counts one map lookup of the key tagged `tag`; true when it has
    /// just come back [`PROMOTE_AFTER`] times in a row in its slot.
    fn vote(&mut self, tag: u64) -> bool {
        let slot = &mut self.votes[(tag >> 40) as usize % VOTES];
        if slot.0 != tag || slot.1 == 0 {
            *slot = (tag, 1);
            return false;
        }
        slot.1 += 1;
        if slot.1 <= PROMOTE_AFTER {
            return false;
        }
        *slot = (0, 0);
        true
    }
}

/// What a probe of the calling thread's cache found.
pub(crate) enum Probe<R> {
    /// The key's cell is cached here: the call's outcome.
    Hit(R),
    /// Not cached; `promote` when the key should now be cached (see
    /// [`HotCells::insert`]).
    Miss { promote: bool },
}

/// Under loom, a model that failed drops its threads' caches outside the
/// model, where loom's `Arc`s cannot be dropped: leak them.
#[cfg(loom)]
impl Drop for Cache {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for way in &mut self.ways {
                std::mem::forget(way.take());
            }
        }
    }
}

/// The vote tag of `hash` in limiter `limiter` (two keys that share one
/// only share votes: a promotion looks the key up again).
fn tag_of(limiter: u64, hash: u64) -> u64 {
    hash ^ limiter.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl HotCells {
    pub(crate) fn new() -> Self {
        HotCells {
            // Relaxed: only uniqueness matters, and fetch_add gives it.
            id: NEXT_ID.fetch_add(1, Relaxed),
            // Under loom, off unless a model turns it on.
            on: !cfg!(loom),
        }
    }

    pub(crate) fn set_on(&mut self, on: bool) {
        self.on = on;
    }

    /// Runs `f` on this thread's cached cell for `key` (whose hash is
    /// `hash`), if there is one and `f` returns `Some` (`None`: the cell
    /// is retired, and the entry is dropped). Otherwise counts the map
    /// lookup that follows as a vote for `key`.
    #[inline]
    pub(crate) fn probe<K, Q, R>(
        &self,
        hash: u64,
        key: &Q,
        f: impl FnOnce(&Cell) -> Option<R>,
    ) -> Probe<R>
    where
        K: Borrow<Q> + 'static,
        Q: Eq + ?Sized,
    {
        if !self.on {
            return Probe::Miss { promote: false };
        }
        // `try_*`: during thread teardown, or if `K`'s drop code calls a
        // limiter from inside the cache, the call goes to the map.
        CACHE
            .try_with(|cache| {
                let Ok(mut cache) = cache.try_borrow_mut() else {
                    return Probe::Miss { promote: false };
                };
                let cache = cache.get_or_insert_with(Cache::new);
                let way = if cache.cached == 0 {
                    None
                } else {
                    (0..WAYS).find(|&way| {
                        cache.hashes[way] == hash
                            && cache.ways[way].as_ref().is_some_and(|entry| {
                                entry.limiter == self.id
                                    && entry
                                        .key
                                        .downcast_ref::<K>()
                                        .is_some_and(|cached| cached.borrow() == key)
                            })
                    })
                };
                if let Some(way) = way {
                    if let Some(entry) = cache.ways[way].as_ref() {
                        if let Some(result) = f(&entry.cell) {
                            return Probe::Hit(result);
                        }
                        // Retired: forget it, under the borrow (a reentrant
                        // call from `K`'s drop finds the cache busy).
                        cache.cached -= 1;
                        drop(cache.ways[way].take());
                    }
                }
                Probe::Miss {
                    promote: cache.dice.one_in(VOTE_ONE_IN) && cache.vote(tag_of(self.id, hash)),
                }
            })
            .unwrap_or(Probe::Miss { promote: false })
    }

    /// Caches `key`'s cell in the calling thread, in a free way, or one
    /// whose cell is retired, or else the next in turn.
    pub(crate) fn insert<K: 'static>(&self, hash: u64, key: K, cell: Arc<Cell>) {
        let entry = Entry {
            limiter: self.id,
            key: Box::new(key),
            cell,
        };
        let _ = CACHE.try_with(|cache| {
            let Ok(mut cache) = cache.try_borrow_mut() else {
                return;
            };
            let cache = cache.get_or_insert_with(Cache::new);
            let way = (0..WAYS)
                .find(|&way| {
                    cache.ways[way]
                        .as_ref()
                        .map_or(true, |old| old.cell.is_retired())
                })
                .unwrap_or_else(|| {
                    cache.next = (cache.next + 1) % WAYS;
                    cache.next
                });
            let evicted = cache.ways[way].replace(entry);
            if evicted.is_none() {
                cache.cached += 1;
            }
            cache.hashes[way] = hash;
            // Dropped under the borrow: a reentrant call from `K`'s drop
            // finds the cache busy and goes to the map.
            drop(evicted);
        });
    }
}

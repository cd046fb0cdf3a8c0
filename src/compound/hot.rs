//! Per-thread caches of hot compound cells: a key that one thread calls
//! again and again is decided there with no map lookup, so no shard lock.
//!
//! Taking a shard's lock writes its lock word, a line that every core
//! calling that shard takes turns to own: on a hammered key that write,
//! not the decision, limits throughput. So each thread counts the keys of
//! its calls that went to the map (one lookup in [`VOTE_ONE_IN`] votes,
//! at random; a call of several scopes counts each key it does not find
//! here), and a key that wins [`PROMOTE_AFTER`] net votes in its vote
//! set (four Misra-Gries counters, so that the keys one call names climb
//! side by side even when they share a set) gets its cell cached in the
//! thread, with a copy of the key. A cached call reads the
//! cell's words without writing anything (`Cell::read`; a call of several
//! scopes, all cached, `Cell::read_all`, borrowing the cells from the
//! cache), so a denial served here writes no shared memory at all; an
//! admission locks only the cells. A call of several scopes, some of
//! them cached, borrows those cells too, and takes only the others from
//! the map (a global key that every call names is looked up there by no
//! thread that caches it).
//!
//! A cache holds a strong `Arc`, but does not pin the bucket: the sweep
//! retires a full cell under its lock and removes it from the map, and a
//! cached call that finds its cell retired drops the entry, spends
//! nothing on it, and goes to the map. A thread's cache is [`WAYS`]
//! entries over all compound limiters (a retired cell lives on in at most
//! that many per thread, until the thread calls that key again, or a
//! promotion takes its way, or the thread exits), and [`VOTE_SETS`] vote
//! sets.
//!
//! Under `cfg(loom)` the caches are per model thread (loom's
//! thread-locals), off unless a model turns them on, and a key is
//! promoted on its second lookup, so that the models check the
//! read/retire protocol.

use super::cell::Cell;
use super::charge::Memo;
use crate::dice::Dice;
use crate::sync::unmodeled::{AtomicU64, Relaxed};
use crate::sync::Arc;
use crate::votes::Votes;
use std::any::Any;
use std::borrow::Borrow;
use std::cell::RefCell;

/// Cached cells per thread, over all compound limiters.
const WAYS: usize = 8;

/// The most scopes a call served from the cache names: one per way.
pub(crate) const MAX_SCOPES: usize = WAYS;

/// Vote sets per thread (of four counters each); a power of two.
const VOTE_SETS: usize = 16;

/// Net votes (in its vote set) that promote a key: with one lookup
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
    /// The cell's last denial for want of tokens, served here.
    memo: Option<Memo>,
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
    /// Misra-Gries counters of tags of a limiter and key hash (see
    /// [`tag_of`]).
    votes: [Votes<u64>; VOTE_SETS],
}

impl Cache {
    fn new() -> Box<Self> {
        Box::new(Cache {
            hashes: [0; WAYS],
            ways: std::array::from_fn(|_| None),
            cached: 0,
            dice: Dice::new(),
            next: 0,
            votes: [Votes::new(0); VOTE_SETS],
        })
    }

    /// The way that caches `key` (whose hash is `hash`) for limiter
    /// `limiter`, if one does.
    #[inline]
    fn find<K, Q>(&self, limiter: u64, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q> + 'static,
        Q: Eq + ?Sized,
    {
        if self.cached == 0 {
            return None;
        }
        (0..WAYS).find(|&way| {
            self.hashes[way] == hash
                && self.ways[way].as_ref().is_some_and(|entry| {
                    entry.limiter == limiter
                        && entry
                            .key
                            .downcast_ref::<K>()
                            .is_some_and(|cached| cached.borrow() == key)
                })
        })
    }

    /// Drops way `way`'s entry (its cell is retired), under the borrow: a
    /// reentrant call from `K`'s drop finds the cache busy.
    fn forget(&mut self, way: usize) {
        if self.ways[way].take().is_some() {
            self.cached -= 1;
        }
    }

    /// Counts a map lookup of the key whose hash is `hash` in limiter
    /// `limiter`, if the dice pick it to vote; true when the key should now
    /// be cached. The dice inline, the vote (one lookup in
    /// [`VOTE_ONE_IN`]) out of line.
    #[inline]
    fn one_vote(&mut self, limiter: u64, hash: u64) -> bool {
        self.dice.one_in(VOTE_ONE_IN) && self.vote(tag_of(limiter, hash))
    }

    /// Counts one map lookup of the key tagged `tag`; true when it has
    /// just won [`PROMOTE_AFTER`] net votes in its set.
    #[inline(never)]
    fn vote(&mut self, tag: u64) -> bool {
        self.votes[(tag >> 40) as usize % VOTE_SETS].vote(tag, PROMOTE_AFTER)
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
    /// `hash`) and the entry's memo of its last denial, if there is one
    /// and `f` returns `Some` (`None`: the cell is retired, and the entry
    /// is dropped). Otherwise counts the map lookup that follows as a
    /// vote for `key`.
    #[inline]
    pub(crate) fn probe<K, Q, R>(
        &self,
        hash: u64,
        key: &Q,
        f: impl FnOnce(&Cell, &mut Option<Memo>) -> Option<R>,
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
                if let Some(way) = cache.find::<K, Q>(self.id, hash, key) {
                    if let Some(entry) = cache.ways[way].as_mut() {
                        if let Some(result) = f(&entry.cell, &mut entry.memo) {
                            return Probe::Hit(result);
                        }
                        cache.forget(way);
                    }
                }
                Probe::Miss {
                    promote: cache.one_vote(self.id, hash),
                }
            })
            .unwrap_or(Probe::Miss { promote: false })
    }

    /// Runs `f` on this thread's cached cells for the keys of `scopes`
    /// (`hashes[i]` is key `i`'s hash): `f` gets key `i`'s cell, borrowed
    /// from the cache, as entry `i`, or `None` for a key not cached here.
    /// Each key not cached may vote first, as in [`probe`](Self::probe),
    /// and `promote[i]` says whether key `i` should now be cached. `None`
    /// if the cache is off or busy, or if `f` returns `None` (a cell
    /// retired or too short): each cached key whose cell is retired is
    /// then forgotten, and may vote. At most [`MAX_SCOPES`] scopes.
    #[inline]
    pub(crate) fn probe_all<K, Q, R>(
        &self,
        hashes: &[u64],
        scopes: &[(&Q, &crate::Policy)],
        promote: &mut [bool],
        f: impl FnOnce(&[Option<&Cell>]) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q> + 'static,
        Q: Eq + ?Sized,
    {
        let n = scopes.len();
        if !self.on || n > MAX_SCOPES || hashes.len() != n || promote.len() != n {
            return None;
        }
        // `try_*`: as in `probe`.
        CACHE
            .try_with(|cache| {
                let Ok(mut cache) = cache.try_borrow_mut() else {
                    return None;
                };
                let cache = cache.get_or_insert_with(Cache::new);
                let mut ways = [None; MAX_SCOPES];
                for i in 0..n {
                    ways[i] = cache.find::<K, Q>(self.id, hashes[i], scopes[i].0);
                    if ways[i].is_none() {
                        promote[i] = cache.one_vote(self.id, hashes[i]);
                    }
                }
                let mut cells = [None; MAX_SCOPES];
                for i in 0..n {
                    cells[i] = ways[i].and_then(|way| Some(&*cache.ways[way].as_ref()?.cell));
                }
                if let Some(result) = f(&cells[..n]) {
                    return Some(result);
                }
                // A cell retired (or too short): a retired cell is
                // forgotten, and its key may vote.
                for i in 0..n {
                    let Some(way) = ways[i] else { continue };
                    let entry = cache.ways[way].as_ref();
                    if entry.is_some_and(|entry| entry.cell.is_retired()) {
                        cache.forget(way);
                        promote[i] = cache.one_vote(self.id, hashes[i]);
                    }
                }
                None
            })
            .ok()
            .flatten()
    }

    /// Whether the calling thread caches `key`'s cell (for the loom
    /// models).
    #[cfg(loom)]
    pub(crate) fn holds<K, Q>(&self, hash: u64, key: &Q) -> bool
    where
        K: Borrow<Q> + 'static,
        Q: Eq + ?Sized,
    {
        let found = |cache: &Cache| cache.find::<K, Q>(self.id, hash, key).is_some();
        CACHE.with(|cache| cache.borrow().as_deref().is_some_and(found))
    }

    /// Caches `key`'s cell in the calling thread, in a free way, or one
    /// whose cell is retired, or else the next in turn.
    pub(crate) fn insert<K: 'static>(&self, hash: u64, key: K, cell: Arc<Cell>) {
        let entry = Entry {
            limiter: self.id,
            key: Box::new(key),
            cell,
            memo: None,
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

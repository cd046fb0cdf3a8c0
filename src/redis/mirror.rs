//! The local deny mirror: per bucket key, a lower bound of the word Redis
//! last showed this limiter, so that calls the bound already denies are
//! denied without a round trip.
//!
//! A bucket's word only grows (every spend pushes `full_at` later, and a
//! key expires only once its bucket is full), so the real word is at least
//! the bound, and `gcra::decide` on the bound denies only what Redis would
//! deny too. Only calls the bound admits go to Redis, and its answer raises
//! the bound: after an admission to the new word, after a denial or a read
//! to the word read.
//!
//! Memory is bounded: at most `capacity` bounds, in shards; a shard that is
//! full first drops the bounds already in the past (they deny nothing), and
//! if it is still full the new bound is not kept (a forgotten bound only
//! costs a round trip, never a wrong decision).

use crate::sync::unmodeled::{AtomicU64, Relaxed};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::Instant;

/// How many shards the bounds are spread over.
const SHARDS: usize = 16;

/// The number of bounds a mirror keeps unless told otherwise.
pub(super) const DEFAULT_MIRROR_CAPACITY: usize = 65_536;

/// One shard: bucket key -> bound.
type Shard = RwLock<HashMap<Box<str>, u64, foldhash::fast::RandomState>>;

/// The bounds of one limiter (and its clones).
pub(super) struct Mirror {
    shards: Box<[Shard]>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
    /// The local monotonic origin of [`Mirror::local_now`].
    origin: Instant,
    /// Redis's `TIME` minus the local instant the call that read it was
    /// sent, from the latest such reply, in ns; 0 before the first. Redis
    /// decided after the call was sent, so `local_now + offset` is at
    /// least Redis's clock at `local_now` (an overestimate by at most that
    /// call's round trip), as long as Redis's clock does not run faster
    /// than the local one. Relaxed: a stale offset is just another past
    /// sample, as valid as the latest.
    server_offset: AtomicU64,
}

impl Mirror {
    pub(super) fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Mirror {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(HashMap::default()))
                .collect(),
            per_shard,
            hasher: foldhash::fast::RandomState::default(),
            origin: Instant::now(),
            server_offset: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> &Shard {
        let hash = self.hasher.hash_one(key);
        // SHARDS is a power of two.
        &self.shards[(hash as usize) & (SHARDS - 1)]
    }

    /// The bound kept for `key`, if any.
    pub(super) fn bound(&self, key: &str) -> Option<u64> {
        self.shard(key).read().get(key).copied()
    }

    /// Raises `key`'s bound to `word` (a bound never falls). `now` on the
    /// same timeline tells which bounds are already in the past.
    pub(super) fn raise(&self, key: &str, word: u64, now: u64) {
        if word <= now {
            // A full bucket: the bound would deny nothing.
            return;
        }
        let mut shard = self.shard(key).write();
        if let Some(bound) = shard.get_mut(key) {
            *bound = (*bound).max(word);
            return;
        }
        if shard.len() >= self.per_shard {
            shard.retain(|_, bound| *bound > now);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(Box::from(key), word);
    }

    /// Nanoseconds on the local monotonic clock since the mirror was made.
    pub(super) fn local_now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// An overestimate of Redis's clock now, once a reply has shown it.
    pub(super) fn server_now(&self) -> Option<u64> {
        match self.server_offset.load(Relaxed) {
            0 => None,
            offset => Some(offset.saturating_add(self.local_now())),
        }
    }

    /// Learns Redis's clock from a reply decided at `server_now` to a call
    /// sent at local instant `sent`.
    pub(super) fn saw_server_time(&self, server_now: u64, sent: u64) {
        let offset = server_now.saturating_sub(sent).max(1);
        self.server_offset.store(offset, Relaxed);
    }

    /// How many bounds are kept.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.read().len()).sum()
    }
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("bounds", &self.len())
            .field("capacity", &(self.per_shard * SHARDS))
            .finish_non_exhaustive()
    }
}

//! The local deny mirror: per bucket key, a lower bound of the word Redis
//! last showed this limiter, so that calls the bound already denies are
//! denied without a round trip.
//!
//! A bucket's word only grows (every spend pushes `full_at` later, and a
//! key expires only once its bucket is full), so the real word is at least
//! the bound, and `gcra::decide` on the bound denies only what Redis would
//! deny too. Only calls the bound admits go to Redis, and its answer
//! replaces the bound: after an admission with the new word, after a
//! denial or a read with the word read.
//!
//! Except when the word falls: a reset (this limiter's, or another
//! process's), or Redis losing the key. This limiter's own resets forget
//! the bound, and ignore the answers to calls sent before them. Another
//! process's reset cannot be seen without a round trip, so a bound is only
//! used for `refresh` (1 s by default) after the call that showed it was
//! sent: then the next call on the key goes to Redis, whose answer replaces
//! it. A fallen word is thus over-denied by at most `refresh`.
//!
//! Calls the bound admits are coalesced per key (async limiter;
//! `mirror/flight.rs`): the mirror counts the refill spent by the calls on
//! a key in flight to Redis, and a call that the bound would deny if they
//! were all admitted waits for them to end, then decides again against the
//! raised bound. So a key hammered from many tasks sends Redis about as
//! many calls as it has tokens, not one per task. Waiting changes when a
//! call is decided, never how.
//!
//! Memory is bounded: at most `capacity` bounds, in shards; a shard that is
//! full first drops the bounds already in the past (they deny nothing), and
//! if it is still full the new bound is not kept (a forgotten bound only
//! costs a round trip, never a wrong decision).

mod flight;
#[cfg(all(test, not(loom)))]
mod tests;

pub(super) use self::flight::{Boarding, FlightGuard};

use crate::sync::unmodeled::{AtomicU64, Relaxed};
use crate::time::Nanos;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Notify;

/// How many shards the bounds are spread over.
const SHARDS: usize = 16;

/// The number of bounds a mirror keeps unless told otherwise.
pub(super) const DEFAULT_MIRROR_CAPACITY: usize = 65_536;

/// How long a bound is used to deny, unless told otherwise.
pub(super) const DEFAULT_MIRROR_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// What the mirror keeps for one bucket key.
#[derive(Debug, Default)]
struct Entry {
    /// The lower bound of the key's word in Redis (0: none yet).
    bound: Nanos,
    /// The local instant ([`Mirror::local_now`]) the call that showed
    /// `bound` was sent.
    seen: Nanos,
    /// The refill that the calls in flight to Redis on this key spend if
    /// all are admitted.
    pending: Nanos,
    /// Wakes the calls waiting for a flight on this key to end.
    landed: Option<Arc<Notify>>,
}

/// One shard: bucket key -> entry.
type Shard = RwLock<HashMap<Box<str>, Entry, foldhash::fast::RandomState>>;

/// The bounds of one limiter (and its clones).
pub(super) struct Mirror {
    shards: Box<[Shard]>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
    /// The local monotonic origin of [`Mirror::local_now`].
    origin: Instant,
    /// Redis's `TIME` minus the local instant the call that read it was
    /// sent, from the latest such reply, a [`Nanos`] as its `u64`; 0
    /// before the first. Redis
    /// decided after the call was sent, so `local_now + offset` is at
    /// least Redis's clock at `local_now` (an overestimate by at most that
    /// call's round trip), as long as Redis's clock does not run faster
    /// than the local one. Relaxed: a stale offset is just another past
    /// sample, as valid as the latest.
    server_offset: AtomicU64,
    /// How long after its call was sent a bound may deny.
    refresh: Nanos,
    /// Answers to calls sent before this local instant are not learnt: a
    /// reset came after them. A [`Nanos`] as its `u64`, raised under a
    /// shard lock and read under one. Relaxed: a reset raises it before it
    /// clears the bounds (both under their shard's lock, whose release
    /// orders them before a later `learn` of the same shard).
    floor: AtomicU64,
    /// The bounds of compound buckets' words (`compound/bounds.rs`).
    pub(super) words: super::compound::bounds::WordBounds,
}

/// A key's bound as the mirror knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Known {
    /// The bound, if recent enough to deny with.
    pub(super) fresh: Option<Nanos>,
    /// The bound, however old: a guess of the stored word.
    pub(super) guess: Nanos,
}

impl Mirror {
    pub(super) fn new(capacity: usize, refresh: std::time::Duration) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Mirror {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(HashMap::default()))
                .collect(),
            per_shard,
            hasher: foldhash::fast::RandomState::default(),
            origin: Instant::now(),
            server_offset: AtomicU64::new(0),
            refresh: Nanos::saturating_from_duration(refresh),
            floor: AtomicU64::new(0),
            words: super::compound::bounds::WordBounds::new(
                capacity,
                Nanos::saturating_from_duration(refresh),
            ),
        }
    }

    /// Whether a bound shown by a call sent at `seen` may deny at `now`.
    fn fresh(&self, seen: Nanos, now: Nanos) -> bool {
        now < seen.saturating_add(self.refresh)
    }

    fn shard(&self, key: &str) -> &Shard {
        let hash = self.hasher.hash_one(key);
        // SHARDS is a power of two.
        &self.shards[(hash as usize) & (SHARDS - 1)]
    }

    /// The bound kept for `key`, if any, at local instant `now`.
    pub(super) fn bound(&self, key: &str, now: Nanos) -> Option<Known> {
        self.shard(key).read().get(key).map(|entry| Known {
            fresh: self.fresh(entry.seen, now).then_some(entry.bound),
            guess: entry.bound,
        })
    }

    /// Learns that `key`'s word was `word` at `now` (on the caller's or
    /// Redis's timeline), from a call sent at local instant `sent`: the
    /// bound becomes `word`, unless a later call already showed another
    /// or a reset came after this call.
    pub(super) fn learn(&self, key: &str, word: Nanos, now: Nanos, sent: Nanos) {
        // A full bucket's bound denies nothing.
        let word = if word > now { word } else { Nanos::ZERO };
        let mut shard = self.shard(key).write();
        // Relaxed: see the field; read under the shard lock.
        if sent.as_u64() < self.floor.load(Relaxed) {
            return;
        }
        if let Some(entry) = shard.get_mut(key) {
            if sent >= entry.seen {
                entry.bound = word;
                entry.seen = sent;
            }
            return;
        }
        if word == Nanos::ZERO {
            return;
        }
        if shard.len() >= self.per_shard {
            // Past bounds deny nothing; entries with calls in flight stay
            // (their guards need them).
            shard.retain(|_, entry| entry.bound > now || entry.pending > Nanos::ZERO);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let entry = Entry {
            bound: word,
            seen: sent,
            ..Entry::default()
        };
        shard.insert(Box::from(key), entry);
    }

    /// Forgets `key`'s bound (the key was reset), and every answer to a
    /// call sent before now.
    pub(super) fn forget(&self, key: &str) {
        let mut shard = self.shard(key).write();
        self.raise_floor();
        if let Some(entry) = shard.get_mut(key) {
            entry.bound = Nanos::ZERO;
        }
        drop(shard);
        self.words.forget(key);
    }

    /// Forgets every bound (every key was reset), and every answer to a
    /// call sent before now.
    pub(super) fn forget_all(&self) {
        self.raise_floor();
        for shard in self.shards.iter() {
            for entry in shard.write().values_mut() {
                entry.bound = Nanos::ZERO;
            }
        }
        self.words.forget_all();
    }

    /// The local instant before which sent calls' answers are not learnt.
    pub(super) fn floor(&self) -> Nanos {
        // Relaxed: see the field; read under a shard lock.
        Nanos::new(self.floor.load(Relaxed))
    }

    fn raise_floor(&self) {
        // Relaxed: see the field.
        self.floor.fetch_max(self.local_now().as_u64(), Relaxed);
    }

    /// The time on the local monotonic clock since the mirror was made.
    pub(super) fn local_now(&self) -> Nanos {
        Nanos::saturating_from_duration(self.origin.elapsed())
    }

    /// An overestimate of Redis's clock now, once a reply has shown it.
    pub(super) fn server_now(&self) -> Option<Nanos> {
        // Relaxed: see the field.
        match self.server_offset.load(Relaxed) {
            0 => None,
            offset => Some(Nanos::new(offset).saturating_add(self.local_now())),
        }
    }

    /// Learns Redis's clock from a reply decided at `server_now` to a call
    /// sent at local instant `sent`.
    pub(super) fn saw_server_time(&self, server_now: Nanos, sent: Nanos) {
        let offset = server_now.saturating_sub(sent).max(Nanos::new(1));
        // Relaxed: see the field.
        self.server_offset.store(offset.as_u64(), Relaxed);
    }

    /// How many bounds it can keep.
    pub(super) fn capacity(&self) -> usize {
        self.per_shard * SHARDS
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

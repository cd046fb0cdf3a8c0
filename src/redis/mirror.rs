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
//! Calls the bound admits are coalesced per key (async limiter): the mirror
//! counts the refill spent by the calls on a key in flight to Redis, and a
//! call that the bound would deny if they were all admitted waits for them
//! to end, then decides again against the raised bound. So a key hammered
//! from many tasks sends Redis about as many calls as it has tokens, not
//! one per task. Waiting changes when a call is decided, never how.
//!
//! Memory is bounded: at most `capacity` bounds, in shards; a shard that is
//! full first drops the bounds already in the past (they deny nothing), and
//! if it is still full the new bound is not kept (a forgotten bound only
//! costs a round trip, never a wrong decision).

use crate::gcra::{self, Quota};
use crate::sync::unmodeled::{AtomicU64, Relaxed};
use crate::time::Nanos;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// How many shards the bounds are spread over.
const SHARDS: usize = 16;

/// The number of bounds a mirror keeps unless told otherwise.
pub(super) const DEFAULT_MIRROR_CAPACITY: usize = 65_536;

/// What the mirror keeps for one bucket key.
#[derive(Debug, Default)]
struct Entry {
    /// The lower bound of the key's word in Redis (0: none yet).
    bound: Nanos,
    /// The refill that the calls in flight to Redis on this key spend if
    /// all are admitted.
    pending: Nanos,
    /// Wakes the calls waiting for a flight on this key to end.
    landed: Option<Arc<Notify>>,
}

/// One shard: bucket key -> entry.
type Shard = RwLock<HashMap<Box<str>, Entry, foldhash::fast::RandomState>>;

/// Whether a call the bound admits goes to Redis now or waits.
pub(super) enum Boarding {
    /// Go: the call counts as in flight until the guard is dropped.
    Go(Option<FlightGuard>),
    /// Wait until a call in flight on the key ends, then decide again.
    Wait(Pin<Box<OwnedNotified>>),
}

/// A call in flight to Redis: dropping it (answered, failed or cancelled)
/// takes its spend off the key's pending refill and wakes the waiters.
pub(super) struct FlightGuard {
    mirror: Arc<Mirror>,
    key: Box<str>,
    spend: Nanos,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut shard = self.mirror.shard(&self.key).write();
        if let Some(entry) = shard.get_mut(&*self.key) {
            entry.pending = entry.pending.saturating_sub(self.spend);
            if let Some(landed) = &entry.landed {
                landed.notify_waiters();
            }
        }
    }
}

impl std::fmt::Debug for FlightGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightGuard")
            .field("spend", &self.spend)
            .finish_non_exhaustive()
    }
}

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
    pub(super) fn bound(&self, key: &str) -> Option<Nanos> {
        self.shard(key).read().get(key).map(|entry| entry.bound)
    }

    /// Boards a call of `cost` (`spend` of refill) on `key` at `at`
    /// that the bound admits:
    /// it goes when the bound still admits it with every call in flight
    /// counted as admitted (or when the entry cannot be kept), and waits
    /// otherwise.
    pub(super) fn board(
        self: &Arc<Self>,
        key: &str,
        at: Nanos,
        cost: u64,
        spend: Nanos,
        quota: &Quota,
    ) -> Boarding {
        let mut shard = self.shard(key).write();
        if !shard.contains_key(key) {
            if shard.len() >= self.per_shard {
                return Boarding::Go(None);
            }
            shard.insert(Box::from(key), Entry::default());
        }
        let entry = shard.get_mut(key).expect("present");
        if entry.pending > Nanos::ZERO {
            let if_all_admitted = entry.bound.max(at).saturating_add(entry.pending);
            if gcra::decide(if_all_admitted, at, cost, quota).is_err() {
                let landed = entry.landed.get_or_insert_with(Default::default).clone();
                let mut wait = Box::pin(landed.notified_owned());
                // Registered before the shard lock is released: a flight
                // that lands from now on wakes it.
                wait.as_mut().enable();
                return Boarding::Wait(wait);
            }
        }
        entry.pending = entry.pending.saturating_add(spend);
        Boarding::Go(Some(FlightGuard {
            mirror: Arc::clone(self),
            key: Box::from(key),
            spend,
        }))
    }

    /// Raises `key`'s bound to `word` (a bound never falls). `now` on the
    /// same timeline tells which bounds are already in the past.
    pub(super) fn raise(&self, key: &str, word: Nanos, now: Nanos) {
        if word <= now {
            // A full bucket: the bound would deny nothing.
            return;
        }
        let mut shard = self.shard(key).write();
        if let Some(entry) = shard.get_mut(key) {
            entry.bound = entry.bound.max(word);
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
            ..Entry::default()
        };
        shard.insert(Box::from(key), entry);
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

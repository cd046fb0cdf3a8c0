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
        let local_now = self.local_now();
        let entry = shard.get_mut(key).expect("present");
        if entry.pending > Nanos::ZERO {
            // A stale bound counts for nothing: the flights' answers
            // bring a fresh one.
            let bound = if self.fresh(entry.seen, local_now) {
                entry.bound
            } else {
                Nanos::ZERO
            };
            let if_all_admitted = bound.max(at).saturating_add(entry.pending);
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

#[cfg(all(test, not(loom)))]
mod tests {
    //! The coalescing protocol (boarding, the flight guard, the wake-up)
    //! under contention, on a multi-threaded runtime, against a fake Redis
    //! that decides on one word under a lock: the differential tests run
    //! their calls one at a time, so their waits never happen.

    use super::*;
    use crate::error::Denial;
    use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    /// What the test counts: calls that went to the fake Redis, its
    /// admissions and denials, denials by the bound, and waits.
    #[derive(Default)]
    struct Tally {
        round_trips: StdAtomicU64,
        admitted: StdAtomicU64,
        denied_by_redis: StdAtomicU64,
        denied_by_bound: StdAtomicU64,
        waits: StdAtomicU64,
    }

    /// One call, as `RedisLimiter` makes it: deny by the bound, board,
    /// wait and decide again, or go to Redis, raise the bound to its
    /// answer and land (drop the guard).
    async fn call(
        mirror: Arc<Mirror>,
        redis: Arc<Mutex<Nanos>>,
        tally: Arc<Tally>,
        at: Nanos,
        quota: Quota,
    ) {
        let (key, cost) = ("k", 1);
        let spend = gcra::spend_for(cost, &quota).expect("a unit cost fits");
        loop {
            let sent = mirror.local_now();
            if let Some(bound) = mirror.bound(key, sent).and_then(|known| known.fresh) {
                if gcra::decide(bound, at, cost, &quota).is_err() {
                    tally.denied_by_bound.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            let guard = match mirror.board(key, at, cost, spend, &quota) {
                Boarding::Go(guard) => guard,
                Boarding::Wait(landed) => {
                    tally.waits.fetch_add(1, Ordering::Relaxed);
                    landed.await;
                    continue;
                }
            };
            assert!(guard.is_some(), "the mirror keeps the test's one key");
            // The round trip: other tasks run meanwhile.
            tokio::task::yield_now().await;
            tally.round_trips.fetch_add(1, Ordering::Relaxed);
            let (decided, word) = {
                let mut word = redis.lock().unwrap();
                let decided = gcra::decide(*word, at, cost, &quota);
                if let Ok(next) = decided {
                    *word = next;
                }
                (decided, *word)
            };
            tokio::task::yield_now().await;
            mirror.learn(key, word, at, sent);
            drop(guard);
            match decided {
                Ok(_) => tally.admitted.fetch_add(1, Ordering::Relaxed),
                Err(Denial::InsufficientTokens { .. }) => {
                    tally.denied_by_redis.fetch_add(1, Ordering::Relaxed)
                }
                Err(other) => panic!("{other:?}"),
            };
            return;
        }
    }

    /// Rounds of many tasks calling one key at one instant each, a window
    /// apart (the bucket is full again at each round). Every call ends (a
    /// lost wake-up would hang the round: the timeout fails it), and is
    /// decided once, by the bound or by Redis; Redis admits exactly the
    /// capacity each round (the bound denies nothing Redis would admit);
    /// no call boards twice or stays boarded (the pending refill is back to
    /// zero after each round); and calls waited. Redis may deny a few: a
    /// call that read the bound just before a landing raised it boards
    /// with no flight to count, and Redis answers it.
    #[test]
    fn contended_boarding_coalesces_and_loses_no_call() {
        const ROUNDS: u64 = 200;
        const TASKS: u64 = 48;
        const CAPACITY: u64 = 8;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_time()
            .build()
            .expect("a runtime");
        let quota = Quota::new(CAPACITY as f64, CAPACITY).expect("a valid quota");
        // A refresh far longer than the test: every bound stays fresh.
        let mirror = Arc::new(Mirror::new(
            DEFAULT_MIRROR_CAPACITY,
            Duration::from_secs(3600),
        ));
        let redis = Arc::new(Mutex::new(Nanos::ZERO));
        let tally = Arc::new(Tally::default());
        for round in 1..=ROUNDS {
            let at = Nanos::new(round * quota.window().as_u64());
            let before = tally.admitted.load(Ordering::Relaxed);
            let trips_before = tally.round_trips.load(Ordering::Relaxed);
            runtime.block_on(async {
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let (mirror, redis, tally) =
                            (Arc::clone(&mirror), Arc::clone(&redis), Arc::clone(&tally));
                        tokio::spawn(call(mirror, redis, tally, at, quota))
                    })
                    .collect();
                let all = async {
                    for task in tasks {
                        task.await.expect("a call panicked");
                    }
                };
                tokio::time::timeout(Duration::from_secs(60), all)
                    .await
                    .expect("a call never ended: a lost wake-up");
            });
            let admitted = tally.admitted.load(Ordering::Relaxed) - before;
            let trips = tally.round_trips.load(Ordering::Relaxed) - trips_before;
            assert_eq!(admitted, CAPACITY, "round {round}: admitted {admitted}");
            assert!(trips >= admitted, "round {round}: {trips} round trips");
            let pending = mirror.shard("k").read().get("k").map(|e| e.pending);
            assert_eq!(
                pending,
                Some(Nanos::ZERO),
                "round {round}: a flight never landed"
            );
        }
        let calls = ROUNDS * TASKS;
        let by_bound = tally.denied_by_bound.load(Ordering::Relaxed);
        let by_redis = tally.denied_by_redis.load(Ordering::Relaxed);
        let trips = tally.round_trips.load(Ordering::Relaxed);
        assert_eq!(
            trips,
            ROUNDS * CAPACITY + by_redis,
            "a call went to Redis twice"
        );
        assert_eq!(trips + by_bound, calls, "every call decided once");
        let waits = tally.waits.load(Ordering::Relaxed);
        eprintln!("{calls} calls: {trips} round trips ({by_redis} denied by Redis), {by_bound} denied by the bound, {waits} waits");
        assert!(waits > 0, "no call waited: the contended path never ran");
    }
}

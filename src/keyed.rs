//! The per-key limiter: a sharded map from keys to buckets.

use crate::bucket::{Bucket, SpendError, RETIRED, SHARED};
use crate::error::{ConfigError, Denial};
use crate::gcra::{self, Quota};
use crate::hot::HotKeys;
use crate::store::Map;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Ordering};
use crate::time::{nanos_from_duration, nanos_from_secs, Clock, MonotonicClock};
use crossbeam_utils::CachePadded;
use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// The default hasher: foldhash, seeded per limiter.
///
/// Keys arrive from the network, so the hasher must resist HashDoS; foldhash
/// is seeded from a per-process random value and costs a few nanoseconds on
/// a 40-byte key (SipHash, std's default, costs about four times as much).
pub type DefaultHasher = foldhash::fast::RandomState;

/// A per-key token-bucket rate limiter, shared by reference between threads.
///
/// Each key has its own bucket of up to `capacity` tokens, refilled at
/// `rate` tokens per second; a call of cost `n` is admitted if the bucket
/// holds at least `n` tokens, and then spends them. A new key starts full.
/// Timestamps are `f64` seconds on any timeline the caller chooses, rounded
/// to whole nanoseconds. Use one timeline for every key (one clock, or Unix
/// time): the automatic sweep (on by default) evicts the buckets that are
/// full at the timestamp of the call that triggers it, so a key whose
/// timestamps lag behind that call's (another timeline, or a call that
/// arrives after a sweep stamped later than itself) can lose its deficit. With per-key
/// timelines, turn the sweep off ([`with_auto_sweep`](Self::with_auto_sweep))
/// and [`sweep`](Self::sweep) yourself.
///
/// All methods take `&self`: share the limiter with an [`Arc`](std::sync::Arc)
/// or a `static`.
///
/// # Locking behaviour
///
/// Buckets live in a sharded [`DashMap`](dashmap::DashMap). A call holds
/// its key's shard's write lock while it updates the key's word in place
/// (taking the lock costs the same shared write as a read lock would, and
/// saves a compare-and-swap); [`remaining`](Self::remaining) takes the read
/// lock. A key that one thread keeps calling is cached by that thread and
/// then spent with one compare-and-swap and no lock at all (see
/// [`with_hot_key_cache`](Self::with_hot_key_cache)), as is a
/// [`BucketHandle`]. Under a lock, only the key type's own `Hash`, `Eq`
/// and `Drop` run (DashMap hashes, compares and drops keys under its
/// locks); as long as those do not call the limiter, no method can
/// deadlock another.
///
/// # Examples
///
/// ```
/// use keyrate::TokenBucketLimiter;
///
/// let limiter = TokenBucketLimiter::new(1.0, 3);
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(!limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 2.0));
/// ```
pub struct TokenBucketLimiter<K = String, S = DefaultHasher> {
    quota: Quota,
    /// Each key's bucket, inline: one word per entry. An entry whose word is
    /// `SHARED` has moved its bucket to `shared`.
    buckets: Map<K, Bucket, S>,
    /// The buckets of keys that have had a [`BucketHandle`], behind an
    /// `Arc` the handles share. Lock order: an entry's shard in `buckets`
    /// first, then `shared`, everywhere.
    shared: Map<K, Shared, S>,
    /// Bucket accounting for the cap and the automatic sweep.
    occupancy: Occupancy,
    /// This limiter's buckets in the per-thread hot-key caches.
    hot: HotKeys,
    /// Read by the `*_now` methods only.
    clock: std::sync::Arc<dyn Clock>,
}

impl TokenBucketLimiter<String, DefaultHasher> {
    /// Makes a limiter for `String` keys: `capacity` tokens per key,
    /// refilled at `rate` tokens per second.
    ///
    /// # Panics
    ///
    /// Panics with the [`ConfigError`]'s message when the configuration is
    /// invalid; see [`try_new`](Self::try_new) for what is accepted.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(10.0, 20);
    /// assert!(limiter.allow("sk_live_0123", 0.0));
    /// ```
    #[must_use]
    pub fn new(rate: f64, capacity: u64) -> Self {
        match Self::try_new(rate, capacity) {
            Ok(limiter) => limiter,
            Err(err) => panic!("{err}"),
        }
    }

    /// Makes a limiter for `String` keys, or says why the configuration is
    /// invalid.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when `rate` is NaN, infinite or not above zero, when
    /// it is outside about `1.1e-10..=1e9` tokens per second, when
    /// `capacity` is zero, or when `capacity / rate` exceeds about 292 years.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConfigError, TokenBucketLimiter};
    ///
    /// let err = TokenBucketLimiter::try_new(f64::NAN, 3).unwrap_err();
    /// assert!(matches!(err, ConfigError::RateNotPositive { .. }));
    /// assert!(err.to_string().contains("greater than zero"));
    /// ```
    pub fn try_new(rate: f64, capacity: u64) -> Result<Self, ConfigError> {
        Ok(Self::with_quota(Quota::new(rate, capacity)?))
    }
}

impl<K: Hash + Eq + 'static> TokenBucketLimiter<K, DefaultHasher> {
    /// Makes a limiter for any key type, such as `u64` tenant ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::<u64>::with_quota(Quota::new(5.0, 2).unwrap());
    /// assert!(limiter.allow(&42, 0.0));
    /// ```
    #[must_use]
    pub fn with_quota(quota: Quota) -> Self {
        Self::with_quota_and_hasher(quota, DefaultHasher::default())
    }
}

impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Makes a limiter for any key type with a hasher of your choice.
    ///
    /// Keys usually come from the network: prefer a seeded, HashDoS-resistant
    /// hasher.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    /// use std::collections::hash_map::RandomState;
    ///
    /// let quota = Quota::new(1.0, 1).unwrap();
    /// let limiter: TokenBucketLimiter<String, RandomState> =
    ///     TokenBucketLimiter::with_quota_and_hasher(quota, RandomState::new());
    /// assert!(limiter.allow("k", 0.0));
    /// ```
    #[must_use]
    pub fn with_quota_and_hasher(quota: Quota, hasher: S) -> Self {
        TokenBucketLimiter {
            quota,
            buckets: Map::with_hasher(hasher.clone()),
            shared: Map::with_hasher(hasher),
            occupancy: Occupancy::new(),
            hot: HotKeys::new(),
            clock: std::sync::Arc::new(MonotonicClock::new()),
        }
    }

    /// Replaces the clock read by the `*_now` methods (by default a
    /// [`MonotonicClock`] started when the limiter was made).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ManualClock, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let limiter = TokenBucketLimiter::new(1.0, 1).with_clock(clock.clone());
    /// assert!(limiter.allow_now("k"));
    /// assert!(!limiter.allow_now("k"));
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.allow_now("k"));
    /// ```
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = std::sync::Arc::new(clock);
        self
    }

    /// Caps the number of buckets held at `max_buckets`.
    ///
    /// When the cap is reached and an automatic sweep frees nothing, a call
    /// for a key without a bucket is denied with [`Denial::LimiterFull`]
    /// (fail closed), while keys that already have a bucket keep working
    /// exactly as before. Memory then stays bounded whatever keys arrive.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Denial, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 2).with_max_buckets(1);
    /// assert!(limiter.allow("a", 0.0));
    /// assert_eq!(limiter.check("b", 0.0, 1), Err(Denial::LimiterFull { max_buckets: 1 }));
    /// assert!(limiter.allow("a", 0.0));
    /// ```
    #[must_use]
    pub fn with_max_buckets(mut self, max_buckets: usize) -> Self {
        self.occupancy.max_buckets = max_buckets;
        // Buckets made before the cap count toward it.
        self.occupancy.held = CachePadded::new(AtomicUsize::new(self.buckets.len()));
        self
    }

    /// Turns the automatic sweep on (the default) or off.
    ///
    /// With it on, creating buckets now and then sweeps the whole map at
    /// the creating call's timestamp (see [`sweep`](Self::sweep)): a sweep
    /// runs once the calls that tried to create a bucket since the last
    /// sweep reach the number of buckets that sweep left (at least
    /// 1024). Each sweep is one pass over the map, paid for by that many
    /// creations, so the cost per created bucket is amortised O(1) (one
    /// bucket visited per creation, on average), and the buckets held stay
    /// below twice the keys active within the last
    /// [`refill_time`](Quota::refill_time) (or 2048). The call that
    /// triggers a sweep pays for the whole pass.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1).with_auto_sweep(false);
    /// for i in 0..5000 {
    ///     assert!(limiter.allow(&format!("k{i}"), f64::from(i)));
    /// }
    /// assert_eq!(limiter.len(), 5000);
    /// ```
    #[must_use]
    pub fn with_auto_sweep(mut self, on: bool) -> Self {
        self.occupancy.auto_sweep = on;
        self
    }

    /// Turns the per-thread hot-key cache on (the default) or off.
    ///
    /// With it on, a key that makes up more than a third of one thread's
    /// calls (counted with two Misra-Gries counters; 64 net votes win) is
    /// cached by that thread: its bucket
    /// moves to a shared `Arc`, as for a [`BucketHandle`], and the thread's
    /// later calls on that key compare the key with the cached one and spend
    /// with no map lookup. A key hammered from several threads then costs no
    /// shared write per denial, where a map lookup writes the shard's lock
    /// word. Decisions are the same either way, and a cached bucket is swept
    /// like any other (the cache forgets it on its next call). Each thread
    /// caches at most two keys over all limiters, holding a copy of each;
    /// the copies are dropped when the thread exits or caches other keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1000).with_hot_key_cache(false);
    /// for _ in 0..500 {
    ///     assert!(limiter.allow("k", 0.0));
    /// }
    /// assert_eq!(limiter.remaining("k", 0.0), Some(500));
    /// ```
    #[must_use]
    pub fn with_hot_key_cache(mut self, on: bool) -> Self {
        self.hot.set_on(on);
        self
    }

    /// The limiter's clock reading, in seconds, as the `*_now` methods use it.
    #[must_use]
    pub fn now(&self) -> f64 {
        self.clock.now().as_secs_f64()
    }

    /// [`allow`](Self::allow) at the limiter's clock reading.
    #[must_use]
    pub fn allow_now<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.allow_n_now(key, 1)
    }

    /// [`allow_n`](Self::allow_n) at the limiter's clock reading.
    #[must_use]
    pub fn allow_n_now<Q>(&self, key: &Q, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_now(key, cost).is_ok()
    }

    /// [`check`](Self::check) at the limiter's clock reading.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check); [`Denial::InvalidTimestamp`] only if the
    /// clock reads beyond [`MAX_TIMESTAMP_NANOS`](crate::MAX_TIMESTAMP_NANOS).
    pub fn check_now<Q>(&self, key: &Q, cost: u64) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = nanos_from_duration(self.clock.now()).ok_or(Denial::InvalidTimestamp)?;
        self.check_nanos(key, now, cost)
    }

    /// [`remaining`](Self::remaining) at the limiter's clock reading.
    #[must_use]
    pub fn remaining_now<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remaining_nanos(key, nanos_from_duration(self.clock.now())?)
    }

    /// The quota every key's bucket follows.
    #[must_use]
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The number of buckets held.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert!(limiter.is_empty());
    /// let _ = limiter.allow("a", 0.0);
    /// assert_eq!(limiter.len(), 1);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no bucket is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buckets.len() == 0
    }

    /// Spends one token from `key`'s bucket at `timestamp` (seconds), if it
    /// holds one. Returns whether the call is admitted.
    ///
    /// An invalid timestamp (NaN, infinite, negative, or beyond
    /// [`MAX_TIMESTAMP_NANOS`](crate::MAX_TIMESTAMP_NANOS)) is denied and
    /// changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// assert!(limiter.allow("k", 0.0));
    /// assert!(!limiter.allow("k", 0.5));
    /// assert!(limiter.allow("k", 1.0));
    /// assert!(!limiter.allow("k", f64::NAN));
    /// ```
    #[must_use]
    pub fn allow<Q>(&self, key: &Q, timestamp: f64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.allow_n(key, timestamp, 1)
    }

    /// Spends `cost` tokens from `key`'s bucket at `timestamp`, if it holds
    /// that many. Returns whether the call is admitted.
    ///
    /// Cost 0 is always admitted (for a valid timestamp) and changes nothing;
    /// a cost above the capacity is never admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert!(limiter.allow_n("k", 0.0, 3));
    /// assert!(!limiter.allow_n("k", 0.0, 1));
    /// assert!(!limiter.allow_n("k", 100.0, 4));
    /// ```
    #[must_use]
    pub fn allow_n<Q>(&self, key: &Q, timestamp: f64, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match nanos_from_secs(timestamp) {
            Some(now) => self.spend(key, now, cost).is_ok(),
            None => false,
        }
    }

    /// Spends `cost` tokens like [`allow_n`](Self::allow_n), and says why a
    /// denied call was denied. On success returns the whole tokens left.
    ///
    /// # Errors
    ///
    /// - [`Denial::InsufficientTokens`] with the exact wait until this cost
    ///   would be admitted (for a `Retry-After` header);
    /// - [`Denial::ExceedsCapacity`] when `cost > capacity`;
    /// - [`Denial::InvalidTimestamp`] for a timestamp that is not finite,
    ///   negative, or out of range.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Denial, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert_eq!(limiter.check("k", 0.0, 2), Ok(1));
    /// assert_eq!(
    ///     limiter.check("k", 0.0, 2),
    ///     Err(Denial::InsufficientTokens { retry_after: Duration::from_secs(1) })
    /// );
    /// assert!(matches!(limiter.check("k", 0.0, 9), Err(Denial::ExceedsCapacity { .. })));
    /// assert_eq!(limiter.check("k", -1.0, 1), Err(Denial::InvalidTimestamp));
    /// ```
    pub fn check<Q>(&self, key: &Q, timestamp: f64, cost: u64) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = nanos_from_secs(timestamp).ok_or(Denial::InvalidTimestamp)?;
        self.check_nanos(key, now, cost)
    }

    fn check_nanos<Q>(&self, key: &Q, now: u64, cost: u64) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let word = self.spend(key, now, cost)?;
        Ok(gcra::tokens_at(word, now, &self.quota))
    }

    /// The whole tokens `key` holds at `timestamp`, without spending any
    /// (for a `RateLimit-Remaining` header). A key never seen holds
    /// `capacity`; no bucket is created. `None` for an invalid timestamp.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert_eq!(limiter.remaining("k", 0.0), Some(3));
    /// assert!(limiter.allow_n("k", 0.0, 2));
    /// assert_eq!(limiter.remaining("k", 0.0), Some(1));
    /// assert_eq!(limiter.remaining("k", 1.5), Some(2));
    /// assert_eq!(limiter.remaining("k", f64::INFINITY), None);
    /// ```
    #[must_use]
    pub fn remaining<Q>(&self, key: &Q, timestamp: f64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remaining_nanos(key, nanos_from_secs(timestamp)?)
    }

    fn remaining_nanos<Q>(&self, key: &Q, now: u64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let word = self
            .buckets
            .read(key, |bucket| match bucket.word() {
                SHARED => self.shared.read(key, |shared| shared.bucket.word()),
                word => Some(word),
            })
            .flatten()
            .unwrap_or(0);
        if word == RETIRED {
            // Retired buckets are full by construction.
            return Some(self.quota.capacity());
        }
        Some(gcra::tokens_at(word, now, &self.quota))
    }

    /// Spends from `key`'s bucket at `now` (validated nanoseconds).
    fn spend<Q>(&self, key: &Q, now: u64, cost: u64) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Fastest path: the key is hot in this thread, and its shared
        // bucket is cached here (see `hot`). A shared bucket never moves
        // again, but a sweep may retire it; the cache then forgets it and
        // the call goes to the map.
        let cached =
            self.hot
                .with::<K, Q, _>(key, |bucket| match bucket.spend(now, cost, &self.quota) {
                    Ok(word) => Some(Ok(word)),
                    Err(SpendError::Denied(denial)) => Some(Err(denial)),
                    Err(SpendError::Retired | SpendError::Shared) => None,
                });
        if let Some(decided) = cached {
            return decided;
        }
        loop {
            // Fast path: the key exists. Its shard's write lock is held
            // while the word is updated in place, and released before any
            // other call on the map.
            let fast = self.buckets.update(key, |bucket| {
                let spent = match bucket.spend_exclusive(now, cost, &self.quota) {
                    // The bucket moved to a handle's `Arc` (lock order:
                    // this shard, then `shared`). A `SHARED` word always has
                    // its `shared` entry: both change under this shard's
                    // write lock.
                    Err(SpendError::Shared) => self
                        .shared
                        .read(key, |shared| shared.bucket.spend(now, cost, &self.quota))
                        .unwrap_or(Err(SpendError::Retired)),
                    other => other,
                };
                (spent, std::ptr::from_ref(bucket))
            });
            if let Some((spent, found)) = fast {
                // Outside the shard lock: the vote needs only the bucket's
                // address, and `promote` takes the lock for writing.
                if matches!(spent, Ok(_) | Err(SpendError::Denied(_))) && self.hot.vote(found) {
                    self.promote(key);
                }
                match spent {
                    Ok(word) => return Ok(word),
                    Err(SpendError::Denied(denial)) => return Err(denial),
                    // Retired by a sweep, or moved under us: no live bucket.
                    Err(SpendError::Retired | SpendError::Shared) => {}
                }
            }
            if let Some(result) = self.create_or_retry(key, now, cost) {
                return result;
            }
        }
    }

    /// The slow path of `spend`: the key has no live bucket. Creates one
    /// and spends from it, or returns `None` when the key must be looked up
    /// again.
    fn create_or_retry<Q>(&self, key: &Q, now: u64, cost: u64) -> Option<Result<u64, Denial>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A call that would change nothing on a full bucket (cost 0) or
        // be denied even there (cost > capacity) creates no bucket.
        match gcra::decide(0, now, cost, &self.quota) {
            Ok(0) => return Some(Ok(0)),
            Ok(_) => {}
            Err(denial) => return Some(Err(denial)),
        }
        // Slow path: first call for this key.
        match self.create(key, now, cost) {
            Ok(word) => Some(Ok(word)),
            Err(SpendError::Denied(denial)) => Some(Err(denial)),
            // Moved to a handle under us (or retired, which the shard
            // lock rules out): look the key up again.
            Err(SpendError::Retired | SpendError::Shared) => None,
        }
    }

    /// Caches `key`'s bucket in the calling thread's hot-key cache, moving
    /// it to a shared `Arc` first if it is still inline. Does nothing if
    /// the key has no bucket any more.
    #[cold]
    fn promote<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = self
            .buckets
            .try_write(key, || None, |bucket| self.share(key, bucket));
        if let Some(shared) = shared {
            // The cache holds the bucket, not the pin: a sweep may retire it.
            self.hot.insert(key.to_owned(), shared.bucket);
        }
    }

    /// Moves the bucket of `key`'s entry (held under its shard's write
    /// lock) to `shared`, if it is not there yet; returns a clone of the
    /// shared entry.
    fn share<Q>(&self, key: &Q, bucket: &mut Bucket) -> Shared
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Under the shard's write lock no spend is in flight on the inline
        // word, so moving its value out loses nothing; later keyed calls
        // see `SHARED` and follow it to the `Arc`.
        let moved = match bucket.word() {
            SHARED => 0, // already shared: `init` below does not run
            _ => bucket.move_out(),
        };
        // Lock order: this shard, then `shared`.
        self.shared.write(
            key,
            || Shared {
                bucket: Arc::new(Bucket::with_word(moved)),
                pin: Arc::new(()),
            },
            |shared| shared.clone(),
        )
    }

    /// Creates `key`'s bucket (unless another thread just did) and spends
    /// from it.
    fn create<Q>(&self, key: &Q, now: u64, cost: u64) -> Result<u64, SpendError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let occupancy = &self.occupancy;
        if occupancy.sweep_due() {
            self.sweep_nanos(now);
        }
        // The shard's write lock makes two racing first calls end up on the
        // same bucket, and the place under the cap is reserved under it only
        // when the key is absent, so a racing creation of the same key is
        // never refused. The key is cloned only here.
        let result = self.buckets.try_write(
            key,
            || occupancy.reserve().then(Bucket::new),
            |bucket| bucket.spend_exclusive(now, cost, &self.quota),
        );
        result.unwrap_or(Err(SpendError::Denied(Denial::LimiterFull {
            max_buckets: occupancy.max_buckets,
        })))
    }

    /// A handle on `key`'s bucket that spends with no map lookup, for a
    /// connection that resolves its API key once and then spends on every
    /// message. It shares the bucket with keyed calls on the same key.
    ///
    /// A bucket with a live handle is never evicted, so the handle stays
    /// valid however long it lives; once every handle is dropped, the bucket
    /// is evicted like any other.
    ///
    /// # Locking behaviour
    ///
    /// Takes the shard's write lock once; the handle's own calls take no
    /// lock at all.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 2);
    /// let handle = limiter.bucket("sk_live_abc");
    /// assert!(handle.allow(0.0));
    /// assert!(limiter.allow("sk_live_abc", 0.0));
    /// assert!(!handle.allow(0.0));
    /// ```
    #[must_use]
    pub fn bucket<Q>(&self, key: &Q) -> BucketHandle
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A handle's bucket counts toward the cap like any other, but the
        // cap never refuses a handle: a connection that holds one must work.
        let mut inserted = false;
        let init = || {
            inserted = true;
            Bucket::new()
        };
        let Shared { bucket, pin } = self
            .buckets
            .write(key, init, |bucket| self.share(key, bucket));
        if inserted {
            self.occupancy.add(1);
        }
        BucketHandle {
            quota: self.quota,
            bucket,
            _pin: pin,
            clock: std::sync::Arc::clone(&self.clock),
        }
    }

    /// Removes every bucket that is full at `timestamp` and has no live
    /// [`BucketHandle`]; returns how many were removed.
    ///
    /// A full bucket is indistinguishable from a key never seen, so this
    /// changes no later decision made at or after `timestamp`. An invalid
    /// timestamp removes nothing.
    ///
    /// # Locking behaviour
    ///
    /// Takes each shard's write lock in turn.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert!(limiter.allow("a", 0.0));
    /// assert!(limiter.allow("b", 0.0));
    /// assert!(limiter.allow("b", 0.0));
    /// assert_eq!(limiter.sweep(1.0), 1); // "a" is full again at 1 s
    /// assert_eq!(limiter.len(), 1);
    /// assert_eq!(limiter.sweep(2.0), 1);
    /// assert!(limiter.is_empty());
    /// ```
    pub fn sweep(&self, timestamp: f64) -> usize {
        match nanos_from_secs(timestamp) {
            Some(now) => self.sweep_nanos(now),
            None => 0,
        }
    }

    /// [`sweep`](Self::sweep) at the limiter's clock reading.
    pub fn sweep_now(&self) -> usize {
        match nanos_from_duration(self.clock.now()) {
            Some(now) => self.sweep_nanos(now),
            None => 0,
        }
    }

    fn sweep_nanos(&self, now: u64) -> usize {
        let mut removed = 0;
        self.buckets.retain(|key, bucket| {
            let evict = match bucket.word() {
                // Lock order: this shard (held by `retain`), then `shared`.
                // A live handle keeps its bucket. The count cannot rise
                // meanwhile: new handles are made under this shard's lock,
                // and a handle is cloned only from a live one. Hot-key
                // caches hold the bucket but not the pin: retiring it sends
                // their next call back to the map, exactly as a keyed call.
                SHARED => self.shared.remove_if(key, |shared| {
                    Arc::strong_count(&shared.pin) == 1 && shared.bucket.try_retire(now)
                }),
                _ => bucket.try_retire(now),
            };
            removed += usize::from(evict);
            !evict
        });
        self.occupancy.swept(removed, self.buckets.len());
        removed
    }

    /// Releases memory the map no longer needs after a sweep.
    pub fn shrink_to_fit(&self) {
        self.buckets.shrink_to_fit();
        self.shared.shrink_to_fit();
    }
}

/// A bucket moved out of its map entry to be shared (see
/// [`TokenBucketLimiter::bucket`]).
#[derive(Clone)]
struct Shared {
    bucket: Arc<Bucket>,
    /// Held by every [`BucketHandle`] on this bucket, and by the entry: a
    /// count above 1 keeps the bucket from being evicted. Hot-key caches
    /// hold `bucket` only, so they never keep it.
    pin: Arc<()>,
}

/// Counts buckets for the cap, and paces the automatic sweep.
struct Occupancy {
    /// Buckets held, plus places reserved by creations in flight, bounded
    /// by `max_buckets`. Kept only when there is a cap, so that without one
    /// creating a bucket writes one shared counter (`pressure`), not two.
    held: CachePadded<AtomicUsize>,
    /// Calls that tried to create a bucket since the last sweep.
    pressure: CachePadded<AtomicUsize>,
    /// The `pressure` at which the next automatic sweep is due.
    sweep_at: AtomicUsize,
    /// Set while an automatic sweep runs, so that only one thread sweeps.
    sweeping: AtomicBool,
    max_buckets: usize,
    auto_sweep: bool,
}

/// The fewest creations between two automatic sweeps.
const MIN_SWEEP_INTERVAL: usize = 1024;

impl Occupancy {
    fn new() -> Self {
        Occupancy {
            held: CachePadded::new(AtomicUsize::new(0)),
            pressure: CachePadded::new(AtomicUsize::new(0)),
            sweep_at: AtomicUsize::new(MIN_SWEEP_INTERVAL),
            sweeping: AtomicBool::new(false),
            max_buckets: usize::MAX,
            auto_sweep: true,
        }
    }

    /// Counts one attempt to create a bucket; true if this caller should
    /// run the automatic sweep now (and then call `swept`).
    fn sweep_due(&self) -> bool {
        if !self.auto_sweep {
            return false;
        }
        // Relaxed: the counters only pace the sweep; an off-by-a-few
        // reading delays or advances it slightly and decides nothing else.
        let pressure = self.pressure.fetch_add(1, Ordering::Relaxed) + 1;
        if pressure < self.sweep_at.load(Ordering::Relaxed) {
            return false;
        }
        // Acquire pairs with the Release in `swept`: the next sweeper sees
        // the counters the previous one left. A thread that loses the race
        // skips the sweep; the winner does it for everyone.
        !self.sweeping.swap(true, Ordering::Acquire)
    }

    /// Records a finished sweep that removed `removed` buckets and left
    /// `remaining`.
    fn swept(&self, removed: usize, remaining: usize) {
        // Relaxed: see `sweep_due`.
        self.release(removed);
        self.pressure.store(0, Ordering::Relaxed);
        self.sweep_at
            .store(remaining.max(MIN_SWEEP_INTERVAL), Ordering::Relaxed);
        // Release pairs with the Acquire in `sweep_due`. An explicit sweep
        // that ran without the flag clears it too, which at worst lets two
        // sweeps overlap; both are correct, just redundant.
        self.sweeping.store(false, Ordering::Release);
    }

    fn capped(&self) -> bool {
        self.max_buckets != usize::MAX
    }

    /// Reserves a place for a new bucket; false when the cap is reached.
    fn reserve(&self) -> bool {
        if !self.capped() {
            return true;
        }
        // Relaxed: the counter alone decides; the fetch_add makes concurrent
        // reservations see each other, so at most `max_buckets` succeed.
        let before = self.held.fetch_add(1, Ordering::Relaxed);
        if before < self.max_buckets {
            return true;
        }
        self.release(1);
        false
    }

    /// Counts `n` buckets created outside `reserve` (handles).
    fn add(&self, n: usize) {
        if !self.capped() {
            return;
        }
        // Relaxed: see `reserve`.
        self.held.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back `n` places (buckets removed, or a reservation unused).
    fn release(&self, n: usize) {
        if !self.capped() {
            return;
        }
        // Relaxed: see `reserve`.
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

impl<K, S> fmt::Debug for TokenBucketLimiter<K, S>
where
    K: Hash + Eq,
    S: BuildHasher + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucketLimiter")
            .field("quota", &self.quota)
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

/// One key's bucket, held by a long-lived caller such as a connection.
///
/// Made by [`TokenBucketLimiter::bucket`]. Cloning a handle shares the same
/// bucket.
#[derive(Debug, Clone)]
pub struct BucketHandle {
    quota: Quota,
    bucket: Arc<Bucket>,
    /// Keeps the bucket from being evicted while any handle on it lives
    /// (see `Shared::pin`).
    _pin: Arc<()>,
    /// The limiter's clock, for the `*_now` methods.
    clock: std::sync::Arc<dyn Clock>,
}

impl BucketHandle {
    /// Spends one token at `timestamp` if the bucket holds one.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let handle = limiter.bucket("k");
    /// assert!(handle.allow(0.0));
    /// assert!(!handle.allow(0.0));
    /// ```
    #[must_use]
    pub fn allow(&self, timestamp: f64) -> bool {
        self.allow_n(timestamp, 1)
    }

    /// Spends `cost` tokens at `timestamp` if the bucket holds that many.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 3).bucket("k");
    /// assert!(handle.allow_n(0.0, 3));
    /// assert!(!handle.allow_n(0.0, 1));
    /// ```
    #[must_use]
    pub fn allow_n(&self, timestamp: f64, cost: u64) -> bool {
        self.check(timestamp, cost).is_ok()
    }

    /// Spends `cost` tokens at `timestamp`, or says why not; on success
    /// returns the whole tokens left.
    ///
    /// # Errors
    ///
    /// The same [`Denial`]s as [`TokenBucketLimiter::check`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 3).bucket("k");
    /// assert_eq!(handle.check(0.0, 1), Ok(2));
    /// ```
    pub fn check(&self, timestamp: f64, cost: u64) -> Result<u64, Denial> {
        let now = nanos_from_secs(timestamp).ok_or(Denial::InvalidTimestamp)?;
        self.check_nanos(now, cost)
    }

    /// [`allow`](Self::allow) at the limiter's clock reading.
    #[must_use]
    pub fn allow_now(&self) -> bool {
        self.check_now(1).is_ok()
    }

    /// [`check`](Self::check) at the limiter's clock reading.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub fn check_now(&self, cost: u64) -> Result<u64, Denial> {
        let now = nanos_from_duration(self.clock.now()).ok_or(Denial::InvalidTimestamp)?;
        self.check_nanos(now, cost)
    }

    fn check_nanos(&self, now: u64, cost: u64) -> Result<u64, Denial> {
        match self.bucket.spend(now, cost, &self.quota) {
            Ok(word) => Ok(gcra::tokens_at(word, now, &self.quota)),
            Err(SpendError::Denied(denial)) => Err(denial),
            // Unreachable: eviction never retires a bucket that a live handle
            // shares (see `sweep_nanos`), and a shared bucket is never moved
            // again. Fail closed rather than panic.
            Err(SpendError::Retired | SpendError::Shared) => Err(Denial::InvalidTimestamp),
        }
    }

    /// The whole tokens the bucket holds at `timestamp`, without spending;
    /// `None` for an invalid timestamp.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 3).bucket("k");
    /// assert_eq!(handle.remaining(0.0), Some(3));
    /// ```
    #[must_use]
    pub fn remaining(&self, timestamp: f64) -> Option<u64> {
        let now = nanos_from_secs(timestamp)?;
        Some(gcra::tokens_at(self.bucket.word(), now, &self.quota))
    }
}

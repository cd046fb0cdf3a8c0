//! Making and configuring a limiter, and what it reports about itself.

use super::{observe, DefaultHasher, LiveQuota, Occupancy, TokenBucketLimiter};
use crate::error::ConfigError;
use crate::gcra::Quota;
use crate::hot::HotKeys;
use crate::store::{Map, Store, FEW_SHARDS, SHARDS};
use crate::sync::AtomicUsize;
use crate::time::{Clock, MonotonicClock};
use crossbeam_utils::CachePadded;
use std::hash::{BuildHasher, Hash};

/// # Constructors for `String` keys
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

/// # Constructors for any key type
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

/// # Constructors with a hasher, and settings
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
        let buckets = Map::new(Store::default(), hasher.clone(), SHARDS);
        TokenBucketLimiter {
            quota: std::sync::Arc::new(LiveQuota::new(quota)),
            occupancy: Occupancy::new(buckets.shard_count()),
            buckets,
            moved: Map::new(Store::default(), hasher.clone(), FEW_SHARDS),
            hot: HotKeys::new(),
            clock: std::sync::Arc::new(MonotonicClock::new()),
            observer: observe::new_observer(true, false, None, hasher),
        }
    }

    /// Replaces the clock read by calls at [`Now`](crate::Now) (by default a
    /// [`MonotonicClock`] started when the limiter was made).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ManualClock, Now, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let limiter = TokenBucketLimiter::new(1.0, 1).with_clock(clock.clone());
    /// assert!(limiter.allow("k", Now));
    /// assert!(!limiter.allow("k", Now));
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.allow("k", Now));
    /// ```
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = std::sync::Arc::new(clock);
        self
    }

    /// Caps the number of buckets held at `max_buckets`.
    ///
    /// When the cap is reached and an automatic sweep frees nothing, a call
    /// for a key without a bucket is denied with [`Denial::LimiterFull`](crate::Denial::LimiterFull)
    /// (fail closed), and so is a handle for one
    /// ([`try_bucket`](Self::try_bucket)), while keys that already have a
    /// bucket keep working exactly as before (a bucket that is full at a
    /// sweep is evicted: its key is then a new key again). Every bucket
    /// counts, a handle's too, so the buckets held never exceed
    /// `max_buckets` whatever keys arrive; the memory they hold is that
    /// times the bytes of a key, so bound the keys' size too (the tower
    /// layer refuses keys above 256 bytes by default).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Denial, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 2).with_max_buckets(1);
    /// assert!(limiter.allow("a", 0.0));
    /// assert_eq!(limiter.check("b", 0.0, 1), Err(Denial::LimiterFull { max_buckets: 1 }));
    /// assert_eq!(limiter.try_bucket("b").unwrap_err(), Denial::LimiterFull { max_buckets: 1 });
    /// assert!(limiter.allow("a", 0.0));
    /// assert_eq!(limiter.len(), 1);
    /// ```
    #[must_use]
    pub fn with_max_buckets(mut self, max_buckets: usize) -> Self {
        self.occupancy.max_buckets = max_buckets;
        // Buckets made before the cap (outside its reservations) count
        // toward it.
        self.occupancy.held = CachePadded::new(AtomicUsize::new(0));
        self.occupancy.add(self.buckets.len());
        self
    }

    /// Chooses the map that holds the buckets (see [`Store`]): keyrate's
    /// own sharded tables (the default), or a `DashMap`. Decisions are the
    /// same; only speed and the slowest call's latency differ. Call it
    /// when making the limiter: it starts afresh, with an empty map, and
    /// handles made before it no longer share their keys' buckets.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Store, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 2).with_store(Store::DashMap);
    /// assert!(limiter.allow("k", 0.0));
    /// assert!(limiter.allow("k", 0.0));
    /// assert!(!limiter.allow("k", 0.0));
    /// assert_eq!(limiter.sweep(2.0), 1);
    /// ```
    #[must_use]
    pub fn with_store(mut self, store: Store) -> Self {
        let hasher = self.observer.hasher().clone();
        // A new identity in the hot-key caches too: a thread's cached
        // bucket of the old map must not serve the new one.
        let mut hot = HotKeys::new();
        hot.set_on(self.hot.is_on());
        self.hot = hot;
        self.buckets = Map::new(store, hasher.clone(), SHARDS);
        self.moved = Map::new(store, hasher, FEW_SHARDS);
        let (max_buckets, auto_sweep) = (self.occupancy.max_buckets, self.occupancy.auto_sweep);
        self.occupancy = Occupancy::new(self.buckets.shard_count());
        self.occupancy.max_buckets = max_buckets;
        self.occupancy.auto_sweep = auto_sweep;
        self
    }

    /// Turns the automatic sweep on (the default) or off.
    ///
    /// With it on, creating buckets now and then sweeps a slice of one of
    /// the map's 256 shards (256 table buckets). A pass visits every shard
    /// in turn, slice by slice, and retires the idle buckets: those full at
    /// the creating call's timestamp and not spent since the previous pass
    /// started. A key that calls at least once a pass keeps its bucket,
    /// however slowly it spends; a bucket retired was found idle by the
    /// previous pass too. Only full buckets go, so, as with
    /// [`sweep`](Self::sweep) (which retires every full bucket), no later
    /// decision changes.
    ///
    /// On, the limiter takes every key to be on one timeline: a key
    /// without a bucket (never seen, or swept) starts full from the latest
    /// instant a swept bucket was full from, so that a call stamped before
    /// a sweep that removed its key (another thread read the clock first)
    /// cannot find the key refilled; a new key's call stamped before that
    /// instant finds it short of what refilled since. Off (keys on
    /// timelines of their own), sweeps keep nothing and a new key is full
    /// at every instant.
    ///
    /// A pass is spread over at least 8192 bucket creations (counted by a
    /// random sample once steps are far apart) and half the buckets the
    /// previous pass left, so the cost per created bucket is amortised
    /// O(1) (a few buckets visited per creation) and no call pays for more
    /// than one slice, whatever the size of the map. Passes grow (to 2^20
    /// creations at once, or four times if longer) while a good share of
    /// the new buckets are for keys the sweep evicted in the last few
    /// hundred passes (watched on a sample of one key in 16, 64 KiB per
    /// limiter from its first eviction), so keys that come back are kept,
    /// however far apart their calls; they shrink by a quarter a pass
    /// otherwise.
    ///
    /// Memory: every bucket held was spent within the current pass and the
    /// two before it, or within one [`refill_time`](Quota::refill_time)
    /// before them, so the buckets held are at most the keys spent in that
    /// window. Keys that are each seen once never lengthen the passes: a
    /// flood of them holds at most three passes' worth, 24,576 buckets
    /// (about 16,384 on average), plus the keys spent within one refill
    /// time. Keys that come back lengthen the window to their calls'
    /// spacing; to bound memory whatever the keys, set
    /// [`with_max_buckets`](Self::with_max_buckets) (at the cap, the sweep
    /// retires every full bucket). Over [`Store::DashMap`] a step is a
    /// whole pass: the same bounds and amortised cost, but one creation in
    /// a pass's worth pays for it.
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
    /// With it on, a key that one thread keeps calling (a sampled vote per
    /// map lookup, counted by small Misra-Gries summaries indexed by the
    /// key's hash) is cached by that thread: its bucket moves to an `Arc`,
    /// as for a [`BucketHandle`](crate::BucketHandle), and the thread's
    /// later calls on that key find it by its hash, compare the key with
    /// the cached one and spend with no map lookup. Keys hammered from
    /// several threads then cost no shared write per denial, where a map
    /// lookup writes the shard's lock word. Decisions, and the waits
    /// reported, are the same either way, and a cached bucket is swept like
    /// any other (the cache forgets it on its next call). Each thread
    /// caches up to 256 keys over all limiters (32 sets of 8, so dozens of
    /// abusive keys fit), holding a copy of each; the copies are dropped
    /// when the thread exits or caches other keys in their place.
    /// [`Stats::hot_key_promotions`](crate::Stats::hot_key_promotions)
    /// counts the keys taken in.
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
    /// assert_eq!(limiter.remaining("k", 0.0), Ok(500));
    /// ```
    #[must_use]
    pub fn with_hot_key_cache(mut self, on: bool) -> Self {
        self.hot.set_on(on);
        self
    }
}

/// # What the limiter reports about itself
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// The limiter's clock reading, in seconds, as calls at [`Now`](crate::Now) read it.
    #[must_use]
    pub fn now(&self) -> f64 {
        self.clock.now().as_secs_f64()
    }
    /// The default quota: the one every call follows unless it names its
    /// own with [`under`](Self::under). [`set_quota`](Self::set_quota)
    /// changes it.
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.quota.load()
    }

    /// The map that holds the buckets (see [`with_store`](Self::with_store)).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Store, TokenBucketLimiter};
    ///
    /// assert_eq!(TokenBucketLimiter::new(1.0, 1).store(), Store::Sharded);
    /// ```
    #[must_use]
    pub fn store(&self) -> Store {
        self.buckets.store()
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
}

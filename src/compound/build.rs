//! Making and configuring the in-memory compound limiter.

use super::hot::HotCells;
use super::limiter::CompoundLimiter;
use super::stats::CompoundCounters;
use super::store::Store;
use crate::keyed::DefaultHasher;
use crate::time::{Clock, MonotonicClock};
use std::hash::{BuildHasher, Hash};

/// # Making a limiter
impl CompoundLimiter<String, DefaultHasher> {
    /// An empty limiter with `String` keys, no cap on keys, and a
    /// [`MonotonicClock`] for [`Now`](crate::Now).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::CompoundLimiter;
    ///
    /// let limiter = CompoundLimiter::new();
    /// assert!(limiter.is_empty());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::with_hasher(DefaultHasher::default())
    }
}

impl Default for CompoundLimiter<String, DefaultHasher> {
    fn default() -> Self {
        Self::new()
    }
}

/// # Configuration
impl<K: Hash + Eq, S: BuildHasher + Clone> CompoundLimiter<K, S> {
    /// An empty limiter whose keys are hashed by `hasher`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, DefaultHasher};
    ///
    /// let limiter: CompoundLimiter<u64> = CompoundLimiter::with_hasher(DefaultHasher::default());
    /// assert_eq!(limiter.len(), 0);
    /// ```
    #[must_use]
    pub fn with_hasher(hasher: S) -> Self {
        CompoundLimiter {
            store: Store::new(hasher),
            clock: std::sync::Arc::new(MonotonicClock::new()),
            counters: CompoundCounters::new(),
            hot: HotCells::new(),
        }
    }

    /// The clock read by calls at [`Now`](crate::Now).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, ManualClock, Now, Policy, Quota};
    ///
    /// let limiter = CompoundLimiter::new().with_clock(ManualClock::new());
    /// let policy = Policy::from(Quota::new(1.0, 1).unwrap());
    /// assert!(limiter.check("k", &policy, Now, 1).is_ok());
    /// ```
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = std::sync::Arc::new(clock);
        self
    }

    /// Holds at most `max_keys` keys: a call that needs a new key when
    /// there are that many first sweeps the one shard of the map (of 64)
    /// whose buckets can be full soonest, if that instant has come, and is
    /// denied [`CompoundDenial::LimiterFull`](crate::CompoundDenial::LimiterFull) if that frees nothing. A refusal
    /// thus never pays for a pass over the map; a full bucket in another
    /// shard is found by a later call (by one thread's 64th at one
    /// instant, at the latest).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundDenial, CompoundLimiter, Policy, Quota};
    ///
    /// let limiter = CompoundLimiter::new().with_max_keys(1);
    /// let policy = Policy::from(Quota::new(1.0, 1).unwrap());
    /// assert!(limiter.check("a", &policy, 0.0, 1).is_ok());
    /// assert_eq!(
    ///     limiter.check("b", &policy, 0.0, 1),
    ///     Err(CompoundDenial::LimiterFull { max_keys: 1 })
    /// );
    /// assert!(limiter.check("b", &policy, 1.0, 1).is_ok()); // "a" is full again
    /// ```
    #[must_use]
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.store.set_max_keys(max_keys);
        self
    }

    /// Whether calls sweep idle buckets away as new keys arrive (on by
    /// default): every 16 new keys at least, a call that went through the
    /// map sweeps one of the map's 64 shards after its decision, the
    /// shards in turn, removing the buckets that were already full when
    /// the previous pass over the shards started. A flood of keys each
    /// called once then keeps at most a few thousand buckets, and a key
    /// called at least once a pass keeps its bucket. Off, only
    /// [`sweep`](Self::sweep) and [`with_max_keys`](Self::with_max_keys)
    /// remove buckets.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    ///
    /// let policy = Policy::from(Quota::new(1_000.0, 1).unwrap());
    /// let limiter = CompoundLimiter::new();
    /// for i in 0..20_000u32 {
    ///     // Each key's bucket is full again 1 ms after its call.
    ///     let now = f64::from(i) / 1_000.0;
    ///     assert!(limiter.check(format!("key-{i}").as_str(), &policy, now, 1).is_ok());
    /// }
    /// assert!(limiter.len() <= 3_072);
    ///
    /// let kept = CompoundLimiter::new().with_auto_sweep(false);
    /// for i in 0..10_000u32 {
    ///     let now = f64::from(i) / 1_000.0;
    ///     assert!(kept.check(format!("key-{i}").as_str(), &policy, now, 1).is_ok());
    /// }
    /// assert_eq!(kept.len(), 10_000);
    /// ```
    #[must_use]
    pub fn with_auto_sweep(mut self, on: bool) -> Self {
        self.store.set_auto_sweep(on);
        self
    }

    /// Whether a thread that keeps calling one key caches that key's
    /// bucket (on by default): its later calls on the key then take no
    /// shard lock, and a denial reads the bucket without writing
    /// anything. A call of several scopes is served from the cache when
    /// the thread caches every one of its keys (a hammered key's plan,
    /// org and global scopes): its denial then reads all of their buckets
    /// at one instant and writes nothing shared. Decisions do not change;
    /// a thread's cache holds at most 8 buckets, and never keeps one from
    /// the sweep.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    ///
    /// let limiter = CompoundLimiter::new().with_hot_key_cache(false);
    /// let policy = Policy::from(Quota::new(1.0, 1).unwrap());
    /// assert!(limiter.check("k", &policy, 0.0, 1).is_ok());
    /// ```
    #[must_use]
    pub fn with_hot_key_cache(mut self, on: bool) -> Self {
        self.hot.set_on(on);
        self
    }

    /// The number of keys held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

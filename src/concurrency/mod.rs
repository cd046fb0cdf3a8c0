//! Concurrency limits per key: how many permits (streams, connections,
//! requests in flight) a key may hold at once.
//!
//! Files: `mod.rs` (the limiter, its constructors and settings),
//! `acquire.rs` (taking a permit, and the key's slot), `front.rs` (the
//! trait the tower layer takes, over this limiter and the Redis one), `wait.rs`
//! (waiting for one, first come first served), `slot.rs` (one key's count
//! word and queue), `permit.rs` (`Permit`), `sweep.rs` (removing idle
//! keys, the cap), `with_rate.rs` (a permit and a token, or neither),
//! `stats.rs`, `denial.rs` (`ConcurrencyDenial`).
//! See `docs/concurrency.md`.

mod acquire;
mod denial;
mod front;
mod permit;
mod slot;
mod stats;
mod sweep;
mod wait;
mod with_rate;

pub use self::denial::ConcurrencyDenial;
pub use self::front::AsyncConcurrencyLimiter;
pub use self::permit::Permit;
pub use self::stats::ConcurrencyStats;
#[cfg(loom)]
pub(crate) use self::wait::{Entered, Queued};

use self::slot::Slot;
use self::stats::Counters;
use self::sweep::Sweeper;
use crate::error::ConfigError;
use crate::keyed::DefaultHasher;
use crate::store::{Map, Store, SHARDS};
use crate::sync::{Arc, AtomicU32, Ordering};
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// Limits how many permits each key holds at once: at most `max` per key
/// (the limiter's default, changed live with [`set_max`](Self::set_max),
/// or a limit given per call, a plan's).
///
/// A permit is taken with [`try_acquire`](Self::try_acquire) and given
/// back when its [`Permit`] is dropped. Lowering a limit revokes nothing:
/// permits held stay held, and new ones are refused until the key holds
/// fewer than the limit.
///
/// A key that holds no permit holds no memory for long: its entry is
/// removed by the sweep (automatic, paced by the creation of new entries,
/// or [`sweep`](Self::sweep)). The automatic sweep removes only keys idle
/// since its previous pass (a key taken at least once a pass stays), and
/// a flood of keys each taking and giving back a permit keeps a bounded
/// number of entries (at most 12,288 idle ones, plus the keys holding
/// permits), and
/// [`with_max_keys`](Self::with_max_keys) caps the entries outright.
///
/// # Locking behaviour
///
/// Each key's count is one atomic word in a map of 256 shards, each a
/// hashbrown table behind a read-write lock. Taking a permit of a key
/// already in the map holds its shard's read lock for one
/// compare-and-swap; giving it back is one atomic subtraction and takes
/// no lock (unless callers are waiting for the key). A refusal writes no
/// shared memory. Only a key's first permit takes its shard's write lock.
///
/// # Examples
///
/// ```
/// use keyrate::{ConcurrencyDenial, ConcurrencyLimiter};
///
/// let limiter = ConcurrencyLimiter::new(2); // 2 streams per key at once
/// let a = limiter.try_acquire("tenant-1").unwrap();
/// let _b = limiter.try_acquire("tenant-1").unwrap();
/// assert_eq!(
///     limiter.try_acquire("tenant-1").unwrap_err(),
///     ConcurrencyDenial::AtLimit { held: 2, max: 2 }
/// );
/// let _other = limiter.try_acquire("tenant-2").unwrap(); // its own limit
/// drop(a); // a stream ends
/// let _c = limiter.try_acquire("tenant-1").unwrap();
/// // A plan's own limit, per call:
/// let _d = limiter.try_acquire_under("tenant-1", 3).unwrap();
/// ```
pub struct ConcurrencyLimiter<K = String, S = DefaultHasher> {
    /// Each key's slot, shared with its permits and waiters.
    slots: Map<K, Arc<Slot>, S>,
    /// The default limit, for calls that name none: `1..=u32::MAX`.
    max: AtomicU32,
    /// The sweep of idle entries, and the cap on entries.
    sweeper: Sweeper,
    /// Outcomes and waiters, for `stats`.
    counters: Counters,
}

/// # Constructors for `String` keys
impl ConcurrencyLimiter<String, DefaultHasher> {
    /// A limiter for `String` keys: at most `max` permits per key at once.
    ///
    /// # Panics
    ///
    /// If `max` is 0 ([`ConfigError::ZeroMaxPermits`]); see
    /// [`try_new`](Self::try_new).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(4);
    /// assert_eq!(limiter.max(), 4);
    /// ```
    #[must_use]
    pub fn new(max: u32) -> Self {
        match Self::try_new(max) {
            Ok(limiter) => limiter,
            Err(err) => panic!("{err}"),
        }
    }

    /// A limiter for `String` keys, or why `max` is not accepted.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroMaxPermits`] if `max` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConcurrencyLimiter, ConfigError};
    ///
    /// let err = ConcurrencyLimiter::try_new(0).unwrap_err();
    /// assert_eq!(err, ConfigError::ZeroMaxPermits);
    /// assert!(err.to_string().contains("at least 1"));
    /// ```
    pub fn try_new(max: u32) -> Result<Self, ConfigError> {
        Self::try_with_hasher(max, DefaultHasher::default())
    }
}

/// # Constructors for any key type, and settings
impl<K: Hash + Eq, S: BuildHasher + Clone> ConcurrencyLimiter<K, S> {
    /// A limiter for keys of type `K`, hashed with `hasher`: at most `max`
    /// permits per key at once.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroMaxPermits`] if `max` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConcurrencyLimiter, DefaultHasher};
    ///
    /// let limiter: ConcurrencyLimiter<u64> =
    ///     ConcurrencyLimiter::try_with_hasher(1, DefaultHasher::default()).unwrap();
    /// let _p = limiter.try_acquire(&7).unwrap();
    /// assert!(limiter.try_acquire(&7).is_err());
    /// ```
    pub fn try_with_hasher(max: u32, hasher: S) -> Result<Self, ConfigError> {
        check_max(max)?;
        Ok(ConcurrencyLimiter {
            slots: Map::new(Store::Sharded, hasher, SHARDS),
            max: AtomicU32::new(max),
            sweeper: Sweeper::new(),
            counters: Counters::new(),
        })
    }

    /// Tracks at most `max_keys` keys: a key that holds no permit is then
    /// refused ([`ConcurrencyDenial::LimiterFull`]) while the limiter
    /// tracks `max_keys` (those holding permits, and idle ones the sweep
    /// has not removed yet: a refusal paces the sweep as a new key does).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConcurrencyDenial, ConcurrencyLimiter};
    ///
    /// let limiter = ConcurrencyLimiter::new(1).with_max_keys(1);
    /// let a = limiter.try_acquire("a").unwrap();
    /// assert_eq!(
    ///     limiter.try_acquire("b").unwrap_err(),
    ///     ConcurrencyDenial::LimiterFull { max_keys: 1 }
    /// );
    /// drop(a);
    /// assert_eq!(limiter.sweep(), 1); // "a" is idle: removed
    /// let _b = limiter.try_acquire("b").unwrap();
    /// ```
    #[must_use]
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.sweeper.max_keys = max_keys;
        self
    }

    /// The default limit: the permits a key may hold at once under the
    /// calls that name none.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = keyrate::ConcurrencyLimiter::new(3);
    /// assert_eq!(limiter.max(), 3);
    /// ```
    #[must_use]
    pub fn max(&self) -> u32 {
        // Relaxed: one word, read whole; a call that races `set_max` runs
        // under the old limit or the new one, each a limit that was set.
        self.max.load(Ordering::Relaxed)
    }

    /// Replaces the default limit, live: calls that start afterwards use
    /// it. Lowering it revokes nothing: permits held stay held, and new
    /// ones are refused until the key holds fewer than the new limit.
    /// Callers already waiting keep the limit they started under.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroMaxPermits`] if `max` is 0; the limit is then
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(2);
    /// let a = limiter.try_acquire("k").unwrap();
    /// let b = limiter.try_acquire("k").unwrap();
    /// limiter.set_max(1).unwrap(); // both stay held
    /// drop(a);
    /// assert!(limiter.try_acquire("k").is_err()); // 1 held, limit 1
    /// drop(b);
    /// let _c = limiter.try_acquire("k").unwrap();
    /// assert!(limiter.set_max(0).is_err());
    /// ```
    pub fn set_max(&self, max: u32) -> Result<(), ConfigError> {
        check_max(max)?;
        // Relaxed: see `max`.
        self.max.store(max, Ordering::Relaxed);
        Ok(())
    }
}

/// # What the limiter reports about itself
impl<K: Hash + Eq, S: BuildHasher + Clone> ConcurrencyLimiter<K, S> {
    /// The keys tracked: those holding permits or waited for, and idle
    /// ones the sweep has not removed yet.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = keyrate::ConcurrencyLimiter::new(1);
    /// let _p = limiter.try_acquire("k").unwrap();
    /// assert_eq!(limiter.len(), 1);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no key is tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(keyrate::ConcurrencyLimiter::new(1).is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Hash + Eq, S: BuildHasher + Clone> fmt::Debug for ConcurrencyLimiter<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiter")
            .field("max", &self.max())
            .field("keys", &self.len())
            .finish_non_exhaustive()
    }
}

fn check_max(max: u32) -> Result<(), ConfigError> {
    if max == 0 {
        return Err(ConfigError::ZeroMaxPermits);
    }
    Ok(())
}

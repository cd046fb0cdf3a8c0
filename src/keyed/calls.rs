//! The keyed calls: spend or read a key's bucket at a timestamp or at the
//! limiter's clock reading.

use super::TokenBucketLimiter;
use crate::bucket::{RETIRED, SHARED};
use crate::error::Denial;
use crate::gcra;
use crate::time::{nanos_from_duration, nanos_from_secs};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
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
}

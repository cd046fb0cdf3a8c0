//! `BucketHandle`: one key's bucket held by a long-lived caller.

use crate::bucket::{Bucket, SpendError};
use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::sync::Arc;
use crate::time::{nanos_from_duration, nanos_from_secs, Clock};

/// One key's bucket, held by a long-lived caller such as a connection.
///
/// Made by [`TokenBucketLimiter::bucket`]. Cloning a handle shares the same
/// bucket.
#[derive(Debug, Clone)]
pub struct BucketHandle {
    pub(super) quota: Quota,
    pub(super) bucket: Arc<Bucket>,
    /// Keeps the bucket from being evicted while any handle on it lives
    /// (see `Shared::pin`).
    pub(super) _pin: Arc<()>,
    /// The limiter's clock, for the `*_now` methods.
    pub(super) clock: std::sync::Arc<dyn Clock>,
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

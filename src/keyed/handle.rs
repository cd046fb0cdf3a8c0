//! `BucketHandle`: one key's bucket held by a long-lived caller; the handle
//! front end over the core in `calls`.

use crate::bucket::{Bucket, SpendError};
use crate::error::Denial;
use crate::gcra::Quota;
use crate::live_quota::LiveQuota;
use crate::observe::HandleTally;
use crate::sync::Arc;
use crate::time::Clock;

/// One key's bucket, held by a long-lived caller such as a connection.
///
/// Made by [`TokenBucketLimiter::bucket`](crate::TokenBucketLimiter::bucket).
/// Cloning a handle shares the same bucket.
#[derive(Debug, Clone)]
pub struct BucketHandle {
    /// The limiter's default quota, shared so that `set_quota` reaches
    /// handles too.
    pub(super) quota: std::sync::Arc<LiveQuota>,
    pub(super) bucket: Arc<Bucket>,
    /// Keeps the bucket from being evicted while any handle on it lives
    /// (see `Moved::pin`).
    pub(super) _pin: Arc<()>,
    /// The limiter's clock, for the `*_now` methods.
    pub(super) clock: std::sync::Arc<dyn Clock>,
    /// The limiter's stats and offender sketches, with this key.
    pub(super) tally: HandleTally,
}

/// # Calls at a caller's timestamp
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
        self.under(&self.quota.load()).allow_n(timestamp, cost)
    }

    /// Spends `cost` tokens at `timestamp`, or says why not; on success
    /// returns the whole tokens left.
    ///
    /// # Errors
    ///
    /// The same [`Denial`]s as
    /// [`TokenBucketLimiter::check`](crate::TokenBucketLimiter::check).
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
        self.under(&self.quota.load()).check(timestamp, cost)
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
        self.under(&self.quota.load()).remaining(timestamp)
    }

    /// Spends `cost` at `now` (validated nanoseconds) on the bucket, under
    /// `quota`.
    pub(super) fn charge(&self, now: u64, cost: u64, quota: &Quota) -> Result<u64, Denial> {
        // `None` is unreachable: eviction never retires a bucket that a live
        // handle pins (see `sweep`), and a moved bucket never moves again.
        // Fail closed rather than panic.
        SpendError::decision(self.bucket.spend(now, cost, quota))
            .unwrap_or(Err(Denial::InvalidTimestamp))
    }

    /// The bucket's word.
    pub(super) fn word(&self) -> u64 {
        self.bucket.word()
    }
}

/// # Calls at the limiter's clock reading
impl BucketHandle {
    /// [`allow`](Self::allow) at the limiter's clock reading.
    #[must_use]
    pub fn allow_now(&self) -> bool {
        self.allow_n_now(1)
    }

    /// [`allow_n`](Self::allow_n) at the limiter's clock reading.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ManualClock, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3).with_clock(ManualClock::new());
    /// let handle = limiter.bucket("k");
    /// assert!(handle.allow_n_now(3));
    /// assert!(!handle.allow_n_now(1));
    /// ```
    #[must_use]
    pub fn allow_n_now(&self, cost: u64) -> bool {
        self.under(&self.quota.load()).allow_n_now(cost)
    }

    /// [`check`](Self::check) at the limiter's clock reading.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub fn check_now(&self, cost: u64) -> Result<u64, Denial> {
        self.under(&self.quota.load()).check_now(cost)
    }

    /// [`remaining`](Self::remaining) at the limiter's clock reading.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ManualClock, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3).with_clock(ManualClock::new());
    /// let handle = limiter.bucket("k");
    /// assert!(handle.allow_now());
    /// assert_eq!(handle.remaining_now(), Some(2));
    /// ```
    #[must_use]
    pub fn remaining_now(&self) -> Option<u64> {
        self.under(&self.quota.load()).remaining_now()
    }
}

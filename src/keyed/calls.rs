//! The calls on a bucket, written once: the core that both front ends (keyed
//! calls on [`TokenBucketLimiter`] and a [`BucketHandle`](super::BucketHandle))
//! delegate to, and the keyed front end.

use super::TokenBucketLimiter;
use crate::bucket::{MOVED, RETIRED};
use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::time::{nanos_from_duration, Clock};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// The clock's reading in validated nanoseconds; `None` beyond
/// [`MAX_TIMESTAMP_NANOS`](crate::MAX_TIMESTAMP_NANOS).
pub(super) fn clock_nanos(clock: &dyn Clock) -> Option<u64> {
    nanos_from_duration(clock.now())
}

/// `charge` at `now` (`None`: an invalid timestamp, denied), with `now`
/// and the bucket's new word on success; `record` sees every decision.
#[inline]
fn decide_at(
    now: Option<u64>,
    charge: impl FnOnce(u64) -> Result<u64, Denial>,
    record: impl FnOnce(Option<u64>, Result<(), &Denial>),
) -> Result<(u64, u64), Denial> {
    let decided = match now {
        Some(now) => charge(now).map(|word| (now, word)),
        None => Err(Denial::InvalidTimestamp),
    };
    record(now, decided.as_ref().map(|_| ()));
    decided
}

/// `allow*`: whether `charge` admits the call at `now` (`None`: an invalid
/// timestamp, denied); `record` sees the decision.
#[inline]
pub(super) fn allow_at(
    now: Option<u64>,
    charge: impl FnOnce(u64) -> Result<u64, Denial>,
    record: impl FnOnce(Option<u64>, Result<(), &Denial>),
) -> bool {
    decide_at(now, charge, record).is_ok()
}

/// `check*`: `charge` at `now`, then the whole tokens left; `record` sees
/// the decision.
#[inline]
pub(super) fn check_at(
    now: Option<u64>,
    quota: &Quota,
    charge: impl FnOnce(u64) -> Result<u64, Denial>,
    record: impl FnOnce(Option<u64>, Result<(), &Denial>),
) -> Result<u64, Denial> {
    let (now, word) = decide_at(now, charge, record)?;
    Ok(gcra::tokens_at(word, now, quota))
}

/// `remaining*`: the whole tokens a bucket whose word is `word()` holds at
/// `now`.
pub(super) fn remaining_at(
    now: Option<u64>,
    quota: &Quota,
    word: impl FnOnce() -> u64,
) -> Option<u64> {
    let now = now?;
    match word() {
        // Retired buckets are full by construction.
        RETIRED => Some(quota.capacity()),
        word => Some(gcra::tokens_at(word, now, quota)),
    }
}

/// # Keyed calls at a caller's timestamp
///
/// Timestamps are `f64` seconds (see [`TokenBucketLimiter`]); every
/// method here is one line: the same call [`under`](Self::under) the
/// default quota, which is written once over the core above.
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
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
        self.under(&self.quota()).allow_n(key, timestamp, cost)
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
        self.under(&self.quota()).check(key, timestamp, cost)
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
        self.under(&self.quota()).remaining(key, timestamp)
    }

    /// The word of `key`'s bucket, wherever it lives; 0 (full) for a key
    /// without one.
    pub(super) fn word<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.buckets
            .read(key, |bucket| match bucket.word() {
                MOVED => self.moved.read(key, |moved| moved.bucket.word()),
                word => Some(word),
            })
            .flatten()
            .unwrap_or(0)
    }
}

/// # Keyed calls at the limiter's clock reading
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
        self.under(&self.quota()).allow_n_now(key, cost)
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
        self.under(&self.quota()).check_now(key, cost)
    }

    /// [`remaining`](Self::remaining) at the limiter's clock reading.
    #[must_use]
    pub fn remaining_now<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.under(&self.quota()).remaining_now(key)
    }
}

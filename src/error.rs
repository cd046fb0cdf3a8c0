//! Errors: invalid configurations and the reasons a call is denied.

use std::fmt;
use std::time::Duration;

/// A rate or capacity that keyrate cannot represent exactly.
///
/// Returned by [`TokenBucketLimiter::try_new`](crate::TokenBucketLimiter::try_new)
/// and [`Quota::new`](crate::Quota::new); its message says what was wrong and
/// what is accepted.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The rate is NaN, infinite, zero or negative.
    RateNotPositive {
        /// The rate given, in tokens per second.
        rate: f64,
    },
    /// The rate is finite and positive but outside the accepted range:
    /// one token takes less than 1 ns (above 1e9 tokens/s), or more than
    /// `2^63` ns (about 292 years) to refill.
    RateOutOfRange {
        /// The rate given, in tokens per second.
        rate: f64,
    },
    /// The rate is in range, but one token's refill, `1e9 / rate` ns, is
    /// not close enough to a whole number of nanoseconds: keyrate charges
    /// `interval_nanos` per token, which would serve the rate more than
    /// [`MAX_RATE_SHORTFALL`](crate::MAX_RATE_SHORTFALL) (0.1%) below what
    /// was asked. Only rates above 1e6 tokens/s can meet this.
    RateImprecise {
        /// The rate given, in tokens per second.
        rate: f64,
        /// The whole nanoseconds per token it would be charged.
        interval_nanos: u64,
    },
    /// A per-token interval under 1 ns or above `2^63 - 1` ns.
    IntervalOutOfRange {
        /// The interval given.
        interval: Duration,
    },
    /// The capacity is zero: such a bucket could never admit anything.
    ZeroCapacity,
    /// Refilling an empty bucket to `capacity` takes longer than the
    /// timestamp range (`2^63` ns, about 292 years).
    WindowTooLong {
        /// The capacity given, in tokens.
        capacity: u64,
        /// The rate given, in tokens per second.
        rate: f64,
    },
    /// A concurrency limit of 0 permits for a
    /// [`ConcurrencyLimiter`](crate::ConcurrencyLimiter)'s default: no key
    /// could ever hold a stream. (A per-call limit of 0 is accepted and
    /// refuses every call: a suspended plan.)
    ZeroMaxPermits,
    /// A [`Policy`](crate::Policy) with no quota: it would limit nothing.
    EmptyPolicy,
    /// A [`Policy`](crate::Policy) with more quotas than
    /// [`MAX_QUOTAS`](crate::MAX_QUOTAS).
    TooManyQuotas {
        /// The number of quotas given.
        count: usize,
    },
    /// A key-label secret ([`KeyLabels`](crate::KeyLabels)) shorter than
    /// [`MIN_LABEL_SECRET_LEN`](crate::MIN_LABEL_SECRET_LEN) bytes: labels
    /// made under it could be inverted by guessing it.
    SecretTooShort {
        /// The secret's length in bytes (never the secret).
        len: usize,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::RateNotPositive { rate } => write!(
                f,
                "invalid rate {rate}: the rate must be a finite number of tokens per second \
                 greater than zero (accepted: about 1.1e-10 to 1e9)"
            ),
            ConfigError::RateOutOfRange { rate } => write!(
                f,
                "invalid rate {rate} tokens/s: accepted rates are from about 1.1e-10 \
                 (one token per 2^63 ns) to 1e9 (one token per nanosecond)"
            ),
            ConfigError::RateImprecise {
                rate,
                interval_nanos,
            } => {
                let exact = 1e9 / rate;
                let served = 1e9 / interval_nanos as f64;
                write!(
                    f,
                    "imprecise rate {rate} tokens/s: one token every {exact:.4} ns would be \
                     charged {interval_nanos} whole ns and served at {served:.6e} tokens/s, \
                     {:.3}% below the rate (at most 0.1% is accepted, which every rate up to \
                     1e6 tokens/s meets). Use Quota::with_interval for an exact whole-ns \
                     interval ({} ns = {:.6e} tokens/s, or {interval_nanos} ns = {served:.6e}), \
                     or count coarser tokens (KiB instead of bytes)",
                    (1.0 - served / rate) * 100.0,
                    interval_nanos.saturating_sub(1).max(1),
                    1e9 / interval_nanos.saturating_sub(1).max(1) as f64,
                )
            }
            ConfigError::IntervalOutOfRange { interval } => write!(
                f,
                "invalid interval {interval:?}: one token's refill must be a whole number \
                 of nanoseconds from 1 ns to 2^63 - 1 ns"
            ),
            ConfigError::ZeroCapacity => {
                f.write_str("invalid capacity 0: the capacity must be at least 1 token")
            }
            ConfigError::ZeroMaxPermits => f.write_str(
                "invalid concurrency limit 0: a key's default limit must be at least 1 permit \
                 held at once (accepted: 1 to 2^32 - 1)",
            ),
            ConfigError::EmptyPolicy => f.write_str(
                "invalid policy: it has no quota (accepted: 1 to 8 quotas, such as 20/s \
                 burst 40 and 50,000/day)",
            ),
            ConfigError::TooManyQuotas { count } => write!(
                f,
                "invalid policy: {count} quotas, but a policy holds at most {} (accepted: 1 \
                 to {})",
                crate::MAX_QUOTAS,
                crate::MAX_QUOTAS
            ),
            ConfigError::SecretTooShort { len } => write!(
                f,
                "invalid key-label secret: {len} bytes, at least {} random bytes are needed",
                crate::MIN_LABEL_SECRET_LEN
            ),
            ConfigError::WindowTooLong { capacity, rate } => write!(
                f,
                "invalid capacity {capacity} at rate {rate} tokens/s: refilling the bucket \
                 would take longer than 2^63 ns (about 292 years); capacity / rate must be \
                 at most about 9.2e9 seconds"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a call was not admitted.
///
/// Every variant is a plain denial: the bucket is left exactly as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Denial {
    /// The bucket does not hold `cost` tokens now; it will after
    /// `retry_after` (if nothing else spends from it meanwhile).
    InsufficientTokens {
        /// How long until this cost would be admitted, to the nanosecond.
        retry_after: Duration,
    },
    /// The cost is larger than the bucket's capacity: it can never be
    /// admitted, however long the caller waits.
    ExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The bucket's capacity.
        capacity: u64,
    },
    /// The timestamp was NaN, infinite, negative or beyond the accepted
    /// range (see [`MAX_TIMESTAMP_NANOS`](crate::MAX_TIMESTAMP_NANOS)).
    InvalidTimestamp,
    /// The key has no bucket yet and the limiter already holds its maximum
    /// number of buckets, none of which could be evicted (see
    /// [`TokenBucketLimiter::with_max_buckets`](crate::TokenBucketLimiter::with_max_buckets)).
    /// Keys that already have a bucket are unaffected.
    LimiterFull {
        /// The configured maximum number of buckets.
        max_buckets: usize,
    },
    /// The limiter could not decide, and refused rather than guess: a
    /// backend that could not be reached under a fail-closed policy, or a
    /// state the limiter's invariants rule out (reported, never
    /// silently admitted).
    Unavailable,
}

impl Denial {
    /// The wait until the same call would be admitted, if waiting can help.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    /// use std::time::Duration;
    ///
    /// let limiter = TokenBucketLimiter::new(2.0, 1);
    /// let _ = limiter.check("k", 0.0, 1).unwrap();
    /// let denial = limiter.check("k", 0.0, 1).unwrap_err();
    /// assert_eq!(denial.retry_after(), Some(Duration::from_millis(500)));
    /// ```
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            Denial::InsufficientTokens { retry_after } => Some(retry_after),
            _ => None,
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Denial::InsufficientTokens { retry_after } => {
                write!(f, "rate limited: retry after {retry_after:?}")
            }
            Denial::ExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the bucket capacity {capacity}: it can never be admitted"
            ),
            Denial::InvalidTimestamp => f.write_str(
                "invalid timestamp: expected finite, non-negative seconds below 2^63 ns",
            ),
            Denial::LimiterFull { max_buckets } => write!(
                f,
                "limiter full: it holds its maximum of {max_buckets} buckets and none is \
                 idle, so a new key cannot be admitted"
            ),
            Denial::Unavailable => {
                f.write_str("the limiter could not decide this call and refused it")
            }
        }
    }
}

impl std::error::Error for Denial {}

//! What a compound call comes to: the [`CompoundDecision`] of an admitted
//! call, or the [`CompoundDenial`] of a refused one.

use crate::time::Nanos;
use std::fmt;
use std::time::Duration;

/// An admitted compound call: the least that any of its quotas holds
/// after it, and which one that is.
///
/// # Examples
///
/// ```
/// use keyrate::{CompoundLimiter, Policy, Quota};
///
/// let policy = Policy::new([Quota::new(10.0, 20).unwrap(), Quota::new(1.0, 5).unwrap()]).unwrap();
/// let limiter = CompoundLimiter::new();
/// let decision = limiter.check("k", &policy, 0.0, 2).unwrap();
/// assert_eq!(decision.remaining(), 3); // min(20 - 2, 5 - 2)
/// assert_eq!((decision.scope(), decision.quota()), (0, 1));
/// assert_eq!(decision.limit(), 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct CompoundDecision {
    pub(crate) remaining: u64,
    pub(crate) limit: u64,
    pub(crate) scope: usize,
    /// Below [`MAX_QUOTAS`](super::policy::MAX_QUOTAS).
    pub(crate) quota: u8,
    /// Kept in nanoseconds, turned into a `Duration` when read: a decision
    /// is made on every call and read far less often.
    pub(crate) reset_after: Nanos,
    /// How long until the bucket holding the least is full again.
    pub(crate) quota_reset_after: Nanos,
    /// Admitted by a Redis limiter's failure policy: Redis could not decide.
    pub(crate) degraded: bool,
}

impl CompoundDecision {
    /// The whole tokens left in the emptiest bucket: the least over every
    /// quota of every scope of the call.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The capacity of the quota that holds the least.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The index, in the call's list of scopes, of the scope whose quota
    /// holds the least (the first such, on a tie).
    #[must_use]
    pub fn scope(&self) -> usize {
        self.scope
    }

    /// The index, in that scope's policy, of the quota that holds the least.
    #[must_use]
    pub fn quota(&self) -> usize {
        usize::from(self.quota)
    }

    /// How long until every bucket the call charged is full again, if
    /// nothing else spends from them.
    #[must_use]
    pub fn reset_after(&self) -> Duration {
        self.reset_after.into()
    }

    /// How long until the bucket that holds the least (quota
    /// [`quota`](Self::quota) of scope [`scope`](Self::scope)) is full
    /// again, if nothing else spends from it: what a `RateLimit` header
    /// naming that quota reports.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    /// use std::time::Duration;
    ///
    /// let policy = Policy::new([Quota::new(1.0, 2).unwrap(), Quota::new(0.1, 10).unwrap()]).unwrap();
    /// let decision = CompoundLimiter::new().check("k", &policy, 0.0, 1).unwrap();
    /// assert_eq!((decision.remaining(), decision.quota()), (1, 0));
    /// assert_eq!(decision.quota_reset_after(), Duration::from_secs(1));
    /// assert_eq!(decision.reset_after(), Duration::from_secs(10)); // the second quota's
    /// ```
    #[must_use]
    pub fn quota_reset_after(&self) -> Duration {
        self.quota_reset_after.into()
    }

    /// Whether the call was admitted without a decision: a Redis limiter
    /// whose `FailurePolicy` is `Open` could not
    /// reach Redis. Its counts are then the capacity of the scope's first
    /// smallest quota, not a bucket's. Always false in memory.
    #[must_use]
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }
}

/// Why a compound call was not admitted. Every variant spent nothing: no
/// bucket word was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompoundDenial {
    /// Some bucket does not hold the cost now. After `retry_after` every
    /// bucket of the call holds it (if nothing else spends meanwhile):
    /// the latest of their waits, to the nanosecond, which is that of
    /// quota `quota` of scope `scope` (the first such, on a tie).
    InsufficientTokens {
        /// How long until the call would be admitted.
        retry_after: Duration,
        /// The index of the binding scope in the call's list.
        scope: usize,
        /// The index of the binding quota in that scope's policy.
        quota: usize,
    },
    /// The cost is above the capacity of quota `quota` of scope `scope`
    /// (the first such): it can never be admitted.
    ExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// That quota's capacity.
        capacity: u64,
        /// The index of the scope in the call's list.
        scope: usize,
        /// The index of the quota in that scope's policy.
        quota: usize,
    },
    /// The timestamp was NaN, infinite, negative or beyond the accepted
    /// range (see [`MAX_TIMESTAMP_NANOS`](crate::MAX_TIMESTAMP_NANOS)).
    InvalidTimestamp,
    /// A key of the call has no bucket yet and the limiter holds its
    /// maximum of keys: the call's sweep freed no place, or another
    /// call's new key took it (see
    /// [`CompoundLimiter::with_max_keys`](crate::CompoundLimiter::with_max_keys)).
    LimiterFull {
        /// The configured maximum number of keys.
        max_keys: usize,
    },
    /// Scopes `first` and `second` of the call name the same key: a call
    /// charges each key once.
    DuplicateKey {
        /// The earlier scope's index.
        first: usize,
        /// The later scope's index.
        second: usize,
    },
    /// The call named no scope.
    NoScopes,
    /// Redis limiters only: the Redis names of scopes `first` and `second`
    /// fall in different Redis Cluster hash slots, so one script cannot
    /// charge both atomically. Place a call's buckets in one slot (see
    /// `RedisLimiter::placed`).
    CrossSlot {
        /// The earlier scope's index.
        first: usize,
        /// The later scope's index.
        second: usize,
    },
}

impl CompoundDenial {
    /// The wait until the same call would be admitted, if waiting can help.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    /// use std::time::Duration;
    ///
    /// let policy = Policy::from(Quota::new(2.0, 1).unwrap());
    /// let limiter = CompoundLimiter::new();
    /// let _ = limiter.check("k", &policy, 0.0, 1).unwrap();
    /// let denial = limiter.check("k", &policy, 0.0, 1).unwrap_err();
    /// assert_eq!(denial.retry_after(), Some(Duration::from_millis(500)));
    /// ```
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            CompoundDenial::InsufficientTokens { retry_after, .. } => Some(retry_after),
            _ => None,
        }
    }

    /// The `(scope, quota)` that bound the denial, for a denial by a quota.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    ///
    /// let policy = Policy::new([Quota::new(1.0, 10).unwrap(), Quota::new(1.0, 2).unwrap()]).unwrap();
    /// let limiter = CompoundLimiter::new();
    /// let denial = limiter.check("k", &policy, 0.0, 3).unwrap_err();
    /// assert_eq!(denial.binding(), Some((0, 1)));
    /// ```
    #[must_use]
    pub fn binding(&self) -> Option<(usize, usize)> {
        match *self {
            CompoundDenial::InsufficientTokens { scope, quota, .. }
            | CompoundDenial::ExceedsCapacity { scope, quota, .. } => Some((scope, quota)),
            _ => None,
        }
    }
}

impl fmt::Display for CompoundDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CompoundDenial::InsufficientTokens {
                retry_after,
                scope,
                quota,
            } => write!(
                f,
                "rate limited by quota {quota} of scope {scope}: retry after {retry_after:?}"
            ),
            CompoundDenial::ExceedsCapacity {
                cost,
                capacity,
                scope,
                quota,
            } => write!(
                f,
                "cost {cost} exceeds the capacity {capacity} of quota {quota} of scope \
                 {scope}: it can never be admitted"
            ),
            CompoundDenial::InvalidTimestamp => f.write_str(
                "invalid timestamp: expected finite, non-negative seconds below 2^63 ns",
            ),
            CompoundDenial::LimiterFull { max_keys } => write!(
                f,
                "limiter full: it holds its maximum of {max_keys} keys and this call \
                 could free none, so a new key cannot be admitted"
            ),
            CompoundDenial::DuplicateKey { first, second } => write!(
                f,
                "scopes {first} and {second} name the same key: a call charges each key once"
            ),
            CompoundDenial::NoScopes => {
                f.write_str("the call names no scope: it needs at least one (key, policy)")
            }
            CompoundDenial::CrossSlot { first, second } => write!(
                f,
                "scopes {first} and {second} are stored in different Redis Cluster hash \
                 slots: place the call's buckets in one slot (RedisLimiter::placed)"
            ),
        }
    }
}

impl std::error::Error for CompoundDenial {}

//! Why a permit was not given.

use crate::error::Denial;
use std::fmt;
use std::time::Duration;

/// Why a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter) gave no permit.
///
/// Every variant leaves the limiter as it was: no permit is held for the
/// call, and (for the combined call) no token spent.
///
/// # Examples
///
/// ```
/// use keyrate::{ConcurrencyDenial, ConcurrencyLimiter};
///
/// let limiter = ConcurrencyLimiter::new(1);
/// let _stream = limiter.try_acquire("k").unwrap();
/// let denial = limiter.try_acquire("k").unwrap_err();
/// assert_eq!(denial, ConcurrencyDenial::AtLimit { held: 1, max: 1 });
/// assert_eq!(denial.to_string(), "concurrency limit: 1 of 1 permits held");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConcurrencyDenial {
    /// The key holds `held` permits and may hold `max` at once; or callers
    /// are queued for its next permit (an immediate call never overtakes
    /// them), in which case `held` may be below `max` for an instant.
    /// A per-call `max` of 0 always answers this.
    AtLimit {
        /// The permits the key held when refused.
        held: u32,
        /// The limit the call was made under.
        max: u32,
    },
    /// The key holds no permit and the limiter already tracks its maximum
    /// of keys (see
    /// [`with_max_keys`](crate::ConcurrencyLimiter::with_max_keys)); keys
    /// that hold permits are unaffected.
    LimiterFull {
        /// The configured maximum number of keys.
        max_keys: usize,
    },
    /// A wait for a permit ended after `waited` without one
    /// (`acquire`, `acquire_blocking`).
    TimedOut {
        /// The permits the key held when the wait ended.
        held: u32,
        /// The limit the call was made under.
        max: u32,
        /// The wait asked for.
        waited: Duration,
    },
    /// The combined call
    /// ([`try_acquire_with`](crate::ConcurrencyLimiter::try_acquire_with))
    /// found a free permit, but the rate limiter refused the token: the
    /// permit was given back.
    RateLimited(Denial),
}

impl fmt::Display for ConcurrencyDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConcurrencyDenial::AtLimit { held, max } => {
                write!(f, "concurrency limit: {held} of {max} permits held")
            }
            ConcurrencyDenial::LimiterFull { max_keys } => write!(
                f,
                "concurrency limiter full: it tracks its maximum of {max_keys} keys, so a \
                 new key cannot hold a permit"
            ),
            ConcurrencyDenial::TimedOut { held, max, waited } => write!(
                f,
                "no permit within {waited:?}: {held} of {max} permits held"
            ),
            ConcurrencyDenial::RateLimited(denial) => write!(f, "{denial}"),
        }
    }
}

impl std::error::Error for ConcurrencyDenial {}

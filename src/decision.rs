//! What a call comes to: the [`Decision`] of an admitted call, and the
//! [`Refusal`] every backend's error is.

use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::time::Nanos;
use std::fmt;
use std::time::Duration;

/// An admitted call: what its bucket holds after it.
///
/// Computed only when asked: a call that only needs to know it was
/// admitted (`allow`) pays for none of it.
///
/// # Examples
///
/// ```
/// use keyrate::TokenBucketLimiter;
/// use std::time::Duration;
///
/// let limiter = TokenBucketLimiter::new(1.0, 3);
/// let decision = limiter.check("k", 0.0, 2).unwrap();
/// assert_eq!(decision.remaining(), 1);
/// assert_eq!(decision.limit(), 3);
/// assert_eq!(decision.reset_after(), Duration::from_secs(2)); // full again at 2 s
/// ```
#[derive(Clone, Copy, PartialEq)]
#[must_use]
pub struct Decision {
    /// The instant the bucket is full again after the call.
    full_at: Nanos,
    /// The instant the call was decided at.
    now: Nanos,
    /// The quota it was decided under.
    quota: Quota,
    /// Admitted by the failure policy: the backend could not decide.
    degraded: bool,
}

impl Decision {
    /// The bucket's state after an admitted call: its word `full_at` at
    /// `now` under `quota`.
    #[inline(always)]
    pub(crate) fn new(full_at: Nanos, now: Nanos, quota: &Quota) -> Decision {
        Decision {
            full_at,
            now,
            quota: *quota,
            degraded: false,
        }
    }

    /// An admission by a fail-open policy: nothing is known of the bucket;
    /// it reports a full one.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn degraded(quota: &Quota) -> Decision {
        Decision {
            full_at: Nanos::ZERO,
            now: Nanos::ZERO,
            quota: *quota,
            degraded: true,
        }
    }

    /// The whole tokens the bucket holds after the call.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        gcra::tokens_at(self.full_at, self.now, &self.quota)
    }

    /// The capacity of the quota the call was decided under (the
    /// `RateLimit-Policy` `q`).
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.quota.capacity()
    }

    /// The quota the call was decided under.
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// How long until the bucket is full again, to the nanosecond, if
    /// nothing else spends from it.
    #[must_use]
    pub fn reset_after(&self) -> Duration {
        self.full_at.saturating_sub(self.now).into()
    }

    /// Whether the backend could not decide and its failure policy
    /// admitted the call (Redis with [`FailurePolicy::Open`](crate::FailurePolicy)).
    /// The other fields then describe a full bucket, not a measured one.
    #[must_use]
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("remaining", &self.remaining())
            .field("limit", &self.limit())
            .field("reset_after", &self.reset_after())
            .field("degraded", &self.degraded)
            .finish()
    }
}

/// What a backend's error says: the [`Denial`], when the backend decided,
/// or nothing, when it could not (Redis unreachable under a fail-closed
/// policy).
///
/// In memory the error is [`Denial`] itself; on Redis it is
/// `RedisDenial`, which adds the backend's failure.
pub trait Refusal: std::error::Error + Send + Sync + 'static {
    /// The denial, if the backend decided the call.
    fn denial(&self) -> Option<&Denial>;

    /// The wait after which the same call would be admitted, if waiting
    /// can help.
    fn retry_after(&self) -> Option<Duration> {
        self.denial().and_then(Denial::retry_after)
    }
}

impl Refusal for Denial {
    #[inline]
    fn denial(&self) -> Option<&Denial> {
        Some(self)
    }
}

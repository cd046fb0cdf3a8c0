//! A permit backed by a lease in Redis, and why one was not given.

use super::renew::{Lease, RenewHandle};
use crate::concurrency::ConcurrencyDenial;
use crate::redis::error::RedisLimiterError;
use std::fmt;
use std::time::Duration;

/// One permit of a key from a
/// [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter): a lease in
/// Redis, renewed by this process's renewal task while the permit lives,
/// and released when it is dropped.
///
/// Dropping it never blocks: the release is queued to the renewal task,
/// which sends it to Redis (one `ZREM`) at once. The permit may outlive
/// its limiter and move to any task or thread; the renewal task lives on
/// until the limiter and its last permit are gone. If the process dies,
/// or the tokio runtime that ran the renewal task shuts down, the lease
/// is no longer renewed and expires within the lease time.
///
/// A permit given by the failure policy while Redis could not decide
/// ([`FailurePolicy::Open`](crate::FailurePolicy::Open)) holds no lease:
/// [`is_degraded`](Self::is_degraded) is true, and dropping it does
/// nothing.
///
/// # Examples
///
/// ```
/// use keyrate::RedisConcurrencyLimiter;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("KEYRATE_REDIS_URL")?;
/// let limiter = RedisConcurrencyLimiter::connect(&url, 2).await?;
/// let permit = limiter.try_acquire("k").await?;
/// assert_eq!(permit.held(), 1);
/// assert!(!permit.is_degraded());
/// assert!(permit.acquired_at().is_some()); // Redis's clock
/// drop(permit); // queued to the renewal task: never blocks
/// # Ok(())
/// # }
/// ```
#[must_use = "a permit is released as soon as it is dropped"]
pub struct RedisPermit {
    /// `None` for a degraded permit, or once released.
    lease: Option<Lease>,
    /// The task that renews and releases the lease.
    renewer: Option<RenewHandle>,
    held: u32,
    acquired_at: Option<Duration>,
}

impl RedisPermit {
    pub(super) fn leased(lease: Lease, renewer: RenewHandle, held: u32, now_ms: u64) -> Self {
        RedisPermit {
            lease: Some(lease),
            renewer: Some(renewer),
            held,
            acquired_at: Some(Duration::from_millis(now_ms)),
        }
    }

    pub(super) fn degraded() -> Self {
        RedisPermit {
            lease: None,
            renewer: None,
            held: 0,
            acquired_at: None,
        }
    }

    /// The leases the key held in Redis right after this one was taken,
    /// this one included, over every process (0 for a degraded permit).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 3).await?;
    /// let _a = limiter.try_acquire("k").await?;
    /// let b = limiter.try_acquire("k").await?;
    /// assert_eq!(b.held(), 2);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn held(&self) -> u32 {
        self.held
    }

    /// Whether this permit was given by the failure policy without a
    /// lease, because Redis could not decide.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 1).await?;
    /// assert!(!limiter.try_acquire("k").await?.is_degraded());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn is_degraded(&self) -> bool {
        self.acquired_at.is_none()
    }

    /// When Redis admitted the lease, as a duration since the Unix epoch
    /// on Redis's own clock (`TIME`, to the millisecond); `None` for a
    /// degraded permit. The lease expired, unless renewed, one lease time
    /// later.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 1).await?;
    /// let permit = limiter.try_acquire("k").await?;
    /// assert!(permit.acquired_at().unwrap().as_secs() > 1_600_000_000);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn acquired_at(&self) -> Option<Duration> {
        self.acquired_at
    }
}

impl Drop for RedisPermit {
    fn drop(&mut self) {
        if let (Some(lease), Some(renewer)) = (self.lease.take(), &self.renewer) {
            renewer.release(lease, true);
        }
    }
}

impl fmt::Debug for RedisPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No key: a permit need not show it.
        f.debug_struct("RedisPermit")
            .field("held", &self.held)
            .field("degraded", &self.is_degraded())
            .field("acquired_at", &self.acquired_at)
            .finish()
    }
}

/// Why a [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter) gave
/// no permit: the limit (the in-memory limiter's [`ConcurrencyDenial`],
/// `AtLimit { held, max }` with `held` counted over every process), or
/// Redis's failure under [`FailurePolicy::Closed`](crate::FailurePolicy::Closed).
///
/// # Examples
///
/// ```
/// use keyrate::{ConcurrencyDenial, RedisConcurrencyDenial};
///
/// let denial = RedisConcurrencyDenial::from(ConcurrencyDenial::AtLimit { held: 2, max: 2 });
/// assert_eq!(denial.denial(), Some(&ConcurrencyDenial::AtLimit { held: 2, max: 2 }));
/// assert_eq!(denial.to_string(), "concurrency limit: 2 of 2 permits held");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisConcurrencyDenial {
    /// The key holds its limit (or the call's limit was 0). Nothing is held
    /// for the call.
    Denied(ConcurrencyDenial),
    /// Redis could not decide and the failure policy is closed. A timeout
    /// may have come after the lease was taken: it is then released (or
    /// expires within the lease time).
    Failed(RedisLimiterError),
}

impl RedisConcurrencyDenial {
    /// The limit's denial, if the limit refused (not a failure).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConcurrencyDenial, RedisConcurrencyDenial};
    ///
    /// let denial = RedisConcurrencyDenial::Denied(ConcurrencyDenial::AtLimit { held: 0, max: 0 });
    /// assert!(denial.denial().is_some());
    /// ```
    #[must_use]
    pub fn denial(&self) -> Option<&ConcurrencyDenial> {
        match self {
            RedisConcurrencyDenial::Denied(denial) => Some(denial),
            RedisConcurrencyDenial::Failed(_) => None,
        }
    }
}

impl From<ConcurrencyDenial> for RedisConcurrencyDenial {
    fn from(denial: ConcurrencyDenial) -> Self {
        RedisConcurrencyDenial::Denied(denial)
    }
}

impl From<RedisLimiterError> for RedisConcurrencyDenial {
    fn from(err: RedisLimiterError) -> Self {
        RedisConcurrencyDenial::Failed(err)
    }
}

impl fmt::Display for RedisConcurrencyDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConcurrencyDenial::Denied(denial) => denial.fmt(f),
            RedisConcurrencyDenial::Failed(err) => write!(f, "refused (fail closed): {err}"),
        }
    }
}

impl std::error::Error for RedisConcurrencyDenial {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisConcurrencyDenial::Denied(denial) => Some(denial),
            RedisConcurrencyDenial::Failed(err) => Some(err),
        }
    }
}

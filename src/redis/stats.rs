//! The Redis limiters' counters: the same [`Stats`] as the in-memory
//! limiter, counted per thread in this process, plus backend errors.

use super::settings::Settings;
use super::{BlockingRedisLimiter, RedisLimiter, RedisLimiterError};
use crate::error::Denial;
use crate::observe::{Cell, Stats};

/// What a front end's `decide` returns.
type Outcome = Result<Result<u64, Denial>, RedisLimiterError>;

impl Settings {
    /// Counts a decided call of `cost` (or a failed round trip), and
    /// passes it on.
    pub(super) fn record(&self, cost: u64, outcome: Outcome) -> Outcome {
        match &outcome {
            Ok(decision) => self.counters.decided(cost, decision.as_ref().map(|_| ())),
            Err(_) => self.counters.add(Cell::BackendErrors, 1),
        }
        outcome
    }
}

impl<C> RedisLimiter<C> {
    /// This process's calls on this limiter (and its clones), counted:
    /// admitted, denied by reason, and failed round trips
    /// ([`Stats::backend_errors`], decided by the failure policy). Buckets
    /// and sweeps live in Redis and are not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 2)?).await?
    ///     .with_prefix(format!("doc-stats-{}:", std::process::id()));
    /// assert!(!limiter.allow_n("k", 0.0, 3).await);
    /// assert_eq!(limiter.stats().denied_exceeds_capacity, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.settings.counters.read()
    }
}

impl BlockingRedisLimiter {
    /// As [`RedisLimiter::stats`].
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.settings.counters.read()
    }
}

#[cfg(feature = "prometheus")]
impl<C: Send + Sync> crate::prometheus::Observe for RedisLimiter<C> {
    fn stats(&self) -> Stats {
        RedisLimiter::stats(self)
    }
}

#[cfg(feature = "prometheus")]
impl crate::prometheus::Observe for BlockingRedisLimiter {
    fn stats(&self) -> Stats {
        BlockingRedisLimiter::stats(self)
    }
}

//! What a Redis concurrency limiter reports about itself: its settings,
//! its names in Redis, its counts.

use super::{RedisConcurrencyLimiter, RedisConcurrencyStats};
use crate::redis::breaker::CircuitStats;
use crate::redis::error::FailurePolicy;
use crate::sync::unmodeled::Relaxed;
use std::time::Duration;

/// # What the limiter reports about itself
impl<C> RedisConcurrencyLimiter<C> {
    /// The default limit: the permits a key may hold at once under the
    /// calls that name none.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 4).await?;
    /// assert_eq!(limiter.max(), 4);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn max(&self) -> u32 {
        self.core.max.load(Relaxed)
    }

    /// The lease time: how long a lease lives without a renewal.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 4).await?;
    /// assert_eq!(limiter.lease_time(), keyrate::DEFAULT_LEASE_TIME);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn lease_time(&self) -> Duration {
        self.settings.lease
    }

    /// The policy applied when Redis cannot decide an acquire.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 4).await?;
    /// assert_eq!(limiter.failure_policy(), keyrate::FailurePolicy::Closed);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn failure_policy(&self) -> FailurePolicy {
        self.settings.failure_policy
    }

    /// The namespace, as given to [`with_namespace`](Self::with_namespace)
    /// (or the private one made for this limiter).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 4).await?;
    /// assert!(limiter.namespace().starts_with("keyrate-private-"));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn namespace(&self) -> &str {
        self.settings.names.namespace()
    }

    /// The Redis key of `key`'s lease set: a sorted set of lease ids
    /// scored by their expiry, in Unix milliseconds on Redis's clock.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 4).await?
    ///     .with_namespace("streams", keyrate::KeyNames::Encoded);
    /// assert_eq!(limiter.lease_key("k"), "streams~|k");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn lease_key(&self, key: &str) -> String {
        self.settings.names.bucket_key(key)
    }

    /// What every lease set name of this limiter starts with (no glob
    /// character: `SCAN 0 MATCH <prefix>*` lists them).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 4).await?
    ///     .with_namespace("streams", keyrate::KeyNames::Encoded);
    /// assert_eq!(limiter.lease_key_prefix(), "streams~|");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn lease_key_prefix(&self) -> &str {
        self.settings.names.head()
    }

    /// This process's counts (the limiter and its clones since it was
    /// last configured): permits held, acquires by outcome, releases,
    /// renewals and leases lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 1).await?;
    /// let _p = limiter.try_acquire("k").await?;
    /// assert!(limiter.try_acquire("k").await.is_err());
    /// let stats = limiter.stats();
    /// assert_eq!((stats.held, stats.acquired, stats.refused_at_limit), (1, 1, 1));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> RedisConcurrencyStats {
        self.core.counters.read()
    }

    /// The acquires' circuit breaker: its state and counters.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 4).await?;
    /// assert!(!limiter.circuit_stats().open);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn circuit_stats(&self) -> CircuitStats {
        self.settings.breaker.stats()
    }
}

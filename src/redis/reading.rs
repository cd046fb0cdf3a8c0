//! What a Redis limiter tells about itself: its quota (read and changed
//! live), its counters and circuit breaker, its failure policy, and the
//! Redis names of its buckets. `builder` makes and configures it.

use super::breaker::CircuitStats;
use super::error::FailurePolicy;
use super::limiter::RedisLimiter;
use crate::gcra::Quota;
use crate::observe::Stats;
use crate::under::Under;

impl<C> RedisLimiter<C> {
    /// The circuit breaker's state and counters (this limiter and its
    /// clones): whether it is open, how often it opened, the calls it
    /// failed fast, and its probes.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?;
    /// let circuit = limiter.circuit_stats();
    /// assert!(!circuit.open);
    /// assert_eq!((circuit.trips, circuit.fast_failures, circuit.probes), (0, 0, 0));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn circuit_stats(&self) -> CircuitStats {
        self.settings.breaker.stats()
    }

    /// The default quota: the one every call follows unless it names its
    /// own with [`under`](Self::under).
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.settings.quota.load()
    }

    /// Replaces the default quota for every later call of this limiter and
    /// its clones that names none. Buckets keep their time until full (the
    /// word in Redis), which the new quota turns into tokens: the same rule
    /// as [`TokenBucketLimiter::set_quota`](crate::TokenBucketLimiter::set_quota).
    pub fn set_quota(&self, quota: Quota) {
        self.settings.quota.store(quota);
    }

    /// The calls of this limiter under `quota` instead of the default one
    /// (a customer's plan), on the same buckets.
    #[must_use]
    pub fn under(&self, quota: &Quota) -> Under<'_, Self> {
        Under::new(self, *quota)
    }

    /// This process's calls on this limiter (and its clones), counted:
    /// admitted, denied by reason, and failed round trips
    /// ([`Stats::backend_errors`], decided by the failure policy). Buckets
    /// and sweeps live in Redis and are not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{AsyncLimiter, Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 2)?).await?
    ///     .with_namespace(format!("doc-stats-{}:", std::process::id()), keyrate::KeyNames::Encoded);
    /// assert!(!limiter.allow_n("k", 0.0, 3).await);
    /// assert_eq!(limiter.stats().denied_exceeds_capacity, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.settings.counters.read()
    }

    /// The policy applied when Redis cannot decide.
    #[must_use]
    pub fn failure_policy(&self) -> FailurePolicy {
        self.settings.failure_policy
    }

    /// The Redis key that holds `key`'s bucket (see
    /// [`with_namespace`](Self::with_namespace)): the name every call on
    /// `key` uses. Its value is the bucket's word: the Unix-or-caller-
    /// timeline instant, in nanoseconds, at which the bucket is full again.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?;
    /// // A private namespace, keys hashed: the key does not show.
    /// assert!(limiter.bucket_key("sk_live_1").starts_with(limiter.bucket_key_prefix()));
    /// assert!(!limiter.bucket_key("sk_live_1").contains("sk_live_1"));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn bucket_key(&self, key: &str) -> String {
        self.settings.bucket_key(key)
    }

    /// What every bucket name of this limiter starts with: the namespace
    /// and its separator. It holds no glob character, so
    /// `SCAN 0 MATCH <prefix>*` lists exactly this namespace's buckets.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?.with_namespace("rl", keyrate::KeyNames::Encoded);
    /// assert_eq!(limiter.bucket_key_prefix(), "rl|");
    /// assert_eq!(limiter.clone().with_hash_tag(true).bucket_key_prefix(), "{rl}|");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn bucket_key_prefix(&self) -> &str {
        self.settings.names.head()
    }

    /// The namespace, as given to [`with_namespace`](Self::with_namespace)
    /// (or the private one made for this limiter).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?;
    /// assert!(limiter.namespace().starts_with("keyrate-private-"));
    /// assert_eq!(limiter.with_namespace("rl:api", keyrate::KeyNames::Encoded).namespace(), "rl:api");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn namespace(&self) -> &str {
        self.settings.names.namespace()
    }
}

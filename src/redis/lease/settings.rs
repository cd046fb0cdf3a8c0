//! Making and configuring a Redis concurrency limiter.

use super::script::{ACQUIRE_SCRIPT, RENEW_SCRIPT};
use super::{Core, RedisConcurrencyLimiter};
use crate::error::ConfigError;
use crate::redis::breaker::{Breaker, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_PROBE_EVERY};
use crate::redis::builder::connect_manager;
use crate::redis::error::{FailurePolicy, RedisLimiterError};
use crate::redis::limiter::RedisLimiter;
use crate::redis::names::{KeyNames, Names};
use crate::redis::settings::DEFAULT_REDIS_TIMEOUT;
use crate::sync::unmodeled::Relaxed;
use ::redis::aio::ConnectionManager;
use ::redis::Script;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The shortest lease time accepted: renewals every 100 ms.
pub(super) const MIN_LEASE_TIME: Duration = Duration::from_millis(300);

/// The longest lease time accepted.
pub(super) const MAX_LEASE_TIME: Duration = Duration::from_secs(24 * 3600);

/// The settings of one limiter, cloned with it.
#[derive(Clone)]
pub(super) struct LeaseSettings {
    /// Lease set names: the rate limiter's scheme, marked as leases.
    pub(super) names: Arc<Names>,
    pub(super) lease: Duration,
    pub(super) timeout: Duration,
    pub(super) failure_policy: FailurePolicy,
    /// The acquires' circuit breaker, shared by clones.
    pub(super) breaker: Arc<Breaker>,
    pub(super) acquire: Arc<Script>,
    pub(super) renew: Arc<Script>,
}

impl fmt::Debug for LeaseSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseSettings")
            .field("names", &self.names)
            .field("lease", &self.lease)
            .field("timeout", &self.timeout)
            .field("failure_policy", &self.failure_policy)
            .finish_non_exhaustive()
    }
}

impl RedisConcurrencyLimiter<ConnectionManager> {
    /// Connects to the Redis at `url` as
    /// [`RedisLimiter::connect`](crate::RedisLimiter::connect) does (a
    /// [`ConnectionManager`] that reconnects by itself): at most `max`
    /// permits per key at once, by default.
    ///
    /// # Errors
    ///
    /// [`RedisErrorKind::Config`](crate::RedisErrorKind::Config) for `max`
    /// 0 or a bad URL; `Unavailable` or `Timeout` when no server answers.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{RedisConcurrencyLimiter, RedisErrorKind};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 20).await?;
    /// assert_eq!(limiter.max(), 20);
    /// let err = RedisConcurrencyLimiter::connect(&url, 0).await.unwrap_err();
    /// assert_eq!(err.kind(), RedisErrorKind::Config);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str, max: u32) -> Result<Self, RedisLimiterError> {
        if max == 0 {
            return Err(RedisLimiterError::config(
                ConfigError::ZeroMaxPermits.to_string(),
            ));
        }
        let connection = connect_manager(url).await?;
        Self::with_connection(connection, max)
            .map_err(|err| RedisLimiterError::config(err.to_string()))
    }
}

/// # Constructors and settings
impl<C> RedisConcurrencyLimiter<C> {
    /// A limiter over a connection of your choice (a multiplexed
    /// connection, a Redis Cluster connection): at most `max` permits per
    /// key at once, by default.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroMaxPermits`] if `max` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::RedisConcurrencyLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let client = redis::Client::open(url.as_str())?;
    /// let connection = client.get_multiplexed_async_connection().await?;
    /// let limiter = RedisConcurrencyLimiter::with_connection(connection, 2)?;
    /// let _p = limiter.try_acquire("k").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_connection(connection: C, max: u32) -> Result<Self, ConfigError> {
        if max == 0 {
            return Err(ConfigError::ZeroMaxPermits);
        }
        Ok(RedisConcurrencyLimiter {
            settings: LeaseSettings {
                names: Arc::new(Names::private().leases()),
                lease: super::DEFAULT_LEASE_TIME,
                timeout: DEFAULT_REDIS_TIMEOUT,
                failure_policy: FailurePolicy::default(),
                breaker: Arc::new(Breaker::new(
                    DEFAULT_BREAKER_FAILURES,
                    DEFAULT_BREAKER_PROBE_EVERY,
                )),
                acquire: Arc::new(Script::new(ACQUIRE_SCRIPT)),
                renew: Arc::new(Script::new(RENEW_SCRIPT)),
            },
            core: Arc::new(Core::new(max)),
            connection,
        })
    }

    /// The settings are for building: a limiter reconfigured gets a core
    /// (renewal task, counters) of its own, so that its task runs with
    /// its settings. Permits of the old one keep theirs.
    fn reconfigured(mut self) -> Self {
        self.core = Arc::new(Core::new(self.core.max.load(Relaxed)));
        self
    }

    /// Names this limiter's lease sets: `namespace`, then each key as
    /// `keys` says, as
    /// [`RedisLimiter::with_namespace`](crate::RedisLimiter::with_namespace)
    /// names buckets, with `~` before the separator. Every process that
    /// shares a limit must use the same three settings (namespace, keys,
    /// hash tag). Unnamed, a limiter has a private namespace.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{KeyNames, RedisConcurrencyLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2)
    ///     .await?
    ///     .with_namespace("streams", KeyNames::Encoded);
    /// assert_eq!(limiter.lease_key("k 1"), "streams~|k%201");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_namespace(mut self, namespace: impl AsRef<str>, keys: KeyNames) -> Self {
        let hash_tag = self.settings.names.hash_tag();
        let names = Names::new(namespace.as_ref(), keys, hash_tag).leases();
        self.settings.names = Arc::new(names);
        self.reconfigured()
    }

    /// Puts every lease set of this limiter in one Redis Cluster hash slot
    /// (default off), as
    /// [`RedisLimiter::with_hash_tag`](crate::RedisLimiter::with_hash_tag)
    /// does; a renewal round is then one call on a cluster too.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2).await?.with_hash_tag(true);
    /// assert!(limiter.lease_key("k").starts_with('{'));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_hash_tag(mut self, on: bool) -> Self {
        self.settings.names = Arc::new(self.settings.names.with_hash_tag(on));
        self.reconfigured()
    }

    /// Sets the lease time (default [`DEFAULT_LEASE_TIME`](crate::DEFAULT_LEASE_TIME)),
    /// kept between 300 ms and 24 hours: a lease not renewed expires this
    /// long after its last renewal, and leases are renewed every third of
    /// it. Shorter: a dead process's permits come back sooner, for more
    /// renewal calls (3 per lease time per process on a standalone Redis).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2).await?;
    /// let limiter = limiter.with_lease_time(Duration::from_secs(6));
    /// assert_eq!(limiter.lease_time(), Duration::from_secs(6));
    /// assert_eq!(limiter.with_lease_time(Duration::ZERO).lease_time(), Duration::from_millis(300));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_lease_time(mut self, lease: Duration) -> Self {
        self.settings.lease = lease.clamp(MIN_LEASE_TIME, MAX_LEASE_TIME);
        self.reconfigured()
    }

    /// Sets the deadline of each Redis call, acquires and background
    /// calls alike (default [`DEFAULT_REDIS_TIMEOUT`](crate::DEFAULT_REDIS_TIMEOUT),
    /// at least 1 ms).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2)
    ///     .await?
    ///     .with_timeout(Duration::from_millis(50));
    /// # let _ = limiter;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout.max(Duration::from_millis(1));
        self.reconfigured()
    }

    /// Sets what an acquire answers when Redis cannot decide (default
    /// [`FailurePolicy::Closed`]: refused; `Open`: a degraded permit,
    /// holding no lease).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{FailurePolicy, RedisConcurrencyLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2)
    ///     .await?
    ///     .with_failure_policy(FailurePolicy::Open);
    /// assert_eq!(limiter.failure_policy(), FailurePolicy::Open);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.settings.failure_policy = policy;
        self
    }

    /// Sets the acquires' circuit breaker, as
    /// [`RedisLimiter::with_circuit_breaker`](crate::RedisLimiter::with_circuit_breaker)
    /// (default: opens after 5 failed round trips in a row, probes every
    /// 50 ms; `failures` 0 turns it off). Renewals and releases go around
    /// it: they answer no caller.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2)
    ///     .await?
    ///     .with_circuit_breaker(3, Duration::from_millis(20));
    /// assert!(!limiter.circuit_stats().open);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_circuit_breaker(mut self, failures: u32, probe_every: Duration) -> Self {
        self.settings.breaker = Arc::new(Breaker::new(failures, probe_every));
        self
    }

    /// Shares `rate`'s circuit breaker: the rate limiter's calls and this
    /// limiter's acquires then see Redis's health together (one opens it
    /// for both, one probe closes it for both). Use it when both talk to
    /// the same Redis.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisConcurrencyLimiter, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let rate = RedisLimiter::connect(&url, Quota::new(10.0, 20)?).await?;
    /// let streams = RedisConcurrencyLimiter::connect(&url, 2)
    ///     .await?
    ///     .with_circuit_breaker_of(&rate);
    /// assert_eq!(streams.circuit_stats(), rate.circuit_stats());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_circuit_breaker_of<D>(mut self, rate: &RedisLimiter<D>) -> Self {
        self.settings.breaker = Arc::clone(&rate.settings.breaker);
        self
    }

    /// Replaces the default limit for later calls of this limiter and its
    /// clones. Lowering it revokes nothing: leases held stay held, and new
    /// ones are refused until the key holds fewer.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroMaxPermits`] for 0; the limit is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2).await?;
    /// limiter.set_max(5)?;
    /// assert_eq!(limiter.max(), 5);
    /// assert!(limiter.set_max(0).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_max(&self, max: u32) -> Result<(), ConfigError> {
        if max == 0 {
            return Err(ConfigError::ZeroMaxPermits);
        }
        self.core.max.store(max, Relaxed);
        Ok(())
    }
}

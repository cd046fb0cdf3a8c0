//! The blocking twin of [`RedisLimiter`](super::RedisLimiter), for threads
//! that are not in an async runtime.

use super::call::Step;
use super::script::Now;
use super::settings::Settings;
use super::{FailurePolicy, RedisErrorKind, RedisLimiterError};
use crate::error::Denial;
use crate::gcra::Quota;
use crate::keyed::Under;
use ::redis::{Client, Connection};
use parking_lot::Mutex;
use std::fmt;
use std::time::Duration;

/// [`RedisLimiter`](crate::RedisLimiter) without async: the same decisions
/// and the same script, over one plain connection.
///
/// Calls on one limiter take turns on its connection; give each thread its
/// own limiter (they share the buckets through Redis) for parallel calls.
/// After a connection error or a timeout the connection is dropped, and the
/// next call opens a new one: reconnection is automatic. A timeout bounds
/// each socket read and write, so one call waits at most about twice the
/// timeout.
///
/// # Examples
///
/// ```
/// use keyrate::{BlockingRedisLimiter, Quota};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
/// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
/// let limiter = BlockingRedisLimiter::connect(&url, Quota::new(1.0, 3)?)?.with_prefix(prefix);
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(!limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 2.0));
/// # Ok(())
/// # }
/// ```
pub struct BlockingRedisLimiter {
    pub(super) settings: Settings,
    client: Client,
    /// The open connection; `None` after a failure, until the next call
    /// reconnects.
    connection: Mutex<Option<Connection>>,
}

impl BlockingRedisLimiter {
    /// Connects to the Redis at `url` (such as `redis://127.0.0.1:6379`).
    ///
    /// # Errors
    ///
    /// [`RedisErrorKind::Config`] for a URL that is not a Redis URL;
    /// [`RedisErrorKind::Unavailable`] or [`RedisErrorKind::Timeout`] when
    /// no server answers within
    /// [`DEFAULT_REDIS_TIMEOUT`](crate::DEFAULT_REDIS_TIMEOUT).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{BlockingRedisLimiter, Quota, RedisErrorKind};
    ///
    /// let err = BlockingRedisLimiter::connect("nonsense", Quota::new(1.0, 1).unwrap())
    ///     .unwrap_err();
    /// assert_eq!(err.kind(), RedisErrorKind::Config);
    /// ```
    pub fn connect(url: &str, quota: Quota) -> Result<Self, RedisLimiterError> {
        let limiter = BlockingRedisLimiter {
            settings: Settings::new(quota),
            client: Client::open(url)?,
            connection: Mutex::new(None),
        };
        *limiter.connection.lock() = Some(limiter.open()?);
        Ok(limiter)
    }

    /// Sets the prefix of every bucket's Redis key, as
    /// [`RedisLimiter::with_prefix`](crate::RedisLimiter::with_prefix).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.set_prefix(prefix.into());
        self
    }

    /// Sets the timeout of each socket read and write and of each
    /// connection attempt (default
    /// [`DEFAULT_REDIS_TIMEOUT`](crate::DEFAULT_REDIS_TIMEOUT), at least
    /// 1 ms); a call without an answer fails with
    /// [`RedisErrorKind::Timeout`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.settings.set_timeout(timeout);
        // The next call opens a connection with the new timeout.
        *self.connection.get_mut() = None;
        self
    }

    /// Sets a floor under every written key's TTL, as
    /// [`RedisLimiter::with_min_ttl`](crate::RedisLimiter::with_min_ttl).
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.settings.set_min_ttl(min_ttl);
        self
    }

    /// Sets how many bucket keys the local deny mirror remembers, as
    /// [`RedisLimiter::with_mirror_capacity`](crate::RedisLimiter::with_mirror_capacity);
    /// 0 turns it off.
    #[must_use]
    pub fn with_mirror_capacity(mut self, capacity: usize) -> Self {
        self.settings.set_mirror_capacity(capacity);
        self
    }

    /// Sets what the boolean calls answer when Redis cannot decide
    /// (default [`FailurePolicy::Closed`]).
    #[must_use]
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.settings.failure_policy = policy;
        self
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

    /// The policy applied by the boolean calls when Redis cannot decide.
    #[must_use]
    pub fn failure_policy(&self) -> FailurePolicy {
        self.settings.failure_policy
    }

    /// The Redis key that holds `key`'s bucket: the prefix, then the key.
    #[must_use]
    pub fn bucket_key(&self, key: &str) -> String {
        self.settings.bucket_key(key)
    }

    /// As [`RedisLimiter::allow`](crate::RedisLimiter::allow), blocking.
    #[must_use]
    pub fn allow(&self, key: &str, timestamp: f64) -> bool {
        self.allow_n(key, timestamp, 1)
    }

    /// As [`RedisLimiter::allow_n`](crate::RedisLimiter::allow_n), blocking.
    #[must_use]
    pub fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        self.under(&self.quota()).allow_n(key, timestamp, cost)
    }

    /// As [`RedisLimiter::check`](crate::RedisLimiter::check), blocking.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis is unreachable, does not answer in
    /// time, or answers with an error.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{BlockingRedisLimiter, Denial, Quota};
    /// # use std::time::Duration;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// let limiter = BlockingRedisLimiter::connect(&url, Quota::new(1.0, 3)?)?.with_prefix(prefix);
    /// assert_eq!(limiter.check("k", 0.0, 2)?, Ok(1));
    /// assert_eq!(
    ///     limiter.check("k", 0.0, 2)?,
    ///     Err(Denial::InsufficientTokens { retry_after: Duration::from_secs(1) })
    /// );
    /// # Ok(())
    /// # }
    /// ```
    pub fn check(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        self.under(&self.quota()).check(key, timestamp, cost)
    }

    /// As [`RedisLimiter::check_at`](crate::RedisLimiter::check_at),
    /// blocking.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub fn check_at(
        &self,
        key: &str,
        at: Duration,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        self.under(&self.quota()).check_at(key, at, cost)
    }

    /// As [`RedisLimiter::remaining`](crate::RedisLimiter::remaining),
    /// blocking.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub fn remaining(&self, key: &str, timestamp: f64) -> Result<Option<u64>, RedisLimiterError> {
        self.under(&self.quota()).remaining(key, timestamp)
    }

    /// As [`RedisLimiter::allow_now`](crate::RedisLimiter::allow_now):
    /// Redis's own clock, blocking.
    #[must_use]
    pub fn allow_now(&self, key: &str) -> bool {
        self.allow_n_now(key, 1)
    }

    /// As [`RedisLimiter::allow_n_now`](crate::RedisLimiter::allow_n_now),
    /// blocking.
    #[must_use]
    pub fn allow_n_now(&self, key: &str, cost: u64) -> bool {
        self.under(&self.quota()).allow_n_now(key, cost)
    }

    /// As [`RedisLimiter::check_now`](crate::RedisLimiter::check_now),
    /// blocking.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub fn check_now(
        &self,
        key: &str,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        self.under(&self.quota()).check_now(key, cost)
    }

    /// As [`RedisLimiter::remaining_now`](crate::RedisLimiter::remaining_now),
    /// blocking.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub fn remaining_now(&self, key: &str) -> Result<u64, RedisLimiterError> {
        self.under(&self.quota()).remaining_now(key)
    }

    /// The one path of every call, as
    /// [`RedisLimiter`](crate::RedisLimiter)'s, over the blocking connection.
    fn decide(
        &self,
        key: &str,
        now: Option<Now>,
        cost: u64,
        quota: &Quota,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        // Calls on one blocking limiter already take turns on its
        // connection: no coalescing.
        let call = match self.settings.prepare(key, now, cost, quota, false) {
            Step::Ask(call) => call,
            Step::Decided(decided) => return self.settings.record(cost, Ok(decided)),
            // Never without coalescing; fail closed rather than panic.
            Step::Wait(_) => {
                return self
                    .settings
                    .record(cost, Ok(Err(Denial::InvalidTimestamp)))
            }
        };
        let invocation = self.settings.invocation(&call);
        let mut slot = self.connection.lock();
        let answer = match &mut *slot {
            Some(connection) => Ok(connection),
            None => self.open().map(|connection| slot.insert(connection)),
        }
        .and_then(|connection| {
            invocation
                .invoke(connection)
                .map_err(RedisLimiterError::from)
        });
        // After a socket error or a timeout the connection may be broken or
        // hold a late answer: start afresh next time.
        if answer
            .as_ref()
            .is_err_and(|err| err.kind() != RedisErrorKind::Script)
        {
            *slot = None;
        }
        drop(slot);
        self.settings
            .record(cost, self.settings.finish(&call, answer))
    }

    fn open(&self) -> Result<Connection, RedisLimiterError> {
        let timeout = self.settings.timeout;
        let connection = self.client.get_connection_with_timeout(timeout)?;
        connection.set_read_timeout(Some(timeout))?;
        connection.set_write_timeout(Some(timeout))?;
        Ok(connection)
    }
}

/// # Blocking calls under a chosen quota
///
/// The bodies of every [`BlockingRedisLimiter`] call: the limiter's own
/// methods are these under its default quota.
impl Under<'_, BlockingRedisLimiter> {
    /// [`BlockingRedisLimiter::allow`] under this quota.
    #[must_use]
    pub fn allow(&self, key: &str, timestamp: f64) -> bool {
        self.allow_n(key, timestamp, 1)
    }

    /// [`BlockingRedisLimiter::allow_n`] under this quota.
    #[must_use]
    pub fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        let (limiter, _) = self.parts();
        limiter.settings.admits(self.check(key, timestamp, cost))
    }

    /// [`BlockingRedisLimiter::check`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`BlockingRedisLimiter::check`].
    pub fn check(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        limiter.decide(key, Now::secs(timestamp), cost, quota)
    }

    /// [`BlockingRedisLimiter::check_at`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`BlockingRedisLimiter::check`].
    pub fn check_at(
        &self,
        key: &str,
        at: Duration,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        limiter.decide(key, Now::duration(at), cost, quota)
    }

    /// [`BlockingRedisLimiter::remaining`] under this quota.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub fn remaining(&self, key: &str, timestamp: f64) -> Result<Option<u64>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        Ok(limiter.decide(key, Now::secs(timestamp), 0, quota)?.ok())
    }

    /// [`BlockingRedisLimiter::allow_now`] under this quota.
    #[must_use]
    pub fn allow_now(&self, key: &str) -> bool {
        self.allow_n_now(key, 1)
    }

    /// [`BlockingRedisLimiter::allow_n_now`] under this quota.
    #[must_use]
    pub fn allow_n_now(&self, key: &str, cost: u64) -> bool {
        let (limiter, _) = self.parts();
        limiter.settings.admits(self.check_now(key, cost))
    }

    /// [`BlockingRedisLimiter::check_now`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`BlockingRedisLimiter::check`].
    pub fn check_now(
        &self,
        key: &str,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        limiter.decide(key, Some(Now::Server), cost, quota)
    }

    /// [`BlockingRedisLimiter::remaining_now`] under this quota.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub fn remaining_now(&self, key: &str) -> Result<u64, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        // Cost 0 at a valid time is always decided Ok(tokens).
        Ok(limiter
            .decide(key, Some(Now::Server), 0, quota)?
            .unwrap_or(0))
    }
}

impl fmt::Debug for BlockingRedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingRedisLimiter")
            .field("settings", &self.settings)
            // try_lock: never wait for a call in progress just to print.
            .field(
                "connected",
                &self.connection.try_lock().map(|c| c.is_some()),
            )
            .finish_non_exhaustive()
    }
}

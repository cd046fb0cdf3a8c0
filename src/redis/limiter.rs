//! The async limiter over a connection of the caller's choice.

use super::call::Step;
use super::error::RedisLimiterError;
use super::script::Now;
use super::settings::Settings;
use crate::error::Denial;
use crate::gcra::Quota;
use crate::keyed::Under;
use ::redis::aio::{ConnectionLike, ConnectionManager};
use std::fmt;
use std::time::Duration;

/// A per-key token-bucket limiter whose buckets live in Redis, so that
/// every process using the same Redis shares each key's budget.
///
/// Same decisions as [`TokenBucketLimiter`](crate::TokenBucketLimiter)
/// (exact integer arithmetic, a new key starts full, cost 0 is free, a
/// cost above the capacity is never admitted, bad timestamps change
/// nothing, backwards time never creates tokens), made atomically inside
/// Redis by one Lua script per call, on one Redis key per bucket
/// (`prefix + key`), so each call touches a single hash slot and the
/// limiter works on Redis Cluster.
///
/// Two sources of time:
///
/// - the caller's timestamps ([`check`](Self::check), [`allow`](Self::allow),
///   ...), `f64` seconds as in memory, or exact nanoseconds with
///   [`check_at`](Self::check_at). Every process must then share one
///   timeline, such as Unix time from synchronised clocks;
/// - Redis's own clock ([`check_now`](Self::check_now),
///   [`allow_now`](Self::allow_now), ...): the script reads `TIME`, Unix
///   time with **microsecond** resolution, so application servers' clocks
///   need not agree. Mixing both on one key is consistent only when the
///   caller's timestamps are Unix time too.
///
/// Every key written gets a TTL equal to the time until its bucket is full
/// again, rounded up to the millisecond: an idle key vanishes exactly when
/// it becomes indistinguishable from a key never seen. Redis counts that
/// TTL on its own clock, so with caller timestamps that do not advance in
/// real time (simulations, tests) set a floor with
/// [`with_min_ttl`](Self::with_min_ttl): a key that expires early would
/// refill its bucket early.
///
/// Failures (connection lost, timeout, script error) are typed
/// [`RedisLimiterError`]s, never panics. The default connection
/// ([`connect`](Self::connect)) is a [`ConnectionManager`], which
/// reconnects by itself. Cloning a limiter is cheap and shares the
/// connection.
///
/// # Examples
///
/// ```
/// use keyrate::{Quota, RedisLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
/// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
/// // url: for example "redis://127.0.0.1:6379"
/// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
///     .await?
///     .with_prefix(prefix);
/// assert!(limiter.allow("key1", 0.0).await);
/// assert!(limiter.allow("key1", 0.0).await);
/// assert!(limiter.allow("key1", 0.0).await);
/// assert!(!limiter.allow("key1", 0.0).await);
/// assert!(limiter.allow("key1", 2.0).await);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisLimiter<C = ConnectionManager> {
    pub(super) settings: Settings,
    pub(super) connection: C,
}

impl<C> RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    // Deciding: every call goes through `decide`.

    /// Spends one token from `key`'s bucket at `timestamp` (seconds, on
    /// the caller's timeline), if it holds one. Returns whether the call is
    /// admitted; when Redis cannot decide, the
    /// [`FailurePolicy`](crate::FailurePolicy) answers.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 1)?).await?.with_prefix(prefix);
    /// assert!(limiter.allow("k", 0.0).await);
    /// assert!(!limiter.allow("k", 0.5).await);
    /// assert!(limiter.allow("k", 1.0).await);
    /// assert!(!limiter.allow("k", f64::NAN).await);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub async fn allow(&self, key: &str, timestamp: f64) -> bool {
        self.allow_n(key, timestamp, 1).await
    }

    /// Spends `cost` tokens from `key`'s bucket at `timestamp`, if it holds
    /// that many. Returns whether the call is admitted; when Redis cannot
    /// decide, the [`FailurePolicy`](crate::FailurePolicy) answers.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?.with_prefix(prefix);
    /// assert!(limiter.allow_n("k", 0.0, 3).await);
    /// assert!(!limiter.allow_n("k", 0.0, 1).await);
    /// assert!(!limiter.allow_n("k", 100.0, 4).await);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        self.under(&self.quota())
            .allow_n(key, timestamp, cost)
            .await
    }

    /// Spends `cost` tokens like [`allow_n`](Self::allow_n), and says why a
    /// call was not admitted. On admission returns the whole tokens left.
    ///
    /// The outer `Result` is Redis's: `Err` when Redis could not decide
    /// (no policy applied). The inner one is the decision, exactly as
    /// [`TokenBucketLimiter::check`](crate::TokenBucketLimiter::check)
    /// returns it.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis is unreachable, does not answer
    /// within the timeout, or answers with an error. An invalid timestamp
    /// and a cost above the capacity are decided without Redis.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Denial, Quota, RedisLimiter};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?.with_prefix(prefix);
    /// assert_eq!(limiter.check("k", 0.0, 2).await?, Ok(1));
    /// assert_eq!(
    ///     limiter.check("k", 0.0, 2).await?,
    ///     Err(Denial::InsufficientTokens { retry_after: Duration::from_secs(1) })
    /// );
    /// assert_eq!(limiter.check("k", -1.0, 1).await?, Err(Denial::InvalidTimestamp));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        self.under(&self.quota()).check(key, timestamp, cost).await
    }

    /// [`check`](Self::check) at an exact timestamp: `at` after the
    /// caller's epoch, to the nanosecond (an `f64` of Unix seconds only
    /// resolves about 240 ns).
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check); `at` beyond
    /// [`MAX_TIMESTAMP_NANOS`](crate::MAX_TIMESTAMP_NANOS) is [`Denial::InvalidTimestamp`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # use std::time::{Duration, SystemTime, UNIX_EPOCH};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 1)?).await?.with_prefix(prefix);
    /// let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    /// assert_eq!(limiter.check_at("k", now, 1).await?, Ok(0));
    /// let almost = now + Duration::from_nanos(999_999_999);
    /// let denial = limiter.check_at("k", almost, 1).await?.unwrap_err();
    /// assert_eq!(denial.retry_after(), Some(Duration::from_nanos(1)));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check_at(
        &self,
        key: &str,
        at: Duration,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        self.under(&self.quota()).check_at(key, at, cost).await
    }

    /// The whole tokens `key` holds at `timestamp`, without spending any.
    /// A key never seen holds `capacity`; nothing is written. `Ok(None)`
    /// for an invalid timestamp.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?.with_prefix(prefix);
    /// assert_eq!(limiter.remaining("k", 0.0).await?, Some(3));
    /// assert!(limiter.allow_n("k", 0.0, 2).await);
    /// assert_eq!(limiter.remaining("k", 1.5).await?, Some(2));
    /// assert_eq!(limiter.remaining("k", f64::INFINITY).await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn remaining(
        &self,
        key: &str,
        timestamp: f64,
    ) -> Result<Option<u64>, RedisLimiterError> {
        self.under(&self.quota()).remaining(key, timestamp).await
    }

    /// [`allow`](Self::allow) at Redis's own clock (`TIME`, microsecond
    /// resolution).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// // One token a day: the bucket does not refill during this example.
    /// let quota = Quota::new(1.0 / 86_400.0, 2)?;
    /// let limiter = RedisLimiter::connect(&url, quota).await?.with_prefix(prefix);
    /// assert!(limiter.allow_now("k").await);
    /// assert!(limiter.allow_now("k").await);
    /// assert!(!limiter.allow_now("k").await);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub async fn allow_now(&self, key: &str) -> bool {
        self.allow_n_now(key, 1).await
    }

    /// [`allow_n`](Self::allow_n) at Redis's own clock.
    #[must_use]
    pub async fn allow_n_now(&self, key: &str, cost: u64) -> bool {
        self.under(&self.quota()).allow_n_now(key, cost).await
    }

    /// [`check`](Self::check) at Redis's own clock.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub async fn check_now(
        &self,
        key: &str,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        self.under(&self.quota()).check_now(key, cost).await
    }

    /// [`remaining`](Self::remaining) at Redis's own clock.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub async fn remaining_now(&self, key: &str) -> Result<u64, RedisLimiterError> {
        self.under(&self.quota()).remaining_now(key).await
    }

    /// The one path of every call: the core prepares it, Redis answers
    /// (unless the core decided alone), the core finishes it.
    async fn decide(
        &self,
        key: &str,
        now: Option<Now>,
        cost: u64,
        quota: &Quota,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        // Wait for calls in flight on the key until the deadline, then go
        // regardless.
        let deadline = tokio::time::Instant::now() + self.settings.timeout;
        let call = loop {
            let coalesce = tokio::time::Instant::now() < deadline;
            match self.settings.prepare(key, now, cost, quota, coalesce) {
                Step::Decided(decided) => return self.settings.record(cost, Ok(decided)),
                Step::Ask(call) => break call,
                Step::Wait(landed) => {
                    let _ = tokio::time::timeout_at(deadline, landed).await;
                }
            }
        };
        let invocation = self.settings.invocation(&call);
        let mut connection = self.connection.clone();
        let timeout = self.settings.timeout;
        let answer = tokio::time::timeout(timeout, invocation.invoke_async(&mut connection))
            .await
            .map_err(|_| RedisLimiterError::timeout(timeout))
            .and_then(|answer| answer.map_err(RedisLimiterError::from));
        self.settings
            .record(cost, self.settings.finish(&call, answer))
    }
}

/// # Calls under a chosen quota
///
/// The bodies of every [`RedisLimiter`] call: the limiter's own methods are
/// these under its default quota.
impl<C> Under<'_, RedisLimiter<C>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// [`RedisLimiter::allow`] under this quota.
    #[must_use]
    pub async fn allow(&self, key: &str, timestamp: f64) -> bool {
        self.allow_n(key, timestamp, 1).await
    }

    /// [`RedisLimiter::allow_n`] under this quota.
    #[must_use]
    pub async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        let (limiter, _) = self.parts();
        limiter
            .settings
            .admits(self.check(key, timestamp, cost).await)
    }

    /// [`RedisLimiter::check`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::check`].
    pub async fn check(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        limiter.decide(key, Now::secs(timestamp), cost, quota).await
    }

    /// [`RedisLimiter::check_at`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::check`].
    pub async fn check_at(
        &self,
        key: &str,
        at: Duration,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        limiter.decide(key, Now::duration(at), cost, quota).await
    }

    /// [`RedisLimiter::remaining`] under this quota.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub async fn remaining(
        &self,
        key: &str,
        timestamp: f64,
    ) -> Result<Option<u64>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        Ok(limiter
            .decide(key, Now::secs(timestamp), 0, quota)
            .await?
            .ok())
    }

    /// [`RedisLimiter::allow_now`] under this quota.
    #[must_use]
    pub async fn allow_now(&self, key: &str) -> bool {
        self.allow_n_now(key, 1).await
    }

    /// [`RedisLimiter::allow_n_now`] under this quota.
    #[must_use]
    pub async fn allow_n_now(&self, key: &str, cost: u64) -> bool {
        let (limiter, _) = self.parts();
        limiter.settings.admits(self.check_now(key, cost).await)
    }

    /// [`RedisLimiter::check_now`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::check`].
    pub async fn check_now(
        &self,
        key: &str,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        limiter.decide(key, Some(Now::Server), cost, quota).await
    }

    /// [`RedisLimiter::remaining_now`] under this quota.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub async fn remaining_now(&self, key: &str) -> Result<u64, RedisLimiterError> {
        let (limiter, quota) = self.parts();
        // Cost 0 at a valid time is always decided Ok(tokens).
        Ok(limiter
            .decide(key, Some(Now::Server), 0, quota)
            .await?
            .unwrap_or(0))
    }
}

impl<C> fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

//! The limiter with its buckets in Redis (feature `redis`): one budget per
//! key shared by every process that talks to the same Redis.
//!
//! Each decision is one Lua script (`src/redis/bucket.lua`), run
//! atomically by Redis on a single key, so it works unchanged on Redis
//! Cluster. The script applies the very rule of the in-memory limiter
//! (`gcra::decide`): the key holds the bucket's word `full_at` in
//! nanoseconds, as a decimal string; a missing key is the word 0, a full
//! bucket. Rust does every division before the call (the refill a cost uses
//! and the refill of a full bucket, exact as in memory), so the script only
//! compares and adds, on `(seconds, nanoseconds)` pairs that Lua's doubles
//! hold exactly. A denial writes nothing; an admission writes the new word
//! with a TTL equal to the time until the bucket is full again.

mod blocking;
mod stats;

pub use self::blocking::BlockingRedisLimiter;

use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::time::{nanos_from_duration, nanos_from_secs, MAX_TIMESTAMP_NANOS};
use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::{ErrorKind, RedisError, Script, ScriptInvocation};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The decision script; Redis caches it by its SHA-1.
const BUCKET_SCRIPT: &str = include_str!("bucket.lua");

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The key prefix used unless [`RedisLimiter::with_prefix`] sets another.
pub const DEFAULT_REDIS_PREFIX: &str = "keyrate:";

/// The per-call deadline used unless [`RedisLimiter::with_timeout`] sets
/// another.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_secs(1);

/// What [`RedisLimiter::allow`] and [`RedisLimiter::allow_n`] answer when
/// Redis cannot: admit everything (open) or nothing (closed).
///
/// The checking calls ([`RedisLimiter::check`] and friends) never apply a
/// policy: they return the [`RedisLimiterError`] for the caller to decide.
///
/// # Examples
///
/// ```
/// use keyrate::FailurePolicy;
///
/// assert_eq!(FailurePolicy::default(), FailurePolicy::Closed);
/// assert!(FailurePolicy::Open.admits());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Admit calls while Redis is unreachable: availability over limits.
    Open,
    /// Deny calls while Redis is unreachable: limits over availability.
    #[default]
    Closed,
}

impl FailurePolicy {
    /// Whether a call that could not be decided is admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::FailurePolicy;
    ///
    /// assert!(!FailurePolicy::Closed.admits());
    /// ```
    #[must_use]
    pub fn admits(self) -> bool {
        self == FailurePolicy::Open
    }
}

/// What kind of failure a [`RedisLimiterError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisErrorKind {
    /// Redis could not be reached: connection refused or lost, server
    /// loading, failing over or cluster down. The call was not applied,
    /// unless the connection broke after the script ran.
    Unavailable,
    /// No answer within the limiter's timeout. The script may or may not
    /// have run (it is atomic either way: all of it or nothing).
    Timeout,
    /// Redis ran the call and answered with an error: the script failed,
    /// the key holds a value that is not a keyrate bucket, out of memory.
    /// Nothing was written.
    Script,
    /// Redis answered something the script never returns.
    Reply,
    /// The connection could not be configured: a bad URL, or refused
    /// credentials.
    Config,
}

/// A call that Redis did not decide, and why. Never a panic.
///
/// # Examples
///
/// ```
/// use keyrate::{Quota, RedisErrorKind, RedisLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let err = RedisLimiter::connect("not a url", Quota::new(1.0, 1).unwrap())
///     .await
///     .unwrap_err();
/// assert_eq!(err.kind(), RedisErrorKind::Config);
/// println!("{err}");
/// # }
/// ```
#[derive(Debug)]
pub struct RedisLimiterError {
    kind: RedisErrorKind,
    message: String,
    source: Option<RedisError>,
}

impl RedisLimiterError {
    /// The kind of failure.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, RedisErrorKind, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let quota = Quota::new(1.0, 1).unwrap();
    /// let err = RedisLimiter::connect("ftp://127.0.0.1", quota).await.unwrap_err();
    /// assert_eq!(err.kind(), RedisErrorKind::Config);
    /// # }
    /// ```
    #[must_use]
    pub fn kind(&self) -> RedisErrorKind {
        self.kind
    }

    fn timeout(after: Duration) -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Timeout,
            message: format!("no answer from Redis within {after:?}"),
            source: None,
        }
    }

    fn reply(what: &str) -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Reply,
            message: format!("unexpected reply from the keyrate script: {what}"),
            source: None,
        }
    }
}

impl From<RedisError> for RedisLimiterError {
    fn from(err: RedisError) -> Self {
        let kind = if err.is_timeout() {
            RedisErrorKind::Timeout
        } else if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(
                err.kind(),
                ErrorKind::BusyLoadingError
                    | ErrorKind::TryAgain
                    | ErrorKind::ClusterDown
                    | ErrorKind::MasterDown
                    | ErrorKind::ReadOnly
                    | ErrorKind::ClusterConnectionNotFound
            )
        {
            RedisErrorKind::Unavailable
        } else if matches!(
            err.kind(),
            ErrorKind::InvalidClientConfig | ErrorKind::AuthenticationFailed
        ) {
            RedisErrorKind::Config
        } else if matches!(err.kind(), ErrorKind::TypeError | ErrorKind::ParseError) {
            RedisErrorKind::Reply
        } else {
            RedisErrorKind::Script
        };
        RedisLimiterError {
            kind,
            message: err.to_string(),
            source: Some(err),
        }
    }
}

impl fmt::Display for RedisLimiterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            RedisErrorKind::Unavailable => "Redis unavailable",
            RedisErrorKind::Timeout => "Redis timed out",
            RedisErrorKind::Script => "Redis script error",
            RedisErrorKind::Reply => "bad Redis reply",
            RedisErrorKind::Config => "Redis configuration error",
        };
        write!(f, "{what}: {}", self.message)
    }
}

impl std::error::Error for RedisLimiterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|err| err as &(dyn std::error::Error + 'static))
    }
}

/// Where "now" comes from for one call.
#[derive(Debug, Clone, Copy)]
enum Now {
    /// The caller's timestamp, validated nanoseconds.
    At(u64),
    /// Redis's `TIME`, read inside the script.
    Server,
}

/// The script's answer, reassembled from its limbs.
#[derive(Debug, Clone, Copy)]
struct Reply {
    admitted: bool,
    /// The new word when admitted, the wait in nanoseconds when denied.
    value: u64,
    /// The instant the script decided at.
    now: u64,
}

/// Splits nanoseconds into the script's `(seconds, nanoseconds)` limbs.
fn limbs(ns: u64) -> (u64, u64) {
    (ns / NANOS_PER_SEC, ns % NANOS_PER_SEC)
}

/// Joins the script's limbs into nanoseconds, if they form a `u64`.
fn join(secs: i64, nanos: i64) -> Option<u64> {
    let secs = u64::try_from(secs).ok()?;
    let nanos = u64::try_from(nanos).ok().filter(|&n| n < NANOS_PER_SEC)?;
    secs.checked_mul(NANOS_PER_SEC)?.checked_add(nanos)
}

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
    settings: Settings,
    connection: C,
}

impl RedisLimiter<ConnectionManager> {
    /// Connects to the Redis at `url` (such as `redis://127.0.0.1:6379`)
    /// through a [`ConnectionManager`] that reconnects by itself after a
    /// lost connection.
    ///
    /// Each connection attempt and each answer times out after
    /// [`DEFAULT_REDIS_TIMEOUT`]; a failed attempt is retried 3 times with
    /// exponential backoff before this returns an error. Use
    /// [`with_connection`](Self::with_connection) to configure the
    /// connection yourself.
    ///
    /// # Errors
    ///
    /// [`RedisErrorKind::Config`] for a URL that is not a Redis URL;
    /// [`RedisErrorKind::Unavailable`] or [`RedisErrorKind::Timeout`]
    /// when no server answers.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// let limiter = RedisLimiter::connect(&url, Quota::new(10.0, 20)?).await?;
    /// assert_eq!(limiter.quota().capacity(), 20);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str, quota: Quota) -> Result<Self, RedisLimiterError> {
        let client = ::redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(DEFAULT_REDIS_TIMEOUT)
            .set_response_timeout(DEFAULT_REDIS_TIMEOUT)
            .set_number_of_retries(3)
            .set_max_delay(1000);
        let connection = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self::with_connection(connection, quota))
    }
}

impl<C> RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Makes a limiter over a connection of your choice: a
    /// [`ConnectionManager`] with your own settings, a multiplexed
    /// connection, or a Redis Cluster connection (each call touches one
    /// key, so one hash slot).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// let client = redis::Client::open(url.as_str())?;
    /// let connection = client.get_multiplexed_async_connection().await?;
    /// let limiter = RedisLimiter::with_connection(connection, Quota::new(1.0, 3)?);
    /// assert_eq!(limiter.remaining_now("never-seen").await?, 3);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_connection(connection: C, quota: Quota) -> Self {
        RedisLimiter {
            settings: Settings::new(quota),
            connection,
        }
    }

    /// Sets the prefix of every bucket's Redis key (default
    /// [`DEFAULT_REDIS_PREFIX`]). On Redis Cluster a prefix such as
    /// `"{tenant7}:"` puts every bucket of the limiter in one hash slot.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_prefix("rl:tts:");
    /// assert_eq!(limiter.bucket_key("sk_live_1"), "rl:tts:sk_live_1");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = Arc::from(prefix.into());
        self
    }

    /// Sets the deadline of each call (default [`DEFAULT_REDIS_TIMEOUT`]); a call
    /// without an answer by then fails with [`RedisErrorKind::Timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_timeout(Duration::from_millis(50));
    /// # let _ = limiter;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Sets a floor under every written key's TTL (default none: the TTL
    /// is exactly the time until the bucket is full again).
    ///
    /// Redis expires keys on its own clock, while the TTL is computed on
    /// the caller's timeline. A writer whose clock runs `d` ahead of the
    /// others sets TTLs `d` too short, and made-up timestamps (a
    /// simulation, a test) may not advance in real time at all: a key could
    /// then expire before the callers' timeline reaches the instant its
    /// bucket is full, refilling it early. A floor above the clocks' largest
    /// disagreement (or longer than such a run) prevents that. A longer TTL never changes a decision,
    /// it only keeps idle keys longer. The floor is capped at about 292
    /// years.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_min_ttl(Duration::from_secs(3600));
    /// # let _ = limiter;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.settings.set_min_ttl(min_ttl);
        self
    }

    /// Sets what [`allow`](Self::allow) and the other boolean calls answer
    /// when Redis cannot decide (default [`FailurePolicy::Closed`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{FailurePolicy, Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Ok(url) = std::env::var("KEYRATE_REDIS_URL") else { return Ok(()) };
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
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

    /// The quota every key's bucket follows.
    #[must_use]
    pub fn quota(&self) -> &Quota {
        &self.settings.quota
    }

    /// The policy applied by the boolean calls when Redis cannot decide.
    #[must_use]
    pub fn failure_policy(&self) -> FailurePolicy {
        self.settings.failure_policy
    }

    /// The Redis key that holds `key`'s bucket: the prefix, then the key.
    /// Its value is the bucket's word: the Unix-or-caller-timeline instant,
    /// in nanoseconds, at which the bucket is full again.
    #[must_use]
    pub fn bucket_key(&self, key: &str) -> String {
        self.settings.bucket_key(key)
    }

    /// Spends one token from `key`'s bucket at `timestamp` (seconds, on
    /// the caller's timeline), if it holds one. Returns whether the call is
    /// admitted; when Redis cannot decide, the
    /// [`FailurePolicy`] answers.
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
    /// decide, the [`FailurePolicy`] answers.
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
        self.settings.admits(self.check(key, timestamp, cost).await)
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
        match nanos_from_secs(timestamp) {
            Some(now) => self.decide(key, Now::At(now), cost).await,
            None => Ok(self.settings.invalid_timestamp(cost)),
        }
    }

    /// [`check`](Self::check) at an exact timestamp: `at` after the
    /// caller's epoch, to the nanosecond (an `f64` of Unix seconds only
    /// resolves about 240 ns).
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check); `at` beyond
    /// [`MAX_TIMESTAMP_NANOS`] is [`Denial::InvalidTimestamp`].
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
        match nanos_from_duration(at) {
            Some(now) => self.decide(key, Now::At(now), cost).await,
            None => Ok(self.settings.invalid_timestamp(cost)),
        }
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
        let Some(now) = nanos_from_secs(timestamp) else {
            return Ok(None);
        };
        let reply = self.run(key, Now::At(now), 0).await?;
        Ok(Some(self.settings.tokens(reply)))
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
        self.settings.admits(self.check_now(key, cost).await)
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
        self.decide(key, Now::Server, cost).await
    }

    /// [`remaining`](Self::remaining) at Redis's own clock.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError`] when Redis cannot answer.
    pub async fn remaining_now(&self, key: &str) -> Result<u64, RedisLimiterError> {
        let reply = self.run(key, Now::Server, 0).await?;
        Ok(self.settings.tokens(reply))
    }

    /// `gcra::decide`, with the bucket word in Redis.
    async fn decide(
        &self,
        key: &str,
        now: Now,
        cost: u64,
    ) -> Result<Result<u64, Denial>, RedisLimiterError> {
        let spend = match self.settings.spend(cost) {
            Ok(spend) => spend,
            Err(denial) => return self.settings.record(cost, Ok(Err(denial))),
        };
        let reply = self.run(key, now, spend).await;
        self.settings
            .record(cost, reply.map(|reply| self.settings.decision(reply)))
    }

    /// Runs the script once on `key`: a decision, or a read when `spend`
    /// is 0.
    async fn run(&self, key: &str, now: Now, spend: u64) -> Result<Reply, RedisLimiterError> {
        let invocation = self.settings.invocation(key, now, spend);
        let mut connection = self.connection.clone();
        let timeout = self.settings.timeout;
        let answer = tokio::time::timeout(timeout, invocation.invoke_async(&mut connection))
            .await
            .map_err(|_| RedisLimiterError::timeout(timeout))??;
        parse(answer)
    }
}

impl<C> fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What the async and the blocking limiter share: the quota, the script,
/// the key layout and the policies.
#[derive(Clone)]
struct Settings {
    quota: Quota,
    script: Arc<Script>,
    prefix: Arc<str>,
    timeout: Duration,
    /// The least TTL of a written key, in milliseconds.
    min_ttl_ms: u64,
    failure_policy: FailurePolicy,
    /// Decision counters, shared by clones (see `stats`).
    counters: Arc<crate::observe::Counters>,
}

impl Settings {
    fn new(quota: Quota) -> Self {
        Settings {
            quota,
            script: Arc::new(Script::new(BUCKET_SCRIPT)),
            prefix: Arc::from(DEFAULT_REDIS_PREFIX),
            timeout: DEFAULT_REDIS_TIMEOUT,
            min_ttl_ms: 0,
            failure_policy: FailurePolicy::default(),
            counters: Arc::new(crate::observe::Counters::new(true)),
        }
    }

    fn set_min_ttl(&mut self, min_ttl: Duration) {
        let cap = MAX_TIMESTAMP_NANOS / 1_000_000;
        self.min_ttl_ms = u64::try_from(min_ttl.as_millis()).map_or(cap, |ms| ms.min(cap));
    }

    fn bucket_key(&self, key: &str) -> String {
        let mut out = String::with_capacity(self.prefix.len() + key.len());
        out.push_str(&self.prefix);
        out.push_str(key);
        out
    }

    fn admits(&self, outcome: Result<Result<u64, Denial>, RedisLimiterError>) -> bool {
        match outcome {
            Ok(decision) => decision.is_ok(),
            Err(_) => self.failure_policy.admits(),
        }
    }

    /// The checks `gcra::decide` makes before it reads the word, in its
    /// order: `Ok(spend)` to ask Redis (0 for cost 0, which only reads), or
    /// the denial decided without Redis.
    fn spend(&self, cost: u64) -> Result<u64, Denial> {
        if cost == 0 {
            return Ok(0);
        }
        if cost > self.quota.capacity() {
            return Err(Denial::ExceedsCapacity {
                cost,
                capacity: self.quota.capacity(),
            });
        }
        // cost <= capacity, so the spend fits the window (see Quota::new).
        Ok(self.quota.spend(cost).unwrap_or(u64::MAX))
    }

    /// The script call on `key` at `now` spending `spend` ns of refill.
    fn invocation(&self, key: &str, now: Now, spend: u64) -> ScriptInvocation<'_> {
        let mut invocation = self.script.key(self.bucket_key(key));
        match now {
            Now::At(ns) => {
                let (secs, nanos) = limbs(ns);
                invocation.arg(secs).arg(nanos);
            }
            Now::Server => {
                invocation.arg("time").arg(0);
            }
        }
        let (spend_secs, spend_nanos) = limbs(spend);
        let (window_secs, window_nanos) = limbs(self.quota.window());
        invocation
            .arg(spend_secs)
            .arg(spend_nanos)
            .arg(window_secs)
            .arg(window_nanos)
            .arg(self.min_ttl_ms);
        invocation
    }

    /// The decision a reply carries, as `gcra::decide` would return it.
    fn decision(&self, reply: Reply) -> Result<u64, Denial> {
        if reply.admitted {
            return Ok(self.tokens(reply));
        }
        // In memory the missing refill saturates at u64::MAX before the
        // window is subtracted; do the same so retry-after agrees even there.
        let window = self.quota.window();
        let missing = reply.value.saturating_add(window);
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_nanos(missing - window),
        })
    }

    /// Whole tokens after an admission (or a read).
    fn tokens(&self, reply: Reply) -> u64 {
        gcra::tokens_at(reply.value, reply.now, &self.quota)
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("quota", &self.quota)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("min_ttl_ms", &self.min_ttl_ms)
            .field("failure_policy", &self.failure_policy)
            .finish()
    }
}

/// The script's answer as a [`Reply`], or why it is not one.
fn parse(answer: Vec<i64>) -> Result<Reply, RedisLimiterError> {
    let [admitted, value_secs, value_nanos, now_secs, now_nanos] = answer[..] else {
        return Err(RedisLimiterError::reply("expected 5 integers"));
    };
    let value =
        join(value_secs, value_nanos).ok_or_else(|| RedisLimiterError::reply("bad value limbs"))?;
    let now =
        join(now_secs, now_nanos).ok_or_else(|| RedisLimiterError::reply("bad time limbs"))?;
    Ok(Reply {
        admitted: admitted == 1,
        value,
        now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limbs_round_trip_across_the_whole_range() {
        for ns in [
            0,
            1,
            999_999_999,
            1_000_000_000,
            1_700_000_000_123_456_789,
            MAX_TIMESTAMP_NANOS,
            u64::MAX,
        ] {
            let (s, n) = limbs(ns);
            assert!(n < NANOS_PER_SEC);
            // Each limb is exact in a Lua double.
            assert!(s < 1 << 35);
            assert_eq!(join(s as i64, n as i64), Some(ns));
        }
        assert_eq!(join(-1, 0), None);
        assert_eq!(join(0, 1_000_000_000), None);
        assert_eq!(join(0, -1), None);
        assert_eq!(join(i64::MAX, 0), None);
    }

    #[test]
    fn errors_are_classified() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            RedisLimiterError::from(io).kind(),
            RedisErrorKind::Unavailable
        );
        let script = RedisError::from((ErrorKind::ResponseError, "ERR boom"));
        let err = RedisLimiterError::from(script);
        assert_eq!(err.kind(), RedisErrorKind::Script);
        assert!(std::error::Error::source(&err).is_some());
        let timeout = RedisLimiterError::timeout(Duration::from_millis(5));
        assert_eq!(timeout.kind(), RedisErrorKind::Timeout);
        assert!(timeout.to_string().contains("5ms"));
    }
}

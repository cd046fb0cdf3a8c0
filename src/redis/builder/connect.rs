//! Making a Redis limiter: connecting to the Redis at a URL through a
//! [`ConnectionManager`] that reconnects by itself, or taking a connection
//! of the caller's.

use crate::gcra::Quota;
use crate::redis::error::{RedisErrorKind, RedisLimiterError};
use crate::redis::limiter::RedisLimiter;
use crate::redis::settings::{Settings, DEFAULT_REDIS_TIMEOUT};
use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

impl RedisLimiter<ConnectionManager> {
    /// Connects to the Redis at `url` (such as `redis://127.0.0.1:6379`)
    /// through a [`ConnectionManager`] that reconnects by itself after a
    /// lost connection.
    ///
    /// Each connection attempt and each answer times out after
    /// [`DEFAULT_REDIS_TIMEOUT`]; a failed first connection is retried 3
    /// times, 100, 200 and 400 ms apart, before this returns an error.
    /// After a lost connection the manager reconnects on the next call,
    /// one attempt per call and no backoff of its own: the limiter's
    /// circuit breaker ([`with_circuit_breaker`](Self::with_circuit_breaker))
    /// paces the attempts while Redis is down, so that calls fail fast
    /// meanwhile and a Redis that answers again is found within one
    /// probe interval. Use [`with_connection`](Self::with_connection) to
    /// configure the connection yourself.
    ///
    /// # Errors
    ///
    /// [`RedisErrorKind::Config`](crate::RedisErrorKind::Config) for a URL that is not a Redis URL;
    /// [`RedisErrorKind::Unavailable`](crate::RedisErrorKind::Unavailable) or [`RedisErrorKind::Timeout`](crate::RedisErrorKind::Timeout)
    /// when no server answers.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(10.0, 20)?).await?;
    /// assert_eq!(limiter.quota().capacity(), 20);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str, quota: Quota) -> Result<Self, RedisLimiterError> {
        Ok(Self::with_connection(connect_manager(url).await?, quota))
    }
}

/// A [`ConnectionManager`] to the Redis at `url`, configured as
/// [`RedisLimiter::connect`] says (the concurrency limiter's `connect` too).
pub(in crate::redis) async fn connect_manager(
    url: &str,
) -> Result<ConnectionManager, RedisLimiterError> {
    let client = ::redis::Client::open(url)?;
    // No retries inside the manager: a reconnection that retried with
    // backoff (redis-rs sleeps a second or more between attempts) would
    // hold every call waiting on it, and find a restarted Redis only
    // at its next attempt.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(DEFAULT_REDIS_TIMEOUT)
        .set_response_timeout(DEFAULT_REDIS_TIMEOUT)
        .set_number_of_retries(0);
    let mut delay = Duration::from_millis(100);
    for retry in 0.. {
        match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
            Ok(connection) => return Ok(connection),
            Err(err) => {
                let err = RedisLimiterError::from(err);
                if retry == 3 || err.kind() == RedisErrorKind::Config {
                    return Err(err);
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    unreachable!("the loop returns")
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
    /// use keyrate::{AsyncLimiter, Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let client = redis::Client::open(url.as_str())?;
    /// let connection = client.get_multiplexed_async_connection().await?;
    /// let limiter = RedisLimiter::with_connection(connection, Quota::new(1.0, 3)?);
    /// assert_eq!(limiter.remaining("never-seen", keyrate::Now).await?, 3);
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
}

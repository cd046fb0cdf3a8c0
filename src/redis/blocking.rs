//! The blocking twin of the async limiter: [`RedisLimiter`] over a plain
//! connection, for threads that are not in an async runtime.

use super::breaker::answered;
use super::call::Outcome;
use super::error::{RedisDenial, RedisLimiterError};
use super::settings::Settings;
use super::{RedisErrorKind, RedisLimiter};
use crate::decision::Decision;
use crate::gcra::Quota;
use crate::limiter::Limiter;
use crate::time::At;
use ::redis::{Client, Connection};
use parking_lot::Mutex;
use std::fmt;
use std::time::Duration;

/// [`RedisLimiter`] without async: the same decisions, the same script and
/// the same settings, over one plain connection; its calls are
/// [`Limiter`]'s.
///
/// Calls on one limiter take turns on its connection; give each thread its
/// own limiter (they share the buckets through Redis) for parallel calls.
/// After a connection error or a timeout the connection is dropped, and the
/// next call opens a new one: reconnection is automatic. The timeout bounds
/// each socket read and write, so one call waits at most about twice the
/// timeout.
///
/// # Examples
///
/// ```
/// use keyrate::{BlockingRedisLimiter, Limiter, Quota};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("KEYRATE_REDIS_URL")?;
/// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
/// let limiter = BlockingRedisLimiter::connect_blocking(&url, Quota::new(1.0, 3)?)?
///     .with_prefix(prefix);
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(!limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 2.0));
/// # Ok(())
/// # }
/// ```
pub type BlockingRedisLimiter = RedisLimiter<BlockingConnection>;

/// The blocking limiter's connection: opened on first use and after a
/// failure, with the limiter's timeout on every socket operation.
pub struct BlockingConnection {
    client: Client,
    /// The open connection and the timeout it was opened with; `None`
    /// after a failure, until the next call reconnects.
    open: Mutex<Option<(Connection, Duration)>>,
}

impl fmt::Debug for BlockingConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingConnection").finish_non_exhaustive()
    }
}

impl RedisLimiter<BlockingConnection> {
    /// Connects to the Redis at `url` (such as `redis://127.0.0.1:6379`)
    /// over a blocking connection.
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
    /// let err = BlockingRedisLimiter::connect_blocking("nonsense", Quota::new(1.0, 1).unwrap())
    ///     .unwrap_err();
    /// assert_eq!(err.kind(), RedisErrorKind::Config);
    /// ```
    pub fn connect_blocking(url: &str, quota: Quota) -> Result<Self, RedisLimiterError> {
        let limiter = RedisLimiter {
            settings: Settings::new(quota),
            connection: BlockingConnection {
                client: Client::open(url)?,
                open: Mutex::new(None),
            },
        };
        let first = limiter.open()?;
        *limiter.connection.open.lock() = Some(first);
        Ok(limiter)
    }

    /// The one path of every call, as the async limiter's, over the
    /// blocking connection. Calls on one blocking limiter already take
    /// turns on its connection: no coalescing.
    fn decide(&self, key: &str, at: At, cost: u64, quota: &Quota) -> Outcome {
        let call = match self.settings.prepare(key, at, cost, quota) {
            Ok(call) => call,
            Err(denial) => return Ok(Err(denial)),
        };
        let breaker = &self.settings.breaker;
        let pass = breaker.admit(breaker.now())?;
        let invocation = self.settings.invocation(&call);
        let answer = self.run(|connection| {
            invocation
                .invoke(connection)
                .map_err(RedisLimiterError::from)
        });
        breaker.record(pass, answered(&answer), breaker.now());
        self.settings.finish(&call, answer)
    }

    /// One command over the connection (see [`run`](Self::run)).
    pub(super) fn query_blocking(
        &self,
        cmd: &::redis::Cmd,
    ) -> Result<::redis::Value, RedisLimiterError> {
        self.run(|connection| cmd.query(connection).map_err(RedisLimiterError::from))
    }

    /// `CLUSTER INFO`'s answer, to tell a cluster node from a standalone
    /// Redis.
    pub(super) fn cluster_info_blocking(&self) -> Result<::redis::Value, ::redis::RedisError> {
        let mut answer = None;
        let _ = self.run(|connection| {
            let result = ::redis::cmd("CLUSTER").arg("INFO").query(connection);
            let failed = result.as_ref().is_err_and(|err| {
                err.is_io_error() || err.is_timeout() || err.is_connection_dropped()
            });
            answer = Some(result);
            if failed {
                Err(RedisLimiterError::timeout(self.settings.timeout))
            } else {
                Ok(())
            }
        });
        answer.unwrap_or_else(|| {
            Err(::redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::NotConnected,
            )))
        })
    }

    /// Runs `f` on the open connection, opening one first if there is
    /// none (or it was opened under another timeout); drops it after a
    /// failure that may have left it broken or holding a late answer.
    pub(super) fn run<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, RedisLimiterError>,
    ) -> Result<T, RedisLimiterError> {
        let mut slot = self.connection.open.lock();
        // A connection opened under another timeout is replaced.
        if slot
            .as_ref()
            .is_some_and(|(_, timeout)| *timeout != self.settings.timeout)
        {
            *slot = None;
        }
        let answer = match &mut *slot {
            Some(open) => Ok(open),
            None => self.open().map(|open| slot.insert(open)),
        }
        .and_then(|(connection, _)| f(connection));
        // After a socket error or a timeout the connection may be broken or
        // hold a late answer: start afresh next time.
        if answer
            .as_ref()
            .is_err_and(|err| err.kind() != RedisErrorKind::Script)
        {
            *slot = None;
        }
        answer
    }

    fn open(&self) -> Result<(Connection, Duration), RedisLimiterError> {
        let timeout = self.settings.timeout;
        let connection = self
            .connection
            .client
            .get_connection_with_timeout(timeout)?;
        connection.set_read_timeout(Some(timeout))?;
        connection.set_write_timeout(Some(timeout))?;
        Ok((connection, timeout))
    }
}

impl<Q: AsRef<str> + ?Sized> Limiter<Q> for RedisLimiter<BlockingConnection> {
    type Error = RedisDenial;

    fn quota(&self) -> Quota {
        self.settings.quota.load()
    }

    fn check_under(
        &self,
        key: &Q,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> Result<Decision, RedisDenial> {
        let outcome = self.decide(key.as_ref(), at, cost, quota);
        self.settings.conclude(cost, quota, outcome)
    }

    fn remaining_under(&self, key: &Q, at: At, quota: &Quota) -> Result<u64, RedisDenial> {
        let outcome = self.decide(key.as_ref(), at, 0, quota);
        self.settings.conclude_remaining(outcome)
    }
}

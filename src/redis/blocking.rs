//! The blocking twin of the async limiter: [`RedisLimiter`] over a plain
//! connection, for threads that are not in an async runtime.

use super::breaker::answered;
use super::call::Outcome;
use super::deadline::{Bounded, Deadline};
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
use std::time::Instant;

/// [`RedisLimiter`] without async: the same decisions, the same script and
/// the same settings, over one plain connection; its calls are
/// [`Limiter`]'s.
///
/// Calls on one limiter take turns on its connection; give each thread its
/// own limiter (they share the buckets through Redis) for parallel calls.
/// After a connection error or a timeout the connection is dropped, and the
/// next call opens a new one: reconnection is automatic. The timeout is one
/// deadline per call: the wait for the connection (another thread's call on
/// it), the connect and each command of the call share it, every socket
/// operation getting the time left, and a call with none left fails with
/// [`RedisErrorKind::Timeout`]. (redis-rs reads one reply in as many socket
/// reads as it takes, each with the time left when the command was sent: a
/// server that trickles a reply byte by byte can stretch a call past it,
/// and a host name that resolves to several addresses gives each address
/// the time left.) While the circuit breaker is open, calls fail at once,
/// as the async limiter's do.
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
///     .with_namespace(prefix, keyrate::KeyNames::Encoded);
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
/// failure; each call sets its socket timeouts to the time left of the
/// call's deadline.
pub struct BlockingConnection {
    client: Client,
    /// The open connection; `None` after a failure, until the next call
    /// reconnects.
    open: Mutex<Option<Connection>>,
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
        let deadline = Deadline::starting(Instant::now(), limiter.settings.timeout);
        let first = limiter.open(deadline)?;
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
                .map_err(|err| self.failed(err))
        });
        breaker.record(pass, answered(&answer), breaker.now());
        self.settings.finish(&call, answer)
    }

    /// One command over the connection (see [`run`](Self::run)).
    pub(super) fn query_blocking(
        &self,
        cmd: &::redis::Cmd,
    ) -> Result<::redis::Value, RedisLimiterError> {
        self.run(|connection| cmd.query(connection).map_err(|err| self.failed(err)))
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
    /// none, all under one deadline of the limiter's timeout (see
    /// [`Bounded`]); drops the connection after a failure that may have
    /// left it broken or holding a late answer.
    pub(super) fn run<T>(
        &self,
        f: impl FnOnce(&mut Bounded<'_>) -> Result<T, RedisLimiterError>,
    ) -> Result<T, RedisLimiterError> {
        let timeout = self.settings.timeout;
        let deadline = Deadline::starting(Instant::now(), timeout);
        // Another thread's call holds the connection for at most its own
        // deadline, which ends before this one's.
        let Some(mut slot) = self.connection.open.try_lock_until(deadline.at()) else {
            return Err(RedisLimiterError::timeout_waiting(timeout));
        };
        let answer = match &mut *slot {
            Some(open) => Ok(open),
            None => self.open(deadline).map(|open| slot.insert(open)),
        }
        .and_then(|connection| {
            f(&mut Bounded {
                connection,
                deadline,
            })
        });
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

    /// A new connection, its connect and handshake bounded by the time left
    /// of `deadline`.
    fn open(&self, deadline: Deadline) -> Result<Connection, RedisLimiterError> {
        deadline
            .left_or_timeout(Instant::now())
            .and_then(|left| self.connection.client.get_connection_with_timeout(left))
            .map_err(|err| self.failed(err))
    }

    /// A round trip's failure; a socket's timeout or the deadline's is said
    /// as the async limiter's: the deadline it missed.
    fn failed(&self, err: ::redis::RedisError) -> RedisLimiterError {
        if err.is_timeout() {
            RedisLimiterError::timeout(self.settings.timeout)
        } else {
            RedisLimiterError::from(err)
        }
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

//! The failure policy and the typed errors of the Redis limiters.

use crate::decision::Refusal;
use crate::error::Denial;
use ::redis::{ErrorKind, RedisError};
use std::fmt;
use std::time::Duration;

/// Why a Redis limiter did not admit a call: Redis's denial (the same
/// [`Denial`]s as in memory), or Redis's failure under a fail-closed
/// [`FailurePolicy`].
///
/// # Examples
///
/// ```
/// use keyrate::{Denial, Refusal, RedisDenial};
///
/// let denied = RedisDenial::from(Denial::InvalidTimestamp);
/// assert_eq!(denied.denial(), Some(&Denial::InvalidTimestamp));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisDenial {
    /// Redis (or the local deny mirror, or the checks made before any
    /// round trip) decided: the call is denied and spent nothing.
    Denied(Denial),
    /// Redis could not decide (unreachable, timed out, a bad reply) and
    /// the failure policy is [`FailurePolicy::Closed`]. A timeout may have
    /// come after the script ran: the spend may then have happened.
    Failed(RedisLimiterError),
}

impl From<Denial> for RedisDenial {
    fn from(denial: Denial) -> Self {
        RedisDenial::Denied(denial)
    }
}

impl From<RedisLimiterError> for RedisDenial {
    fn from(err: RedisLimiterError) -> Self {
        RedisDenial::Failed(err)
    }
}

impl fmt::Display for RedisDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisDenial::Denied(denial) => denial.fmt(f),
            RedisDenial::Failed(err) => write!(f, "refused (fail closed): {err}"),
        }
    }
}

impl std::error::Error for RedisDenial {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisDenial::Denied(denial) => Some(denial),
            RedisDenial::Failed(err) => Some(err),
        }
    }
}

impl Refusal for RedisDenial {
    fn denial(&self) -> Option<&Denial> {
        match self {
            RedisDenial::Denied(denial) => Some(denial),
            RedisDenial::Failed(_) => None,
        }
    }
}

/// What a Redis limiter answers when Redis cannot decide a call: admit it
/// (open) or refuse it (closed).
///
/// Every deciding call applies it, the same way: under `Open` the call is
/// `Ok` with a [`Decision`](crate::Decision) whose
/// [`is_degraded`](crate::Decision::is_degraded) is true; under `Closed` it
/// is `Err(`[`RedisDenial::Failed`]`)`, carrying the [`RedisLimiterError`].
/// [`remaining`](crate::AsyncLimiter::remaining) admits nothing, so it
/// always returns the failure. Either way the failure is counted in
/// [`Stats::backend_errors`](crate::Stats::backend_errors).
///
/// A call that the local deny mirror denies never reaches Redis, so it
/// stays a denial while Redis is down, under either policy: the policy
/// answers only calls that needed Redis (see
/// [`RedisLimiter::with_mirror_capacity`](crate::RedisLimiter::with_mirror_capacity)).
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// The connection or the limiter could not be configured: a bad URL,
    /// refused credentials, a bad setting (such as a short
    /// [`KeySecret`](crate::KeySecret)), or a call that does not work on
    /// this connection.
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
    /// Failed by the open circuit breaker, without a round trip.
    circuit_open: bool,
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

    /// Whether this call failed at once because the limiter's circuit
    /// breaker is open (Redis failed that many round trips in a row), with
    /// no round trip of its own. Its kind is
    /// [`Unavailable`](RedisErrorKind::Unavailable).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let err = RedisLimiter::connect("not a url", Quota::new(1.0, 1).unwrap())
    ///     .await
    ///     .unwrap_err();
    /// assert!(!err.is_circuit_open());
    /// # }
    /// ```
    #[must_use]
    pub fn is_circuit_open(&self) -> bool {
        self.circuit_open
    }

    pub(super) fn circuit_open(failures: u32) -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Unavailable,
            message: format!(
                "circuit open: {failures} round trips in a row failed; \
                 failing fast until a probe finds Redis back"
            ),
            source: None,
            circuit_open: true,
        }
    }

    /// A call that waited for the calls ahead of it (in flight on its key,
    /// or on the blocking limiter's connection) until its deadline, and had
    /// no time left for a round trip of its own.
    pub(super) fn timeout_waiting(after: Duration) -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Timeout,
            message: format!(
                "no answer from Redis within {after:?} (spent waiting for the calls ahead of it)"
            ),
            source: None,
            circuit_open: false,
        }
    }

    pub(super) fn timeout(after: Duration) -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Timeout,
            message: format!("no answer from Redis within {after:?}"),
            source: None,
            circuit_open: false,
        }
    }

    /// A bucket's Redis key holds something else. Its name is not in the
    /// message: with `KeyNames::Encoded` it holds the user's key, and
    /// errors reach logs.
    pub(super) fn foreign() -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Script,
            message: "a bucket key does not hold a keyrate word (another program wrote it?)"
                .to_owned(),
            source: None,
            circuit_open: false,
        }
    }

    pub(super) fn config(message: String) -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Config,
            message,
            source: None,
            circuit_open: false,
        }
    }

    pub(super) fn reply(what: &str) -> Self {
        RedisLimiterError {
            kind: RedisErrorKind::Reply,
            message: format!("unexpected reply from the keyrate script: {what}"),
            source: None,
            circuit_open: false,
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
            circuit_open: false,
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

#[cfg(test)]
mod tests {
    use super::*;

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

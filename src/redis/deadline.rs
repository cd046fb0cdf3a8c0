//! One deadline per blocking call: the wait for the connection, the
//! connect and every command of the call share it, and each socket
//! operation gets the time left as its timeout.

use ::redis::{Cmd, Connection, ConnectionLike, RedisError, RedisResult, Value};
use std::time::{Duration, Instant};

/// The instant a blocking call must be over by.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    at: Instant,
}

impl Deadline {
    /// The deadline of a call that starts at `now` with `timeout`.
    pub(super) fn starting(now: Instant, timeout: Duration) -> Self {
        // A timeout past what an Instant can hold is as good as none.
        let at = now
            .checked_add(timeout)
            .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
            .unwrap_or(now);
        Deadline { at }
    }

    /// The instant itself, for a wait on a lock.
    pub(super) fn at(self) -> Instant {
        self.at
    }

    /// The timeout of the next socket operation at `now`: the time left,
    /// or `None` when none is (a socket refuses a zero timeout, and a call
    /// with no time left must not start one).
    pub(super) fn left(self, now: Instant) -> Option<Duration> {
        self.at
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }

    /// [`left`](Self::left) at `now`, or the timeout error that ends the
    /// call.
    pub(super) fn left_or_timeout(self, now: Instant) -> RedisResult<Duration> {
        self.left(now).ok_or_else(out_of_time)
    }
}

/// The error of a call whose deadline passed before its next socket
/// operation: a timeout, as a socket's own would be.
fn out_of_time() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the call's deadline passed",
    ))
}

/// The open connection under one call's deadline: every command sent
/// through it first sets the socket's read and write timeouts to the time
/// left, or fails with a timeout when none is. A script call's three
/// round trips (`EVALSHA`, then `SCRIPT LOAD` and `EVALSHA` again after a
/// `NOSCRIPT`) thus share the deadline instead of getting a timeout each.
pub(super) struct Bounded<'c> {
    pub(super) connection: &'c mut Connection,
    pub(super) deadline: Deadline,
}

impl Bounded<'_> {
    /// Sets the socket's timeouts to the time left now.
    fn arm(&self) -> RedisResult<()> {
        let left = self.deadline.left_or_timeout(Instant::now())?;
        self.connection.set_read_timeout(Some(left))?;
        self.connection.set_write_timeout(Some(left))
    }
}

impl ConnectionLike for Bounded<'_> {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.arm()?;
        self.connection.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.arm()?;
        self.connection.req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.arm()?;
        self.connection.req_command(cmd)
    }

    fn get_db(&self) -> i64 {
        self.connection.get_db()
    }

    fn supports_pipelining(&self) -> bool {
        self.connection.supports_pipelining()
    }

    fn check_connection(&mut self) -> bool {
        self.arm().is_ok() && self.connection.check_connection()
    }

    fn is_open(&self) -> bool {
        self.connection.is_open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn each_operation_gets_the_time_left() {
        let start = Instant::now();
        let deadline = Deadline::starting(start, 300 * MS);
        assert_eq!(deadline.left(start), Some(300 * MS));
        // After a connect that took 120 ms, the next operation gets 180 ms,
        // not a fresh 300 ms.
        assert_eq!(deadline.left(start + 120 * MS), Some(180 * MS));
        assert_eq!(deadline.left(start + 299 * MS), Some(MS));
    }

    #[test]
    fn no_time_left_is_a_timeout_not_a_zero_timeout() {
        let start = Instant::now();
        let deadline = Deadline::starting(start, 300 * MS);
        for late in [300 * MS, 301 * MS, 10_000 * MS] {
            assert_eq!(deadline.left(start + late), None, "{late:?}");
            let err = deadline.left_or_timeout(start + late).unwrap_err();
            assert!(err.is_timeout(), "{err}");
            let err = crate::RedisLimiterError::from(err);
            assert_eq!(err.kind(), crate::RedisErrorKind::Timeout);
        }
    }

    #[test]
    fn a_huge_timeout_does_not_overflow() {
        let start = Instant::now();
        let deadline = Deadline::starting(start, Duration::MAX);
        assert!(deadline.left(start).is_some_and(|left| left > 1000 * MS));
    }
}

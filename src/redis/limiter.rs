//! The async limiter over a connection of the caller's choice.

use super::breaker::answered;
use super::call::{Outcome, Step};
use super::error::{RedisDenial, RedisLimiterError};
use super::settings::Settings;
use crate::decision::Decision;
use crate::gcra::Quota;
use crate::limiter::AsyncLimiter;
use crate::time::At;
use ::redis::aio::{ConnectionLike, ConnectionManager};
use std::fmt;
use std::future::Future;

/// A per-key token-bucket limiter whose buckets live in Redis, so that
/// every process using the same Redis shares each key's budget.
///
/// Same decisions as [`TokenBucketLimiter`](crate::TokenBucketLimiter)
/// (exact integer arithmetic, a new key starts full, cost 0 is free, a
/// cost above the capacity is never admitted, bad timestamps change
/// nothing, backwards time never creates tokens), made atomically inside
/// Redis by one Lua script per call, on one Redis key per bucket
/// (its namespace, then the key hashed or encoded: see
/// [`with_namespace`](Self::with_namespace)), so each call touches a
/// single hash slot and the limiter works on Redis Cluster. A limiter
/// left unnamed shares no bucket with any other limiter: name the
/// namespace in every process that must share a budget.
///
/// Its calls are [`AsyncLimiter`]'s (import it); the blocking twin,
/// [`BlockingRedisLimiter`](crate::BlockingRedisLimiter), is this type over
/// a blocking connection and answers [`Limiter`](crate::Limiter)'s. Two
/// sources of time:
///
/// - the caller's: `f64` seconds as in memory, or an exact [`Duration`](std::time::Duration)
///   since the epoch. Every process must then share one timeline, such as
///   Unix time from synchronised clocks;
/// - Redis's own clock, [`Now`](crate::Now): the script reads `TIME`, Unix
///   time with **microsecond** resolution, so application servers' clocks
///   need not agree. Mixing both on one key is consistent only when the
///   caller's timestamps are Unix time too (never mix `0.0` and `Now`).
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
/// [`RedisLimiterError`]s, never panics, answered by the
/// [`FailurePolicy`](crate::FailurePolicy). The default connection
/// ([`connect`](Self::connect)) is a [`ConnectionManager`], which
/// reconnects by itself. Cloning a limiter is cheap and shares the
/// connection.
///
/// # Examples
///
/// ```
/// use keyrate::{AsyncLimiter, Quota, RedisLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("KEYRATE_REDIS_URL")?;
/// # let prefix = format!("keyrate-doc:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
/// // url: for example "redis://127.0.0.1:6379"
/// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
///     .await?
///     .with_namespace(prefix, keyrate::KeyNames::Encoded);
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

impl<C, Q> AsyncLimiter<Q> for RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    Q: AsRef<str> + Sync + ?Sized,
{
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
    ) -> impl Future<Output = Result<Decision, RedisDenial>> + Send {
        let quota = *quota;
        async move {
            let outcome = self.decide(key.as_ref(), at, cost, &quota).await;
            self.settings.conclude(cost, &quota, outcome)
        }
    }

    fn remaining_under(
        &self,
        key: &Q,
        at: At,
        quota: &Quota,
    ) -> impl Future<Output = Result<u64, RedisDenial>> + Send {
        let quota = *quota;
        async move {
            let outcome = self.decide(key.as_ref(), at, 0, &quota).await;
            self.settings.conclude_remaining(outcome)
        }
    }
}

impl<C> RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The one path of every call: the core prepares it, Redis answers
    /// (unless the core decided alone), the core finishes it. One deadline
    /// covers the whole call: the wait for calls in flight on the key and
    /// the round trip.
    async fn decide(&self, key: &str, at: At, cost: u64, quota: &Quota) -> Outcome {
        let timeout = self.settings.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let call = loop {
            match self.settings.prepare_coalesced(key, at, cost, quota) {
                Step::Denied(denial) => return Ok(Err(denial)),
                Step::Ask(call) => break call,
                Step::Wait(landed) => {
                    let _ = tokio::time::timeout_at(deadline, landed).await;
                    if tokio::time::Instant::now() >= deadline {
                        // The calls ahead took the whole deadline: no time
                        // is left for a round trip of this call's own.
                        return Err(RedisLimiterError::timeout_waiting(timeout));
                    }
                }
            }
        };
        let breaker = &self.settings.breaker;
        let pass = breaker.admit(breaker.now())?;
        let invocation = self.settings.invocation(&call);
        let mut connection = self.connection.clone();
        let answer = tokio::time::timeout_at(deadline, invocation.invoke_async(&mut connection))
            .await
            .map_err(|_| RedisLimiterError::timeout(timeout))
            .and_then(|answer| answer.map_err(RedisLimiterError::from));
        breaker.record(pass, answered(&answer), breaker.now());
        self.settings.finish(&call, answer)
    }
}

impl<C> fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

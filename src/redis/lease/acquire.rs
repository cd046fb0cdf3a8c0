//! Taking a permit: one acquire script call, under the breaker and the
//! deadline, answered by the failure policy when Redis cannot decide.

use super::permit::{RedisConcurrencyDenial, RedisPermit};
use super::renew::{self, Lease, RenewHandle, Renewal};
use super::script::{self, millis};
use super::stats::Counters;
use super::RedisConcurrencyLimiter;
use crate::concurrency::ConcurrencyDenial;
use crate::redis::breaker::answered;
use crate::redis::error::RedisLimiterError;
use crate::sync::unmodeled::Relaxed;
use ::redis::aio::ConnectionLike;
use ::redis::Value;
use std::sync::Arc;

/// An acquire's lease while its answer is awaited: dropped armed (the
/// call failed, timed out or was cancelled, and the script may have run),
/// it queues the lease's release, which removes it if it was taken.
struct Pending<'a> {
    renewer: &'a RenewHandle,
    lease: Option<Lease>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.renewer.release(lease, false);
        }
    }
}

/// # Taking a permit
impl<C> RedisConcurrencyLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Takes one of `key`'s permits if it holds fewer than the default
    /// limit ([`max`](Self::max)) over every process sharing the limit:
    /// one script call.
    ///
    /// Cancel-safe: a future dropped before its answer queues the
    /// release of the lease it may have taken.
    ///
    /// # Errors
    ///
    /// [`RedisConcurrencyDenial::Denied`] with
    /// [`ConcurrencyDenial::AtLimit`] when the key holds its limit;
    /// [`RedisConcurrencyDenial::Failed`] when Redis could not decide and
    /// the failure policy is closed (or outside a tokio runtime, kind
    /// `Config`).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 1).await?;
    /// let permit = limiter.try_acquire("k").await?;
    /// assert!(limiter.try_acquire("k").await.is_err());
    /// # drop(permit);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire(&self, key: &str) -> Result<RedisPermit, RedisConcurrencyDenial> {
        self.try_acquire_under(key, self.max()).await
    }

    /// [`try_acquire`](Self::try_acquire) under the limit `max` instead of
    /// the default (a plan's). `max` 0 refuses without Redis.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{ConcurrencyDenial, RedisConcurrencyLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 1).await?;
    /// let _a = limiter.try_acquire_under("pro", 2).await?;
    /// let _b = limiter.try_acquire_under("pro", 2).await?;
    /// let suspended = limiter.try_acquire_under("k", 0).await.unwrap_err();
    /// assert_eq!(suspended.denial(), Some(&ConcurrencyDenial::AtLimit { held: 0, max: 0 }));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire_under(
        &self,
        key: &str,
        max: u32,
    ) -> Result<RedisPermit, RedisConcurrencyDenial> {
        let outcome = if max == 0 {
            Ok(Err(ConcurrencyDenial::AtLimit { held: 0, max }))
        } else {
            self.take(key, max).await
        };
        self.answer(outcome)
    }

    /// Counts a call's outcome and answers it, by the failure policy when
    /// Redis could not decide.
    pub(super) fn answer(
        &self,
        outcome: Result<Result<RedisPermit, ConcurrencyDenial>, RedisLimiterError>,
    ) -> Result<RedisPermit, RedisConcurrencyDenial> {
        let counters = &self.core.counters;
        match outcome {
            Ok(Ok(permit)) => {
                Counters::add(&counters.acquired, 1);
                Ok(permit)
            }
            Ok(Err(denial)) => {
                let counter = match denial {
                    ConcurrencyDenial::TimedOut { .. } => &counters.timed_out,
                    _ => &counters.refused_at_limit,
                };
                Counters::add(counter, 1);
                Err(RedisConcurrencyDenial::Denied(denial))
            }
            Err(err) => {
                Counters::add(&counters.failed, 1);
                if self.settings.failure_policy.admits() {
                    Counters::add(&counters.degraded, 1);
                    Ok(RedisPermit::degraded())
                } else {
                    Err(RedisConcurrencyDenial::Failed(err))
                }
            }
        }
    }

    /// The leases `key` holds now over every process (expired ones
    /// dropped first): the acquire script under a limit of 0, which
    /// takes nothing.
    ///
    /// # Errors
    ///
    /// A [`RedisLimiterError`] when Redis does not answer in time; no
    /// failure policy (it admits nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 2).await?;
    /// let _p = limiter.try_acquire("k").await?;
    /// assert_eq!(limiter.held("k").await?, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn held(&self, key: &str) -> Result<u32, RedisLimiterError> {
        let lease_key = self.lease_key(key);
        let invocation = script::acquire(&self.settings.acquire, &lease_key, 0, 1, "");
        let answer = self
            .call(invocation.invoke_async(&mut self.connection.clone()))
            .await?;
        Ok(script::parse_acquired(&answer)?.held)
    }

    /// One acquire: the permit or the limit's denial, or Redis's failure.
    pub(super) async fn take(
        &self,
        key: &str,
        max: u32,
    ) -> Result<Result<RedisPermit, ConcurrencyDenial>, RedisLimiterError> {
        let renewer = self.renewer()?;
        let lease = Lease {
            key: self.lease_key(key),
            id: self.core.next_id(),
        };
        let lease_ms = millis(self.settings.lease);
        let invocation =
            script::acquire(&self.settings.acquire, &lease.key, max, lease_ms, &lease.id);
        let mut pending = Pending {
            renewer: &renewer,
            lease: Some(lease),
        };
        let answer = self
            .call(invocation.invoke_async(&mut self.connection.clone()))
            .await?;
        let acquired = script::parse_acquired(&answer)?;
        if !acquired.admitted {
            // Nothing was taken: nothing to release.
            pending.lease = None;
            return Ok(Err(ConcurrencyDenial::AtLimit {
                held: acquired.held,
                max,
            }));
        }
        let Some(lease) = pending.lease.take() else {
            return Err(RedisLimiterError::reply("the lease vanished"));
        };
        renewer.hold(&lease);
        // Relaxed: a gauge.
        self.core.counters.held.fetch_add(1, Relaxed);
        Ok(Ok(RedisPermit::leased(
            lease,
            renewer.clone(),
            acquired.held,
            acquired.now_ms,
        )))
    }

    /// One round trip under the breaker and the deadline.
    async fn call(
        &self,
        call: impl std::future::Future<Output = ::redis::RedisResult<Value>>,
    ) -> Result<Value, RedisLimiterError> {
        let breaker = &self.settings.breaker;
        let pass = breaker.admit(breaker.now())?;
        let timeout = self.settings.timeout;
        let answer = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| RedisLimiterError::timeout(timeout))
            .and_then(|answer| answer.map_err(RedisLimiterError::from));
        breaker.record(pass, answered(&answer), breaker.now());
        answer
    }

    /// The renewal task, started on this runtime if it is not running.
    fn renewer(&self) -> Result<RenewHandle, RedisLimiterError> {
        let mut renewer = self.core.renewer.lock();
        if let Some(handle) = renewer.as_ref().filter(|handle| handle.is_live()) {
            return Ok(handle.clone());
        }
        let lease = self.settings.lease;
        let handle = renew::spawn(Renewal {
            connection: self.connection.clone(),
            script: Arc::clone(&self.settings.renew),
            lease_ms: millis(lease),
            every: lease / 3,
            timeout: self.settings.timeout,
            counters: Arc::clone(&self.core.counters),
            one_slot: self.settings.names.hash_tag(),
        })?;
        *renewer = Some(handle.clone());
        Ok(handle)
    }
}

/// The front end the tower layer takes: a call with a maximum wait polls
/// ([`acquire_under`](RedisConcurrencyLimiter::acquire_under)).
impl<C, Q> crate::concurrency::AsyncConcurrencyLimiter<Q> for RedisConcurrencyLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    Q: AsRef<str> + Sync + ?Sized,
{
    type Permit = RedisPermit;
    type Error = RedisConcurrencyDenial;

    fn max(&self) -> u32 {
        RedisConcurrencyLimiter::max(self)
    }

    fn acquire_under(
        &self,
        key: &Q,
        max: u32,
        max_wait: std::time::Duration,
    ) -> impl std::future::Future<Output = Result<RedisPermit, RedisConcurrencyDenial>> + Send {
        RedisConcurrencyLimiter::acquire_under(self, key.as_ref(), max, max_wait)
    }

    fn concurrency_denial(error: &RedisConcurrencyDenial) -> Option<&ConcurrencyDenial> {
        error.denial()
    }
}

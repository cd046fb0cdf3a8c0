//! The compound calls' front ends: the round trip of a prepared call,
//! async and blocking, and [`AsyncCompound`] and [`Compound`] for the
//! limiter and for its placed view.

use super::core::{Call, Outcome};
use super::{Placed, RedisCompoundDenial};
use crate::compound::{AsyncCompound, Compound, CompoundDecision, Policy};
use crate::redis::blocking::BlockingConnection;
use crate::redis::breaker::answered;
use crate::redis::error::RedisLimiterError;
use crate::redis::limiter::RedisLimiter;
use crate::time::At;
use ::redis::aio::ConnectionLike;
use std::future::Future;

impl<C> RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A compound check: the core prepares it (or denies it without
    /// Redis), Redis answers, the core decides and counts.
    async fn check_compound<Q: AsRef<str> + ?Sized>(
        &self,
        scopes: &[(&Q, &Policy)],
        anchor: Option<&str>,
        at: At,
        cost: u64,
    ) -> Result<CompoundDecision, RedisCompoundDenial> {
        let settings = &self.settings;
        match settings.prepare_compound(scopes, anchor, at, cost) {
            Ok(call) => {
                let outcome = self.ask_compound(&call).await;
                settings.conclude_compound(call.policies(), cost, outcome)
            }
            Err(denial) => settings.conclude_compound(&[], cost, Ok(Err(denial))),
        }
    }

    /// A compound `remaining`: a cost-0 call on one scope, not counted.
    async fn remaining_compound<Q: AsRef<str> + ?Sized>(
        &self,
        key: &Q,
        policy: &Policy,
        anchor: Option<&str>,
        at: At,
    ) -> Result<u64, RedisCompoundDenial> {
        let outcome = match self
            .settings
            .prepare_compound(&[(key, policy)], anchor, at, 0)
        {
            Ok(call) => self.ask_compound(&call).await,
            Err(denial) => Ok(Err(denial)),
        };
        self.settings.conclude_compound_remaining(outcome)
    }

    /// The round trip of a prepared call, under the breaker and one
    /// deadline.
    async fn ask_compound(&self, call: &Call<'_>) -> Outcome {
        let settings = &self.settings;
        let breaker = &settings.breaker;
        let pass = breaker.admit(breaker.now())?;
        let invocation = settings.compound_invocation(call);
        let mut connection = self.connection.clone();
        let answer =
            tokio::time::timeout(settings.timeout, invocation.invoke_async(&mut connection))
                .await
                .map_err(|_| RedisLimiterError::timeout(settings.timeout))
                .and_then(|answer| answer.map_err(RedisLimiterError::from));
        breaker.record(pass, answered(&answer), breaker.now());
        settings.finish_compound(call, answer)
    }
}

impl RedisLimiter<BlockingConnection> {
    /// A compound check over the blocking connection, as the async one.
    fn check_compound_blocking<Q: AsRef<str> + ?Sized>(
        &self,
        scopes: &[(&Q, &Policy)],
        anchor: Option<&str>,
        at: At,
        cost: u64,
    ) -> Result<CompoundDecision, RedisCompoundDenial> {
        let settings = &self.settings;
        match settings.prepare_compound(scopes, anchor, at, cost) {
            Ok(call) => {
                let outcome = self.ask_compound_blocking(&call);
                settings.conclude_compound(call.policies(), cost, outcome)
            }
            Err(denial) => settings.conclude_compound(&[], cost, Ok(Err(denial))),
        }
    }

    /// A compound `remaining` over the blocking connection.
    fn remaining_compound_blocking<Q: AsRef<str> + ?Sized>(
        &self,
        key: &Q,
        policy: &Policy,
        anchor: Option<&str>,
        at: At,
    ) -> Result<u64, RedisCompoundDenial> {
        let outcome = match self
            .settings
            .prepare_compound(&[(key, policy)], anchor, at, 0)
        {
            Ok(call) => self.ask_compound_blocking(&call),
            Err(denial) => Ok(Err(denial)),
        };
        self.settings.conclude_compound_remaining(outcome)
    }

    /// The round trip of a prepared call, under the breaker.
    fn ask_compound_blocking(&self, call: &Call<'_>) -> Outcome {
        let settings = &self.settings;
        let breaker = &settings.breaker;
        let pass = breaker.admit(breaker.now())?;
        let invocation = settings.compound_invocation(call);
        let answer = self.run(|connection| {
            invocation
                .invoke(connection)
                .map_err(RedisLimiterError::from)
        });
        breaker.record(pass, answered(&answer), breaker.now());
        settings.finish_compound(call, answer)
    }
}

impl<C, Q> AsyncCompound<Q> for RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    Q: AsRef<str> + Sync + ?Sized,
{
    type Error = RedisCompoundDenial;

    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> impl Future<Output = Result<CompoundDecision, RedisCompoundDenial>> + Send {
        self.check_compound(scopes, None, at.into(), cost)
    }

    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> impl Future<Output = Result<u64, RedisCompoundDenial>> + Send {
        self.remaining_compound(key, policy, None, at.into())
    }
}

impl<C, Q> AsyncCompound<Q> for Placed<'_, RedisLimiter<C>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    Q: AsRef<str> + Sync + ?Sized,
{
    type Error = RedisCompoundDenial;

    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> impl Future<Output = Result<CompoundDecision, RedisCompoundDenial>> + Send {
        self.limiter
            .check_compound(scopes, Some(self.anchor), at.into(), cost)
    }

    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> impl Future<Output = Result<u64, RedisCompoundDenial>> + Send {
        self.limiter
            .remaining_compound(key, policy, Some(self.anchor), at.into())
    }
}

impl<Q: AsRef<str> + ?Sized> Compound<Q> for RedisLimiter<BlockingConnection> {
    type Error = RedisCompoundDenial;

    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> Result<CompoundDecision, RedisCompoundDenial> {
        self.check_compound_blocking(scopes, None, at.into(), cost)
    }

    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> Result<u64, RedisCompoundDenial> {
        self.remaining_compound_blocking(key, policy, None, at.into())
    }
}

impl<Q: AsRef<str> + ?Sized> Compound<Q> for Placed<'_, RedisLimiter<BlockingConnection>> {
    type Error = RedisCompoundDenial;

    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> Result<CompoundDecision, RedisCompoundDenial> {
        self.limiter
            .check_compound_blocking(scopes, Some(self.anchor), at.into(), cost)
    }

    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> Result<u64, RedisCompoundDenial> {
        self.limiter
            .remaining_compound_blocking(key, policy, Some(self.anchor), at.into())
    }
}

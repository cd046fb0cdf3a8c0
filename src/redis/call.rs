//! The core both front ends share, with no I/O: prepare a call (or decide
//! it without Redis), then finish it from Redis's answer. The async
//! [`RedisLimiter`](crate::RedisLimiter) and the blocking
//! [`BlockingRedisLimiter`](crate::BlockingRedisLimiter) only carry the
//! prepared call to Redis and its answer back.

use super::error::{RedisDenial, RedisLimiterError};
use super::mirror::{Boarding, FlightGuard};
use super::script::{self, Guess, When};
use super::settings::Settings;
use crate::decision::Decision;
use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::observe::Cell;
use crate::time::{At, Nanos};
use ::redis::{ScriptInvocation, Value};
use std::pin::Pin;
use tokio::sync::futures::OwnedNotified;

/// What every call comes to before the failure policy: Redis's failure,
/// or the decision.
pub(super) type Outcome = Result<Result<Decision, Denial>, RedisLimiterError>;

/// What to do with a call.
#[derive(Debug)]
pub(super) enum Step {
    /// Denied without Redis.
    Denied(Denial),
    /// Ask Redis.
    Ask(Call),
    /// Calls on the key in flight may use up what this one needs: wait
    /// for one of them to end, then prepare again.
    Wait(Pin<Box<OwnedNotified>>),
}

/// One call that needs Redis.
#[derive(Debug)]
pub(super) struct Call {
    key: String,
    now: When,
    cost: u64,
    /// The quota the call is decided under.
    quota: Quota,
    /// The refill the call uses up; 0 only reads.
    spend: Nanos,
    /// The script's fast path, with the caller's time.
    guess: Option<Guess>,
    /// The local instant the call was prepared, for the mirror's estimate
    /// of Redis's clock.
    sent: Nanos,
    /// Held while the call is the key's flight to Redis (dropped with the
    /// call, answered or not).
    _flight: Option<FlightGuard>,
}

impl Settings {
    /// The call to make for `cost` tokens of `key` at `at` under `quota`,
    /// or its denial without Redis: an invalid instant, a cost above the
    /// capacity, or a denial by the mirror's bound. A call made this way
    /// does not coalesce (the blocking limiter, whose calls already take
    /// turns).
    pub(super) fn prepare(
        &self,
        key: &str,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> Result<Call, Denial> {
        self.try_prepare(key, When::from_at(at), cost, quota)
            .map(|(call, _)| call)
    }

    /// [`prepare`](Self::prepare), then boarding: a spending call that the
    /// mirror's bound admits waits while another call on the key is in
    /// flight, since that one may use up what this one needs.
    pub(super) fn prepare_coalesced(&self, key: &str, at: At, cost: u64, quota: &Quota) -> Step {
        let (mut call, board_at) = match self.try_prepare(key, When::from_at(at), cost, quota) {
            Ok(prepared) => prepared,
            Err(denial) => return Step::Denied(denial),
        };
        if let (Some(mirror), Some(at), true) = (&self.mirror, board_at, call.spend > Nanos::ZERO) {
            match mirror.board(&call.key, at, call.cost, call.spend, &call.quota) {
                Boarding::Go(guard) => call._flight = guard,
                Boarding::Wait(wait) => return Step::Wait(wait),
            }
        }
        Step::Ask(call)
    }

    /// The call, and the mirror's estimate of its instant (for boarding;
    /// `None` without a mirror or an estimate).
    fn try_prepare(
        &self,
        key: &str,
        now: Option<When>,
        cost: u64,
        quota: &Quota,
    ) -> Result<(Call, Option<Nanos>), Denial> {
        let now = now.ok_or(Denial::InvalidTimestamp)?;
        let spend = gcra::spend_for(cost, quota)?;
        let key = self.bucket_key(key);
        let mut guessed = None;
        let mut sent = Nanos::ZERO;
        let mut board_at = None;
        if let Some(mirror) = &self.mirror {
            sent = mirror.local_now();
            let known = mirror.bound(&key, sent);
            let bound = known.and_then(|known| known.fresh);
            guessed = known.map(|known| known.guess);
            board_at = match now {
                When::At(ns) => Some(ns),
                // An overestimate of Redis's clock: the bound denies
                // locally only what Redis would deny at that instant.
                When::Server => mirror.server_now(),
            };
            if let (Some(at), Some(bound)) = (board_at, bound) {
                // The real word is at least the bound: a denial here is
                // Redis's denial too.
                if let Err(denial) = gcra::decide(bound, at, cost, quota) {
                    self.counters.add(Cell::MirrorDenials, 1);
                    return Err(denial);
                }
            }
        }
        let mut guess = None;
        if spend > Nanos::ZERO {
            // However old, the bound is the likeliest stored word.
            let expected = guessed.unwrap_or(Nanos::ZERO);
            guess = match now {
                When::At(ns) => gcra::decide(expected, ns, cost, quota)
                    .ok()
                    .map(|word| Guess::new(expected, word, ns, self.min_ttl_ms)),
                When::Server => {
                    Guess::at_server(expected, spend, quota.window() - spend, self.min_ttl_ms)
                }
            };
        }
        let call = Call {
            key,
            now,
            cost,
            quota: *quota,
            spend,
            guess,
            sent,
            _flight: None,
        };
        Ok((call, board_at))
    }

    /// The script invocation that carries `call` to Redis.
    pub(super) fn invocation(&self, call: &Call) -> ScriptInvocation<'_> {
        let mut invocation = self.script.key(&call.key);
        script::arguments(
            &mut invocation,
            call.now,
            call.spend,
            call.quota.window(),
            self.min_ttl_ms,
            call.guess,
        );
        invocation
    }

    /// The outcome of `call` from Redis's `answer`: `gcra::decide` on the
    /// word the script read, at the instant it decided, which must agree
    /// with what the script did. The mirror learns the word Redis now
    /// holds.
    pub(super) fn finish(&self, call: &Call, answer: Result<Value, RedisLimiterError>) -> Outcome {
        let at = match call.now {
            When::At(ns) => Some(ns),
            When::Server => None,
        };
        let guessed = call.guess.map(|guess| guess.expected);
        let reply = script::parse(&answer?, at, guessed)?;
        let decision = gcra::decide(reply.full_at, reply.now, call.cost, &call.quota);
        if decision.is_ok() != reply.admitted {
            return Err(RedisLimiterError::reply(
                "the script and gcra::decide disagree on the word it read",
            ));
        }
        if let Some(mirror) = &self.mirror {
            if at.is_none() {
                mirror.saw_server_time(reply.now, call.sent);
            }
            let word = decision.unwrap_or(reply.full_at).max(reply.full_at);
            mirror.learn(&call.key, word, reply.now, call.sent);
        }
        Ok(decision.map(|word| Decision::new(word, reply.now, &call.quota)))
    }

    /// A check's answer from its outcome: counted, then the failure policy
    /// applied to a failure.
    pub(super) fn conclude(
        &self,
        cost: u64,
        quota: &Quota,
        outcome: Outcome,
    ) -> Result<Decision, RedisDenial> {
        match self.record(cost, outcome) {
            Ok(Ok(decision)) => Ok(decision),
            Ok(Err(denial)) => Err(RedisDenial::Denied(denial)),
            Err(_) if self.failure_policy.admits() => Ok(Decision::degraded(quota)),
            Err(err) => Err(RedisDenial::Failed(err)),
        }
    }

    /// A `remaining`'s answer from its cost-0 outcome: no policy, since it
    /// admits nothing, and not counted as a decision (as in memory); only a
    /// failed round trip is counted.
    pub(super) fn conclude_remaining(&self, outcome: Outcome) -> Result<u64, RedisDenial> {
        match outcome {
            Ok(Ok(decision)) => Ok(decision.remaining()),
            Ok(Err(denial)) => Err(RedisDenial::Denied(denial)),
            Err(err) => Err(RedisDenial::Failed(self.failed(err))),
        }
    }
}

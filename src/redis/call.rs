//! The core both front ends share, with no I/O: prepare a call (or decide
//! it without Redis), then finish it from Redis's answer. The async
//! [`RedisLimiter`](crate::RedisLimiter) and the blocking
//! [`BlockingRedisLimiter`](crate::BlockingRedisLimiter) only carry the
//! prepared call to Redis and its answer back.

use super::error::RedisLimiterError;
use super::script::{self, Now, Reply};
use super::settings::Settings;
use crate::error::Denial;
use crate::gcra;
use ::redis::{ScriptInvocation, Value};
use std::time::Duration;

/// What every checking call returns: Redis's failure, or the decision.
pub(super) type Outcome = Result<Result<u64, Denial>, RedisLimiterError>;

/// One call that needs Redis.
#[derive(Debug)]
pub(super) struct Call {
    key: String,
    now: Now,
    /// Nanoseconds of refill the call uses up; 0 only reads.
    spend: u64,
}

impl Settings {
    /// The call to make for `cost` tokens of `key` at `now`, or the
    /// decision made without Redis (an invalid timestamp, a cost above the
    /// capacity).
    pub(super) fn prepare(
        &self,
        key: &str,
        now: Option<Now>,
        cost: u64,
    ) -> Result<Call, Result<u64, Denial>> {
        let Some(now) = now else {
            return Err(Err(Denial::InvalidTimestamp));
        };
        let spend = gcra::spend_for(cost, &self.quota).map_err(Err)?;
        Ok(Call {
            key: self.bucket_key(key),
            now,
            spend,
        })
    }

    /// The script invocation that carries `call` to Redis.
    pub(super) fn invocation(&self, call: &Call) -> ScriptInvocation<'_> {
        let mut invocation = self.script.key(&call.key);
        script::arguments(
            &mut invocation,
            call.now,
            call.spend,
            self.quota.window(),
            self.min_ttl_ms,
        );
        invocation
    }

    /// The outcome of `call` from Redis's `answer`.
    pub(super) fn finish(&self, _call: &Call, answer: Result<Value, RedisLimiterError>) -> Outcome {
        let reply = script::parse(&answer?)?;
        Ok(self.decision(reply))
    }

    /// Whether a boolean call admits: the decision, or the failure policy.
    pub(super) fn admits(&self, outcome: Outcome) -> bool {
        match outcome {
            Ok(decision) => decision.is_ok(),
            Err(_) => self.failure_policy.admits(),
        }
    }

    /// The decision a reply carries, as `gcra::decide` would return it.
    fn decision(&self, reply: Reply) -> Result<u64, Denial> {
        if reply.admitted {
            return Ok(gcra::tokens_at(reply.value, reply.now, &self.quota));
        }
        // In memory the missing refill saturates at u64::MAX before the
        // window is subtracted; do the same so retry-after agrees even there.
        let window = self.quota.window();
        let missing = reply.value.saturating_add(window);
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_nanos(missing - window),
        })
    }
}

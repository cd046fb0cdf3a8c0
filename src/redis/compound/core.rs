//! The I/O-free core of a compound call on Redis, shared by the async and
//! the blocking front ends: check the call and name its buckets, deny it
//! by the mirror's bounds or build its one script invocation, then decide
//! from the words the script read, with the rule of `compound::decide`.

use super::super::error::RedisLimiterError;
use super::super::script::{join, limbs, word, When};
use super::super::settings::Settings;
use super::error::RedisCompoundDenial;
use super::slot;
use crate::compound::decide::{self, Words};
use crate::compound::stats::Cell;
use crate::compound::{CompoundDecision, CompoundDenial, Policy, MAX_QUOTAS};
use crate::gcra;
use crate::time::{At, Nanos};
use ::redis::{ScriptInvocation, Value};

/// What a compound call comes to before the failure policy.
pub(super) type Outcome = Result<Result<CompoundDecision, CompoundDenial>, RedisLimiterError>;

/// One compound call that needs Redis.
#[derive(Debug)]
pub(super) struct Call<'p> {
    /// The Redis name of each scope's bucket, in the call's order.
    names: Vec<String>,
    policies: Vec<&'p Policy>,
    now: When,
    cost: u64,
    /// The local instant the call was prepared (the mirror's clock).
    sent: Nanos,
}

impl Settings {
    /// The call for `cost` on `scopes` at `at`, each bucket named under
    /// `anchor`, or its denial without Redis, in the in-memory limiter's
    /// order of checks (no scope, a key named twice, a bad instant, a cost
    /// above a capacity), then keys in different slots, then the mirror:
    /// a spending call that every scope's fresh bound already denies is
    /// denied here, exactly as Redis would deny it.
    pub(super) fn prepare_compound<'p, Q: AsRef<str> + ?Sized>(
        &self,
        scopes: &[(&Q, &'p Policy)],
        anchor: Option<&str>,
        at: At,
        cost: u64,
    ) -> Result<Call<'p>, CompoundDenial> {
        if scopes.is_empty() {
            return Err(CompoundDenial::NoScopes);
        }
        for (second, (key, _)) in scopes.iter().enumerate() {
            let key = key.as_ref();
            if let Some(first) = scopes[..second].iter().position(|(k, _)| k.as_ref() == key) {
                return Err(CompoundDenial::DuplicateKey { first, second });
            }
        }
        let now = When::from_at(at).ok_or(CompoundDenial::InvalidTimestamp)?;
        decide::check_costs(scopes.iter().map(|&(_, policy)| policy), cost)?;
        let names: Vec<String> = scopes
            .iter()
            .map(|(key, _)| self.names.placed_key(key.as_ref(), anchor))
            .collect();
        slot::one_slot(&names)?;
        let call = Call {
            names,
            policies: scopes.iter().map(|&(_, policy)| policy).collect(),
            now,
            cost,
            sent: Nanos::ZERO,
        };
        self.deny_by_bounds(call)
    }

    /// The mirror's say on a prepared call: a denial when every scope has
    /// a fresh bound and the bounds deny it (each real word is at least
    /// its bound, so Redis denies it too), else the call, stamped.
    fn deny_by_bounds<'p>(&self, mut call: Call<'p>) -> Result<Call<'p>, CompoundDenial> {
        let Some(mirror) = &self.mirror else {
            return Ok(call);
        };
        call.sent = mirror.local_now();
        let at = match call.now {
            When::At(ns) => Some(ns),
            // An overestimate of Redis's clock, as for single calls.
            When::Server => mirror.server_now(),
        };
        let (Some(at), true) = (at, call.cost > 0) else {
            return Ok(call);
        };
        let bounds: Option<Vec<Words>> = call
            .names
            .iter()
            .map(|name| mirror.words.bound(name, call.sent))
            .collect();
        let Some(bounds) = bounds else {
            return Ok(call);
        };
        match decide::verdict(scopes(&bounds, &call.policies), at, call.cost) {
            Ok(()) => Ok(call),
            Err(denial) => {
                self.compound_counters.add(Cell::MirrorDenials, 1);
                Err(denial)
            }
        }
    }

    /// The script invocation that carries `call` to Redis.
    pub(super) fn compound_invocation(&self, call: &Call<'_>) -> ScriptInvocation<'_> {
        let mut invocation = self.compound_script.prepare_invoke();
        for name in &call.names {
            invocation.key(name);
        }
        match call.now {
            When::At(ns) => {
                let (secs, nanos) = limbs(ns);
                invocation.arg(secs).arg(nanos);
            }
            When::Server => {
                invocation.arg("time").arg(0);
            }
        }
        invocation.arg(self.min_ttl_ms).arg(u8::from(call.cost > 0));
        if call.cost > 0 {
            for policy in &call.policies {
                invocation.arg(policy.quotas().len());
                for quota in policy.quotas() {
                    // check_costs admitted the cost: spend <= window.
                    let spend = gcra::spend_for(call.cost, quota).unwrap_or(quota.window());
                    let (slack_s, slack_n) = limbs(quota.window() - spend);
                    let (spend_s, spend_n) = limbs(spend);
                    invocation
                        .arg(slack_s)
                        .arg(slack_n)
                        .arg(spend_s)
                        .arg(spend_n);
                }
            }
        }
        invocation
    }

    /// The outcome of `call` from Redis's `answer`: the rule decided on
    /// the words the script read, at the instant it decided, which must
    /// agree with what the script did. The mirror learns every scope's
    /// words as Redis now holds them.
    pub(super) fn finish_compound(
        &self,
        call: &Call<'_>,
        answer: Result<Value, RedisLimiterError>,
    ) -> Outcome {
        let (admitted, now, mut words) = self.parse_compound(call, &answer?)?;
        let verdict = if call.cost == 0 {
            Ok(())
        } else {
            decide::verdict(scopes(&words, &call.policies), now, call.cost)
        };
        if verdict.is_ok() != admitted {
            return Err(RedisLimiterError::reply(
                "the compound script and the rule disagree on the words it read",
            ));
        }
        if verdict.is_ok() && call.cost > 0 {
            for (w, policy) in words.iter_mut().zip(&call.policies) {
                decide::apply(w, policy, now, call.cost);
            }
        }
        if let Some(mirror) = &self.mirror {
            if matches!(call.now, When::Server) {
                mirror.saw_server_time(now, call.sent);
            }
            for (name, w) in call.names.iter().zip(&words) {
                mirror
                    .words
                    .learn(name, *w, now, call.sent, || mirror.floor());
            }
        }
        Ok(verdict.map(|()| decide::summary(scopes(&words, &call.policies), now)))
    }

    /// The script's reply: whether it admitted, its instant, and each
    /// scope's words as read.
    fn parse_compound(
        &self,
        call: &Call<'_>,
        answer: &Value,
    ) -> Result<(bool, Nanos, Vec<Words>), RedisLimiterError> {
        let shape = || RedisLimiterError::reply("expected [admitted, secs, nanos, values...]");
        let Value::Array(items) = answer else {
            return Err(shape());
        };
        if items.len() != 3 + call.names.len() {
            return Err(shape());
        }
        let int = |v: &Value| ::redis::from_redis_value::<i64>(v).map_err(|_| shape());
        let admitted = int(&items[0])? == 1;
        let now = match call.now {
            When::At(ns) => ns,
            When::Server => join(int(&items[1])?, int(&items[2])?)
                .ok_or_else(|| RedisLimiterError::reply("bad time limbs"))?,
        };
        let words = items[3..]
            .iter()
            .map(|value| {
                let value: String = ::redis::from_redis_value(value).map_err(|_| shape())?;
                words(&value).ok_or_else(RedisLimiterError::foreign)
            })
            .collect::<Result<_, _>>()?;
        Ok((admitted, now, words))
    }

    /// A compound call's answer from its outcome: counted, then the
    /// failure policy applied to a failure.
    pub(super) fn conclude_compound(
        &self,
        policies: &[&Policy],
        cost: u64,
        outcome: Outcome,
    ) -> Result<CompoundDecision, RedisCompoundDenial> {
        match outcome {
            Ok(result) => {
                self.compound_counters.decided(cost, result.as_ref());
                result.map_err(RedisCompoundDenial::Denied)
            }
            Err(err) => {
                self.compound_counters.add(Cell::BackendErrors, 1);
                if self.failure_policy.admits() {
                    Ok(decide::degraded(policies.iter().copied()))
                } else {
                    Err(RedisCompoundDenial::Failed(err))
                }
            }
        }
    }

    /// A compound `remaining`'s answer from its cost-0 outcome: not
    /// counted as a decision; a failure is, and is returned.
    pub(super) fn conclude_compound_remaining(
        &self,
        outcome: Outcome,
    ) -> Result<u64, RedisCompoundDenial> {
        match outcome {
            Ok(result) => result
                .map(|decision| decision.remaining())
                .map_err(RedisCompoundDenial::Denied),
            Err(err) => {
                self.compound_counters.add(Cell::BackendErrors, 1);
                Err(RedisCompoundDenial::Failed(err))
            }
        }
    }
}

/// Each scope's index, words and policy, as `compound::decide` takes them.
fn scopes<'a>(
    words: &'a [Words],
    policies: &'a [&'a Policy],
) -> impl Iterator<Item = (usize, &'a Words, &'a Policy)> {
    words
        .iter()
        .zip(policies)
        .enumerate()
        .map(|(i, (w, p))| (i, w, *p))
}

impl Call<'_> {
    /// The policies of the call's scopes, in order.
    pub(super) fn policies(&self) -> &[&Policy] {
        &self.policies
    }
}

/// The words a compound bucket key holds: up to [`MAX_QUOTAS`] decimals
/// joined by `,` (one word: a single-quota bucket), `""` for a missing
/// key; missing words are 0.
pub(super) fn words(stored: &str) -> Option<Words> {
    let mut words = [Nanos::ZERO; MAX_QUOTAS];
    if stored.is_empty() {
        return Some(words);
    }
    let mut parts = stored.split(',');
    for (slot, part) in words.iter_mut().zip(parts.by_ref()) {
        if part.is_empty() {
            return None;
        }
        *slot = word(part)?;
    }
    parts.next().is_none().then_some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_decimals_joined_by_commas() {
        let mut want = [Nanos::ZERO; MAX_QUOTAS];
        assert_eq!(words(""), Some(want));
        want[0] = Nanos::new(5);
        assert_eq!(words("5"), Some(want));
        want[1] = Nanos::new(1_700_000_000_000_000_001);
        assert_eq!(words("5,1700000000000000001"), Some(want));
        assert!(words("1,2,3,4,5,6,7,8").is_some());
        for bad in [
            "1,2,3,4,5,6,7,8,9",
            ",",
            "1,",
            ",1",
            "1,,2",
            "a",
            "1, 2",
            "-1",
        ] {
            assert_eq!(words(bad), None, "{bad}");
        }
    }
}

//! The exact model the compound tests check every backend against:
//! several token buckets, written as the credit each holds, with the
//! compound rule stated directly (all or nothing, the latest wait binds,
//! the least remaining is reported), and the strategies that draw
//! policies and calls for it.
#![allow(dead_code)]

use keyrate::{CompoundDecision, CompoundDenial, Quota};
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

/// A quota of `capacity` tokens, one every `interval` ns (exact).
pub fn quota(interval: u64, capacity: u64) -> Quota {
    Quota::with_interval(Duration::from_nanos(interval), capacity).unwrap()
}

/// An exact token bucket, written as the credit it holds (in ns of refill,
/// negative for a debt after time ran backwards) at its last update.
#[derive(Debug, Clone, Copy)]
struct Exact {
    interval: u64,
    capacity: u64,
    /// `None` while untouched: full.
    state: Option<(i128, u64)>,
}

impl Exact {
    fn full(&self) -> i128 {
        i128::from(self.interval) * i128::from(self.capacity)
    }

    fn credit_at(&self, now: u64) -> i128 {
        match self.state {
            None => self.full(),
            Some((credit, last)) if now >= last => {
                (credit + i128::from(now - last)).min(self.full())
            }
            Some((credit, last)) => credit - i128::from(last - now),
        }
    }

    fn tokens(&self, credit: i128) -> u64 {
        if credit <= 0 {
            0
        } else {
            (credit / i128::from(self.interval)) as u64
        }
    }
}

/// The model: each key's buckets, one per quota of its (fixed) policy.
pub struct Model {
    buckets: HashMap<usize, Vec<Exact>>,
}

impl Model {
    pub fn new(policies: &[Vec<(u64, u64)>]) -> Self {
        let buckets = policies
            .iter()
            .enumerate()
            .map(|(key, quotas)| {
                let exact = quotas
                    .iter()
                    .map(|&(interval, capacity)| Exact {
                        interval,
                        capacity,
                        state: None,
                    })
                    .collect();
                (key, exact)
            })
            .collect();
        Model { buckets }
    }

    /// One call of `cost` on the keys `scopes`, in that order, at `now`.
    pub fn call(
        &mut self,
        scopes: &[usize],
        now: u64,
        cost: u64,
    ) -> Result<Decided, CompoundDenial> {
        // A cost above a capacity: the first such quota, in call order.
        for (scope, key) in scopes.iter().enumerate() {
            for (quota, b) in self.buckets[key].iter().enumerate() {
                if cost > b.capacity {
                    return Err(CompoundDenial::ExceedsCapacity {
                        cost,
                        capacity: b.capacity,
                        scope,
                        quota,
                    });
                }
            }
        }
        // The latest wait, the first (scope, quota) on a tie.
        let mut latest: Option<(u64, usize, usize)> = None;
        for (scope, key) in scopes.iter().enumerate() {
            for (quota, b) in self.buckets[key].iter().enumerate() {
                let need = i128::from(cost) * i128::from(b.interval);
                let credit = b.credit_at(now);
                // Cost 0 is always admitted, even on a debt.
                if cost > 0 && credit < need {
                    let wait = (need - credit) as u64;
                    if latest.map_or(true, |(w, _, _)| wait > w) {
                        latest = Some((wait, scope, quota));
                    }
                }
            }
        }
        if let Some((wait, scope, quota)) = latest {
            return Err(CompoundDenial::InsufficientTokens {
                retry_after: Duration::from_nanos(wait),
                scope,
                quota,
            });
        }
        // Admitted: spend from every bucket.
        let mut least: Option<(u64, usize, usize, u64, i128)> = None;
        let mut reset = 0i128;
        for (scope, key) in scopes.iter().enumerate() {
            for (quota, b) in self.buckets.get_mut(key).unwrap().iter_mut().enumerate() {
                let credit = b.credit_at(now) - i128::from(cost) * i128::from(b.interval);
                if cost > 0 {
                    b.state = Some((credit, now));
                }
                let left = b.tokens(credit);
                reset = reset.max(b.full() - credit);
                if least.map_or(true, |(l, ..)| left < l) {
                    least = Some((left, scope, quota, b.capacity, b.full() - credit));
                }
            }
        }
        let (remaining, scope, quota, limit, own) = least.unwrap();
        Ok(Decided {
            remaining,
            limit,
            scope,
            quota,
            reset_after: Duration::from_nanos(reset as u64),
            quota_reset_after: Duration::from_nanos(own as u64),
        })
    }

    /// Key `key` is held to `quotas` from now on. The rule of a quota
    /// change: each bucket keeps its instant of being full again (its
    /// missing refill, at its last update), read under the new quota; so
    /// the credit at the last update moves by the change of the full
    /// credit, and may become a debt.
    pub fn change(&mut self, key: usize, quotas: &[(u64, u64)]) {
        let buckets = self.buckets.get_mut(&key).unwrap();
        for (b, &(interval, capacity)) in buckets.iter_mut().zip(quotas) {
            let old_full = b.full();
            b.interval = interval;
            b.capacity = capacity;
            let new_full = b.full();
            b.state = b
                .state
                .map(|(credit, last)| (credit + new_full - old_full, last));
        }
    }

    pub fn remaining(&self, key: usize, now: u64) -> u64 {
        self.buckets[&key]
            .iter()
            .map(|b| b.tokens(b.credit_at(now)))
            .min()
            .unwrap()
    }
}

/// A decision's fields, to compare with the limiter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    pub remaining: u64,
    pub limit: u64,
    pub scope: usize,
    pub quota: usize,
    pub reset_after: Duration,
    pub quota_reset_after: Duration,
}

impl From<CompoundDecision> for Decided {
    fn from(d: CompoundDecision) -> Self {
        Decided {
            remaining: d.remaining(),
            limit: d.limit(),
            scope: d.scope(),
            quota: d.quota(),
            reset_after: d.reset_after(),
            quota_reset_after: d.quota_reset_after(),
        }
    }
}

pub const INTERVALS: &[u64] = &[1, 3, 1_000, 333_333_334, 1_000_000_000, 7_000_000_000];
pub const T0: u64 = 1_700_000_000_000_000_000;

pub fn policy_strategy() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((prop::sample::select(INTERVALS), 1u64..=6), 1..=3)
}

/// One call: distinct keys (in a random order), a step of time (possibly
/// backwards), and a cost.
/// One call: its keys, its step of time, its cost, and, one call in
/// eight, new quotas for its first key from this call on (see
/// [`Model::change`]).
pub type Call = (Vec<usize>, i64, u64, Option<Vec<(u64, u64)>>);

/// One call: distinct keys (in a random order), a step of time (possibly
/// backwards), a cost, and sometimes a quota change.
pub fn call_strategy(keys: usize) -> impl Strategy<Value = Call> {
    (
        Just((0..keys).collect::<Vec<_>>()).prop_shuffle(),
        1..=keys,
        prop_oneof![
            4 => 0i64..3_000_000_000,
            1 => -3_000_000_000i64..0,
            1 => Just(0i64),
        ],
        0u64..=7,
        prop_oneof![7 => Just(None), 1 => policy_strategy().prop_map(Some)],
    )
        .prop_map(|(order, n, step, cost, change)| (order[..n].to_vec(), step, cost, change))
}

/// `drawn` quotas made as many as `current`'s (cycled): a quota change
/// keeps the number of quotas, so that every word keeps its quota's place.
pub fn changed(current: &[(u64, u64)], drawn: &[(u64, u64)]) -> Vec<(u64, u64)> {
    drawn.iter().copied().cycle().take(current.len()).collect()
}

/// The policy of `quotas`.
pub fn policy(quotas: &[(u64, u64)]) -> keyrate::Policy {
    keyrate::Policy::new(quotas.iter().map(|&(i, c)| quota(i, c))).unwrap()
}

/// Runs `calls` on `limiter` (any async compound backend) and on the
/// model, keys named `{tag}key{k}` under `policies`, and fails at the
/// first answer, or the first key's remaining after a call, that differs.
pub async fn run_against_model<L>(
    limiter: &L,
    tag: &str,
    policies: &[Vec<(u64, u64)>],
    calls: &[Call],
) -> Result<(), TestCaseError>
where
    L: keyrate::AsyncCompound<str>,
{
    use keyrate::CompoundRefusal;
    let keys = policies.len();
    let mut policies = policies.to_vec();
    let mut built: Vec<keyrate::Policy> = policies.iter().map(|qs| policy(qs)).collect();
    let names: Vec<String> = (0..keys).map(|k| format!("{tag}key{k}")).collect();
    let mut model = Model::new(&policies);
    let mut now = T0;
    for (scopes, step, cost, change) in calls {
        let scopes: Vec<usize> = scopes.iter().copied().filter(|&k| k < keys).collect();
        if scopes.is_empty() {
            continue;
        }
        if let Some(drawn) = change {
            let k = scopes[0];
            policies[k] = changed(&policies[k], drawn);
            built[k] = policy(&policies[k]);
            model.change(k, &policies[k]);
        }
        now = now.checked_add_signed(*step).unwrap();
        let at = Duration::from_nanos(now);
        let args: Vec<(&str, &keyrate::Policy)> = scopes
            .iter()
            .map(|&k| (names[k].as_str(), &built[k]))
            .collect();
        let got = limiter
            .check_scopes(&args, at, *cost)
            .await
            .map(Decided::from)
            .map_err(|refusal| refusal.denial().copied());
        let want = model.call(&scopes, now, *cost).map_err(Some);
        prop_assert_eq!(got, want, "scopes {:?} at {} cost {}", scopes, now, cost);
        for k in 0..keys {
            let left = limiter
                .remaining_policy(names[k].as_str(), &built[k], at)
                .await
                .map_err(|refusal| refusal.denial().copied());
            prop_assert_eq!(left, Ok(model.remaining(k, now)), "key {}", k);
        }
    }
    Ok(())
}

/// Policies (quotas as `(interval ns, capacity)`), and calls (scopes,
/// time step, cost, quota change).
pub type Case = (Vec<Vec<(u64, u64)>>, Vec<Call>);

/// Policies and calls for the model on Redis, fewer than in memory: each
/// call is a round trip, and each key's remaining another.
pub fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(policy_strategy(), 1..=4),
        prop::collection::vec(call_strategy(4), 1..30),
    )
}

/// The runner of the Redis model tests: 48 cases, nothing persisted.
pub fn runner() -> proptest::test_runner::TestRunner {
    proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 48,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })
}

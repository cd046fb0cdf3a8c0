//! Plans: a quota per call (`under`), the default quota changed live
//! (`set_quota`), and what a bucket holds when its quota changes, checked
//! against an independent model and on real threads.
#![cfg(not(loom))]

mod common;

use common::model::{as_secs, Model};
use common::plans::{Outcome, Plan, PlanModel};
use keyrate::{Denial, ManualClock, Quota, TokenBucketLimiter};
use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// Plans with whole and fractional intervals, small and large bursts.
const PLANS: &[Plan] = &[
    Plan {
        num: 1,
        den: 1,
        capacity: 5,
    }, // free: 1/s, burst 5
    Plan {
        num: 20,
        den: 1,
        capacity: 100,
    }, // pro: 20/s, burst 100
    Plan {
        num: 3,
        den: 1,
        capacity: 3,
    }, // 3/s: 333_333_333.3 ns a token
    Plan {
        num: 1,
        den: 4,
        capacity: 2,
    }, // 0.25/s
    Plan {
        num: 7,
        den: 2,
        capacity: 12,
    }, // 3.5/s
];

fn quota(plan: &Plan) -> Quota {
    Quota::new(plan.rate(), plan.capacity).unwrap()
}

fn outcome(result: Result<u64, Denial>) -> Outcome {
    match result {
        Ok(remaining) => Outcome::Admitted { remaining },
        Err(Denial::InsufficientTokens { retry_after }) => Outcome::Wait {
            retry_ns: retry_after.as_nanos() as u64,
        },
        Err(Denial::ExceedsCapacity { .. }) => Outcome::ExceedsCapacity,
        Err(other) => panic!("unexpected {other:?}"),
    }
}

#[derive(Debug, Clone)]
struct Op {
    key: usize,
    plan: usize,
    /// How the call names its plan: 0 `under` on the limiter, 1 `under` on
    /// a handle, 2 `set_quota` then a default call, 3 a default handle
    /// call after `set_quota`.
    how: u8,
    step: u64,
    cost: u64,
    sweep: bool,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (
            0usize..3,
            0..PLANS.len(),
            0u8..4,
            any::<u64>(),
            0u64..=110,
            prop::bool::weighted(0.05),
        )
            .prop_map(|(key, plan, how, step, cost, sweep)| Op {
                key,
                plan,
                how,
                step,
                cost,
                sweep,
            }),
        1..150,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// Calls under quotas that change at random points decide exactly as
    /// the model's rule: the refill still missing is kept. Sweeps in
    /// between change nothing (a full bucket is full under any quota).
    #[test]
    fn quotas_changing_at_random_points_follow_the_model(ops in ops(), unix in any::<bool>()) {
        let clock = ManualClock::new();
        let limiter = TokenBucketLimiter::with_quota(quota(&PLANS[0])).with_clock(clock.clone());
        let keys = ["sk_free_a", "sk_pro_b", "sk_c"];
        let handles: Vec<_> = keys.iter().map(|k| limiter.bucket(*k)).collect();
        let mut model = PlanModel::new();
        let mut now: u64 = if unix { 1_700_000_000_000_000_000 } else { 0 };
        for op in ops {
            let plan = &PLANS[op.plan];
            let q = quota(plan);
            now += match op.step % 4 {
                0 => 0,
                1 => op.step / 4 % 1_000_000,
                2 => op.step / 4 % (plan.token() as u64),
                _ => op.step / 4 % 30_000_000_000,
            };
            clock.set(Duration::from_nanos(now));
            let key = keys[op.key];
            let got = match op.how {
                0 => limiter.under(&q).check_now(key, op.cost),
                1 => handles[op.key].under(&q).check_now(op.cost),
                2 => {
                    limiter.set_quota(q);
                    limiter.check_now(key, op.cost)
                }
                _ => {
                    limiter.set_quota(q);
                    handles[op.key].check_now(op.cost)
                }
            };
            let want = model.call(key, now, op.cost, plan);
            prop_assert_eq!(outcome(got), want, "{:?} at {}", op, now);
            prop_assert_eq!(
                limiter.under(&q).remaining_now(key),
                Some(model.remaining(key, now, plan))
            );
            if op.sweep {
                limiter.sweep_now();
            }
        }
    }
}

#[test]
fn an_upgrade_and_a_downgrade() {
    let free = Quota::new(1.0, 5).unwrap();
    let pro = Quota::new(20.0, 100).unwrap();
    let limiter = TokenBucketLimiter::with_quota(free);
    // A free key spends its whole burst at 0 s: full again at 5 s.
    assert_eq!((0..9).filter(|_| limiter.allow("k", 0.0)).count(), 5);
    // At 2 s it holds 2 of 5 (3 s missing). Upgraded, the same 3 s missing
    // is 60 of the pro plan's 100 tokens: it holds 40, refilled at 20/s.
    assert_eq!(limiter.remaining("k", 2.0), Some(2));
    assert_eq!(limiter.under(&pro).remaining("k", 2.0), Some(40));
    assert_eq!(limiter.under(&pro).check("k", 2.0, 40), Ok(0));
    assert!(!limiter.under(&pro).allow("k", 2.0));
    assert!(limiter.under(&pro).allow("k", 2.05));
    // Now 5 s missing at 2.05 s (full at 7.05 s). Downgraded to free, that
    // is all 5 tokens missing: nothing until 3.05 s, one token a second.
    assert_eq!(limiter.remaining("k", 2.05), Some(0));
    assert_eq!(
        limiter.check("k", 2.05, 1),
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_secs(1)
        })
    );
    assert_eq!(limiter.remaining("k", 7.05), Some(5));
    // A downgrade that leaves more missing than the new bucket holds is a
    // debt: the enterprise key below misses 10 s, the free plan holds 5 s.
    let enterprise = Quota::new(100.0, 1000).unwrap();
    assert_eq!(limiter.under(&enterprise).check("e", 0.0, 1000), Ok(0));
    assert_eq!(
        limiter.check("e", 0.0, 1).unwrap_err().retry_after(),
        Some(Duration::from_secs(6))
    );
}

#[test]
fn a_bucket_full_under_one_quota_is_evicted_under_any() {
    let limiter = TokenBucketLimiter::new(1.0, 5).with_auto_sweep(false);
    let slow = Quota::new(0.01, 5).unwrap(); // 500 s to fill
    assert!(limiter.under(&slow).allow("k", 0.0));
    // Under the default quota the bucket would be full after 1 s, but its
    // word says 100 s: the sweep keeps it until then.
    assert_eq!(limiter.sweep(50.0), 0);
    assert_eq!(limiter.under(&slow).remaining("k", 50.0), Some(4));
    // 50 s missing is 50 default tokens: a debt, nothing held.
    assert_eq!(limiter.remaining("k", 50.0), Some(0));
    assert_eq!(limiter.sweep(100.0), 1);
    assert_eq!(limiter.remaining("k", 100.0), Some(5));
}

#[test]
fn invalid_quotas_never_reach_a_call() {
    // A quota is validated when it is built, so no call can carry a bad one.
    assert!(Quota::new(f64::NAN, 1).is_err());
    assert!(Quota::new(1.0, 0).is_err());
    assert!(Quota::new(3e8, 1).is_err());
}

/// One thread changes the default quota while others spend from one key:
/// within each phase, over every span, admitted cost stays within the
/// phase's `capacity + rate * span` (checked exactly), and the spenders are
/// admitted close to it, so a change that did not take effect, or a rule
/// that over-admits, would show.
#[test]
fn set_quota_while_threads_spend_keeps_each_phase_within_its_bound() {
    const PHASES: u64 = 24;
    const PHASE_NS: u64 = 20_000_000_000; // 20 s of timestamps a phase
    const STEP_NS: u64 = 1_000_000; // each call 1 ms after the one before
    let plans = [PLANS[0], PLANS[1], PLANS[2], PLANS[4]];
    let limiter = Arc::new(TokenBucketLimiter::with_quota(quota(&plans[0])));
    // Even: stable in phase / 2; odd: a change is under way.
    let phase = Arc::new(AtomicU64::new(0));
    // The next call's timestamp, in ns.
    let ticket = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let spenders: Vec<_> = (0..2)
        .map(|_| {
            let (limiter, phase, ticket, done) =
                (limiter.clone(), phase.clone(), ticket.clone(), done.clone());
            thread::spawn(move || {
                let mut seen = Vec::new(); // (phase, t, admitted)
                while !done.load(SeqCst) {
                    let p1 = phase.load(SeqCst);
                    let (secs, t) = as_secs(ticket.fetch_add(STEP_NS, SeqCst));
                    let admitted = limiter.allow("k", secs);
                    let p2 = phase.load(SeqCst);
                    if p1 == p2 && p1 % 2 == 0 {
                        seen.push((p1 / 2, t, admitted));
                    }
                }
                seen
            })
        })
        .collect();
    for p in 1..=PHASES {
        while ticket.load(SeqCst) < p * PHASE_NS {
            thread::yield_now();
        }
        if p < PHASES {
            phase.store(2 * p - 1, SeqCst);
            limiter.set_quota(quota(&plans[p as usize % plans.len()]));
            phase.store(2 * p, SeqCst);
        }
    }
    done.store(true, SeqCst);
    let mut calls: Vec<(u64, u64, bool)> = spenders
        .into_iter()
        .flat_map(|s| s.join().unwrap())
        .collect();
    calls.sort_by_key(|&(_, t, _)| t);
    let mut near = 0;
    for p in 0..PHASES {
        let plan = plans[p as usize % plans.len()];
        let admitted: Vec<(u64, u64)> = calls
            .iter()
            .filter(|&&(q, _, ok)| q == p && ok)
            .map(|&(_, t, _)| (t, 1))
            .collect();
        let exact = Model::exact(plan.num, plan.den, plan.capacity);
        assert!(exact.within_budget(&admitted), "phase {p}: over budget");
        if let (Some(first), Some(last)) = (admitted.first(), admitted.last()) {
            let refill = plan.rate() * (last.0 - first.0) as f64 / 1e9;
            if admitted.len() as f64 >= 0.9 * refill - 2.0 {
                near += 1;
            }
        }
    }
    // Most phases, not all: a spender preempted between taking its ticket
    // and calling arrives late with an early timestamp, which a busy
    // machine turns into a denial (never an admission too many).
    assert!(
        near >= PHASES / 3,
        "only {near} phases were hammered to their bound"
    );
}

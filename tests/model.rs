//! Model-based property tests: keyrate's decisions equal an exact integer
//! model of the seed's semantics on random traces, time running backwards
//! included.
#![cfg(not(loom))]

mod common;

use common::model::{as_secs, outcome, Model, Outcome, RATES};
use common::EPOCH_UNIX;
use keyrate::{Denial, Quota, TokenBucketLimiter};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Step {
    Same,
    OneNano,
    SubInterval(u64),
    OneInterval,
    LongIdle(u64),
    Random(u64),
    /// Back in time, by up to two refill windows (not before the last
    /// sweep: a sweep at `t` drops only buckets no call at `t` or later
    /// can tell from new ones).
    Back(u64),
}

#[derive(Debug, Clone)]
struct Op {
    key: usize,
    step: Step,
    cost: u64,
    via_handle: bool,
    sweep: bool,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Same),
        1 => Just(Step::OneNano),
        3 => any::<u64>().prop_map(Step::SubInterval),
        2 => Just(Step::OneInterval),
        1 => any::<u64>().prop_map(Step::LongIdle),
        2 => any::<u64>().prop_map(Step::Random),
        2 => any::<u64>().prop_map(Step::Back),
    ]
}

fn ops(capacity: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (
            0usize..3,
            step(),
            0..=capacity + 2,
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.05),
        )
            .prop_map(|(key, step, cost, via_handle, sweep)| Op {
                key,
                step,
                cost,
                via_handle,
                sweep,
            }),
        1..120,
    )
}

fn case() -> impl Strategy<Value = ((u64, u64), u64, bool, Vec<Op>)> {
    (0..RATES.len(), 1u64..=12, any::<bool>()).prop_flat_map(|(r, capacity, unix)| {
        (Just(RATES[r]), Just(capacity), Just(unix), ops(capacity))
    })
}

/// The next instant after `now`; never before `floor`.
fn advance(now: u64, floor: u64, step: &Step, model: &Model) -> u64 {
    let interval = model.spend_ns(1);
    let window = model.spend_ns(model.capacity());
    match *step {
        Step::Same => now,
        Step::OneNano => now + 1,
        Step::SubInterval(x) => now + x % interval.max(1),
        Step::OneInterval => now + interval,
        Step::LongIdle(x) => now + 10 * window + x % window,
        Step::Random(x) => now + x % (2 * window),
        Step::Back(x) => now.saturating_sub(x % (2 * window)).max(floor),
    }
}

fn run_trace(
    (num, den): (u64, u64),
    capacity: u64,
    unix: bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let rate = num as f64 / den as f64;
    let limiter = TokenBucketLimiter::new(rate, capacity);
    let mut model = Model::rounded(num, den, capacity);
    let mut exact = Model::exact(num, den, capacity);
    let keys = ["sk_live_a", "sk_live_b", "sk_live_c"];
    let handles: Vec<_> = keys.iter().map(|k| limiter.bucket(*k)).collect();
    let mut admitted: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
    let mut now = if unix { EPOCH_UNIX } else { 0 };
    let mut swept = now;
    for op in ops {
        now = advance(now, swept, &op.step, &model);
        let (secs, seen) = as_secs(now);
        let key = keys[op.key];
        let got = if op.via_handle {
            handles[op.key].check(secs, op.cost)
        } else {
            limiter.check(key, secs, op.cost)
        };
        if let Err(Denial::ExceedsCapacity { cost, capacity: c }) = got {
            prop_assert_eq!((cost, c), (op.cost, capacity));
        }
        let want = model.call(key, seen, op.cost);
        prop_assert_eq!(outcome(got), want, "op {:?} at {} ns", op, seen);
        if model.interval_is_whole() {
            prop_assert_eq!(exact.call(key, seen, op.cost), want, "exact model");
        }
        if let Outcome::Admitted { .. } = want {
            if op.cost > 0 {
                admitted.entry(op.key).or_default().push((seen, op.cost));
            }
        }
        prop_assert_eq!(limiter.remaining(key, secs), Ok(model.remaining(key, seen)));
        if op.sweep {
            // Sweeping at the current time changes no decision at it or
            // later.
            limiter.sweep(secs);
            swept = now;
        }
    }
    // Calls stamped in the past are judged no more leniently: whatever the
    // order they came in, the admitted calls respect the budget over every
    // span of their timestamps.
    for history in admitted.values_mut() {
        history.sort_by_key(|&(t, _)| t);
        prop_assert!(exact.within_budget(history), "over budget: {history:?}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn decisions_equal_the_exact_model((rate, capacity, unix, ops) in case()) {
        run_trace(rate, capacity, unix, &ops)?;
    }

    #[test]
    fn bucket_count_matches_the_model(
        (rate, capacity, _unix, ops) in case()
    ) {
        // Without handles or sweeps a bucket exists exactly for the keys
        // with an admitted positive-cost call.
        let limiter = TokenBucketLimiter::new(rate.0 as f64 / rate.1 as f64, capacity);
        let mut model = Model::rounded(rate.0, rate.1, capacity);
        let mut now = 0;
        for op in &ops {
            now = advance(now, 0, &op.step, &model);
            let (secs, seen) = as_secs(now);
            let key = format!("k{}", op.key);
            let _ = limiter.allow_n(key.as_str(), secs, op.cost);
            model.call(&key, seen, op.cost);
            prop_assert_eq!(limiter.len(), model.len());
        }
    }
}

#[test]
fn model_catches_an_over_admitting_limiter() {
    // The budget check itself can fail: 4 tokens in the same instant with
    // capacity 3 is over budget.
    let model = Model::exact(1, 1, 3);
    assert!(!model.within_budget(&[(0, 1), (0, 1), (0, 1), (0, 1)]));
    assert!(model.within_budget(&[(0, 1), (0, 1), (0, 1), (1_000_000_000, 1)]));
}

#[test]
fn quota_accepts_every_model_rate() {
    for &(num, den) in RATES {
        assert!(Quota::new(num as f64 / den as f64, 12).is_ok());
    }
}

//! Whole bursts at every rate, the served rate over long runs, and answers
//! that agree with each other (`remaining`, `retry_after`).
//!
//! Timestamps go through a `ManualClock` and calls at `Now`, so every
//! call lands on the exact nanosecond the test means.
#![cfg(not(loom))]

mod common;

use common::model::Model;
use common::{XorShift, EPOCH_UNIX};
use keyrate::{
    BucketHandle, ConfigError, Denial, ManualClock, Now, Quota, TokenBucketLimiter,
    MAX_RATE_SHORTFALL,
};
use proptest::prelude::*;
use std::time::Duration;

/// Rates users configure whose `1e9 / rate` is not a whole number of ns.
const AWKWARD: &[f64] = &[
    0.1,
    0.3,
    1.0 / 3.0,
    3.0,
    7.0,
    1000.0 / 3.0,
    2990.0,
    123_457.0,
    1e6 / 7.0,
    1e9 / 3.0,
    3e8,
    1e-3,
    1e9,
    2.5e8,
];

/// Calls in a row that get a key cached by this thread: a quarter of the
/// lookups vote, at random, and 16 votes promote, so about 64 on average;
/// 300 leave the key uncached with probability 2e-20.
const HOT_CALLS: usize = 300;

/// The three ways a call reaches a bucket.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// Through the map, with the hot-key cache off.
    Keyed,
    /// Through a `BucketHandle`.
    Handle,
    /// Through this thread's hot-key cache (the key is hammered first).
    Hot,
}

struct Subject {
    limiter: TokenBucketLimiter,
    clock: ManualClock,
    handle: Option<BucketHandle>,
}

impl Subject {
    fn new(quota: Quota, path: Path) -> Self {
        let clock = ManualClock::new();
        let limiter = TokenBucketLimiter::with_quota(quota)
            .with_clock(clock.clone())
            .with_hot_key_cache(!matches!(path, Path::Keyed));
        let handle = matches!(path, Path::Handle).then(|| limiter.bucket("k"));
        Subject {
            limiter,
            clock,
            handle,
        }
    }

    fn check(&self, now: u64, cost: u64) -> Result<u64, Denial> {
        self.clock.set(Duration::from_nanos(now));
        match &self.handle {
            Some(handle) => handle.check(Now, cost),
            None => self.limiter.check("k", Now, cost),
        }
        .map(|decision| decision.remaining())
    }

    /// Keys this thread's hot-key cache took in from the limiter.
    fn promotions(&self) -> u64 {
        self.limiter.stats().hot_key_promotions
    }

    fn remaining(&self, now: u64) -> u64 {
        self.clock.set(Duration::from_nanos(now));
        match &self.handle {
            // Cost 0 is free and answers the tokens held.
            Some(handle) => handle
                .check(Now, 0)
                .expect("cost 0 is admitted")
                .remaining(),
            None => self.limiter.remaining("k", Now).expect("valid timestamp"),
        }
    }
}

/// Costs that sum to exactly `capacity`, from a seed: singles, a few big
/// ones, or anything between.
fn cost_mix(capacity: u64, seed: u64) -> Vec<u64> {
    let mut rng = XorShift::new(seed | 1);
    let largest = match seed % 4 {
        0 => 1,
        1 => capacity,
        _ => 1 + seed / 4 % capacity,
    };
    let mut costs = Vec::new();
    let mut left = capacity;
    while left > 0 {
        let cost = 1 + rng.next() % largest.min(left);
        costs.push(cost);
        left -= cost;
    }
    costs
}

/// A burst at `now` on a full bucket of `capacity` tokens: every call of
/// `costs` (summing to the capacity) is admitted with the right tokens
/// left, one token more is denied for exactly one `interval` (in ns), and
/// admitted after it.
fn whole_burst(
    subject: &Subject,
    capacity: u64,
    interval: u64,
    now: u64,
    costs: &[u64],
) -> Result<(), TestCaseError> {
    prop_assert_eq!(subject.remaining(now), capacity);
    let mut left = capacity;
    for &cost in costs {
        left -= cost;
        prop_assert_eq!(subject.check(now, cost), Ok(left), "cost {}", cost);
    }
    prop_assert_eq!(left, 0);
    prop_assert_eq!(
        subject.check(now, 1),
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_nanos(interval)
        })
    );
    prop_assert!(subject.check(now + interval - 1, 1).is_err());
    prop_assert_eq!(subject.check(now + interval, 1), Ok(0));
    Ok(())
}

/// For a rate that `Quota::new` refuses: the whole-ns interval would
/// really serve it more than 0.1% slow.
fn refused_for_a_reason(rate: f64, err: ConfigError) -> Result<(), TestCaseError> {
    match err {
        ConfigError::RateImprecise { interval_nanos, .. } => {
            let (num, den) = Model::fraction(rate).expect("a representable rate");
            let model = Model::rounded(num, den, 1);
            prop_assert_eq!(model.spend_ns(1), interval_nanos);
            prop_assert!(model.served_shortfall() > MAX_RATE_SHORTFALL);
            Ok(())
        }
        other => Err(TestCaseError::fail(format!("{rate}: unexpected {other}"))),
    }
}

fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => prop::sample::select(AWKWARD),
        // Any rate up to 1e6/s is accepted: log-uniform from 1e-3.
        3 => (-3.0f64..6.0).prop_map(|e| 10f64.powf(e)),
        // Faster rates: some are accepted, some refused.
        1 => 1e6f64..1e9,
    ]
}

fn capacity() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=16, 1u64..=10_000]
}

fn path() -> impl Strategy<Value = Path> {
    prop_oneof![Just(Path::Keyed), Just(Path::Handle), Just(Path::Hot)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A full bucket admits calls whose costs sum to exactly its capacity,
    /// at one instant, whatever the rate and the mix; then nothing until
    /// one interval has passed. The same after idling at least
    /// `refill_time`, on a new key and on a used one. The interval is the
    /// model's, `ceil(1e9 / rate)` from the rate's exact fraction. A rate
    /// `Quota::new` refuses must be refused for a reason, and is then
    /// rejected (`prop_assume!`): proptest makes another case in its place.
    #[test]
    fn a_full_bucket_admits_its_whole_burst(
        rate in rate(),
        capacity in capacity(),
        path in path(),
        unix in any::<bool>(),
        seeds in any::<(u64, u64)>(),
        extra_idle in any::<u64>(),
    ) {
        let accepted = Quota::new(rate, capacity);
        if let Err(err) = accepted {
            refused_for_a_reason(rate, err)?;
        }
        prop_assume!(accepted.is_ok(), "a refused rate has no burst");
        let quota = accepted.unwrap();
        let (num, den) = Model::fraction(rate).expect("a representable rate");
        let model = Model::rounded(num, den, capacity);
        prop_assert!(model.served_shortfall() <= MAX_RATE_SHORTFALL);
        let interval = model.spend_ns(1);
        let window = model.spend_ns(capacity);
        let subject = Subject::new(quota, path);
        let mut now = if unix { EPOCH_UNIX } else { 0 };
        if let Path::Hot = path {
            for _ in 0..HOT_CALLS {
                let _ = subject.check(now, 1);
            }
            prop_assert_eq!(subject.promotions(), 1, "the key is cached");
            now += window + interval;
        }
        whole_burst(&subject, capacity, interval, now, &cost_mix(capacity, seeds.0))?;
        // The last call of that burst was one token at now + interval.
        now += interval + window + extra_idle % (window + 1);
        whole_burst(&subject, capacity, interval, now, &cost_mix(capacity, seeds.1))?;
        // The hot key stayed cached: both bursts were decided by the cache.
        let promoted = u64::from(matches!(path, Path::Hot));
        prop_assert_eq!(subject.promotions(), promoted);
    }

    /// `remaining` never promises a call that is then denied, and a
    /// denial's `retry_after` is exact: 1 ns earlier the same call is
    /// denied, at it the call is admitted.
    #[test]
    fn remaining_and_retry_after_agree_with_decisions(
        rate in rate(),
        capacity in 1u64..=20,
        path in path(),
        steps in prop::collection::vec((any::<u64>(), any::<u64>()), 1..60),
    ) {
        let accepted = Quota::new(rate, capacity);
        if let Err(err) = accepted {
            refused_for_a_reason(rate, err)?;
        }
        prop_assume!(accepted.is_ok(), "a refused rate makes no limiter");
        let (num, den) = Model::fraction(rate).expect("a representable rate");
        let interval = Model::rounded(num, den, capacity).spend_ns(1);
        let subject = Subject::new(accepted.unwrap(), path);
        let mut now = EPOCH_UNIX;
        for (step, cost) in steps {
            now += step % (3 * interval);
            let cost = cost % (capacity + 1);
            let promised = subject.remaining(now);
            match subject.check(now, cost) {
                Ok(left) => {
                    prop_assert!(cost <= promised, "{} admitted, {} promised", cost, promised);
                    prop_assert_eq!(left, promised - cost);
                }
                Err(Denial::InsufficientTokens { retry_after }) => {
                    prop_assert!(cost > promised, "{} denied, {} promised", cost, promised);
                    let wait = retry_after.as_nanos() as u64;
                    prop_assert!(wait > 0);
                    prop_assert!(subject.check(now + wait - 1, cost).is_err());
                    prop_assert!(subject.check(now + wait, cost).is_ok());
                    now += wait;
                }
                Err(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
            }
        }
    }
}

#[test]
fn the_reported_rates_admit_their_whole_burst() {
    // The cases of the report, through the seed's own calls.
    for (rate, capacity) in [
        (3.0, 3),
        (7.0, 7),
        (0.3, 3),
        (1000.0 / 3.0, 100),
        (2990.0, 2990),
        (10.0, 1000),
    ] {
        let limiter = TokenBucketLimiter::new(rate, capacity);
        let n = (0..capacity + 5)
            .filter(|_| limiter.allow("k", 0.0))
            .count();
        assert_eq!(n as u64, capacity, "rate {rate} at 0 s");
        let (num, den) = Model::fraction(rate).unwrap();
        let refill_ns = Model::rounded(num, den, capacity).spend_ns(capacity);
        let idle = refill_ns as f64 / 1e9 + 1.0;
        let n = (0..capacity + 5)
            .filter(|_| limiter.allow("k", idle))
            .count();
        assert_eq!(n as u64, capacity, "rate {rate} after idling");
    }
}

/// Long runs, a million calls each, at twice the rate: the admitted rate is
/// the served rate, within 0.1% of the rate, and never above the exact
/// token bucket's budget.
#[test]
fn long_runs_serve_the_rate_within_the_bound() {
    const CALLS: u64 = 1_000_000;
    const CAPACITY: u64 = 10;
    for rate in [1e-3, 0.3, 3.0, 7.0, 1000.0 / 3.0, 1e6 / 7.0, 3e8, 1e9] {
        let (num, den) = Model::fraction(rate).unwrap();
        let quota = match Quota::new(rate, CAPACITY) {
            Ok(quota) => quota,
            Err(err) => {
                assert_eq!(rate, 3e8, "only 3e8 is refused here: {err}");
                refused_for_a_reason(rate, err).unwrap();
                continue;
            }
        };
        let clock = ManualClock::new();
        let handle = TokenBucketLimiter::with_quota(quota)
            .with_clock(clock.clone())
            .bucket("k");
        // Calls every half interval on average (0 to 1 interval apart).
        let exact_interval = 1e9 / rate;
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut now = 0u64;
        let mut admitted = Vec::new();
        for _ in 0..CALLS {
            now +=
                ((rng.next() >> 11) as f64 / (1u64 << 53) as f64 * exact_interval).round() as u64;
            clock.set(Duration::from_nanos(now));
            if handle.allow(Now) {
                admitted.push((now, 1));
            }
        }
        let exact = Model::exact(num, den, CAPACITY);
        assert!(exact.within_budget(&admitted), "rate {rate}: over budget");
        let span = (admitted.last().unwrap().0 - admitted[0].0) as f64 / 1e9;
        let refilled = (admitted.len() as u64 - CAPACITY) as f64;
        let served = refilled / span;
        let shortfall = 1.0 - served / rate;
        // One token of slack for where the run stops within an interval.
        let slack = 1.0 / (rate * span);
        assert!(
            shortfall <= MAX_RATE_SHORTFALL + slack,
            "rate {rate}: served {served}, {:.4}% slow",
            shortfall * 100.0
        );
        assert!(
            shortfall <= Model::rounded(num, den, CAPACITY).served_shortfall() + slack,
            "rate {rate}: slower than the whole-ns interval explains"
        );
    }
}

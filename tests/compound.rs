//! Compound limits (`CompoundLimiter`): several quotas per key and several
//! keys per call, charged all or nothing. Checked against an exact model
//! of several token buckets written here, on bad input, and under real
//! threads.

use keyrate::{CompoundDecision, CompoundDenial, CompoundLimiter, ConfigError, Policy, Quota};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A quota of `capacity` tokens, one every `interval` ns (exact).
fn quota(interval: u64, capacity: u64) -> Quota {
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
struct Model {
    buckets: HashMap<usize, Vec<Exact>>,
}

impl Model {
    fn new(policies: &[Vec<(u64, u64)>]) -> Self {
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
    fn call(&mut self, scopes: &[usize], now: u64, cost: u64) -> Result<Decided, CompoundDenial> {
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
        let mut least: Option<(u64, usize, usize, u64)> = None;
        let mut reset = 0i128;
        for (scope, key) in scopes.iter().enumerate() {
            for (quota, b) in self.buckets.get_mut(key).unwrap().iter_mut().enumerate() {
                let credit = b.credit_at(now) - i128::from(cost) * i128::from(b.interval);
                if cost > 0 {
                    b.state = Some((credit, now));
                }
                let left = b.tokens(credit);
                reset = reset.max(b.full() - credit);
                if least.map_or(true, |(l, _, _, _)| left < l) {
                    least = Some((left, scope, quota, b.capacity));
                }
            }
        }
        let (remaining, scope, quota, limit) = least.unwrap();
        Ok(Decided {
            remaining,
            limit,
            scope,
            quota,
            reset_after: Duration::from_nanos(reset as u64),
        })
    }

    fn remaining(&self, key: usize, now: u64) -> u64 {
        self.buckets[&key]
            .iter()
            .map(|b| b.tokens(b.credit_at(now)))
            .min()
            .unwrap()
    }
}

/// A decision's fields, to compare with the limiter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Decided {
    remaining: u64,
    limit: u64,
    scope: usize,
    quota: usize,
    reset_after: Duration,
}

impl From<CompoundDecision> for Decided {
    fn from(d: CompoundDecision) -> Self {
        Decided {
            remaining: d.remaining(),
            limit: d.limit(),
            scope: d.scope(),
            quota: d.quota(),
            reset_after: d.reset_after(),
        }
    }
}

const INTERVALS: &[u64] = &[1, 3, 1_000, 333_333_334, 1_000_000_000, 7_000_000_000];
const T0: u64 = 1_700_000_000_000_000_000;

fn policy_strategy() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((prop::sample::select(INTERVALS), 1u64..=6), 1..=3)
}

/// One call: distinct keys (in a random order), a step of time (possibly
/// backwards), and a cost.
fn call_strategy(keys: usize) -> impl Strategy<Value = (Vec<usize>, i64, u64)> {
    (
        Just((0..keys).collect::<Vec<_>>()).prop_shuffle(),
        1..=keys,
        prop_oneof![
            4 => 0i64..3_000_000_000,
            1 => -3_000_000_000i64..0,
            1 => Just(0i64),
        ],
        0u64..=7,
    )
        .prop_map(|(order, n, step, cost)| (order[..n].to_vec(), step, cost))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Every answer, and every key's remaining tokens after each call,
    /// equal the model's.
    #[test]
    fn matches_an_exact_model(
        policies in prop::collection::vec(policy_strategy(), 1..=4),
        calls in prop::collection::vec(call_strategy(4), 1..40),
    ) {
        let keys = policies.len();
        let built: Vec<Policy> = policies
            .iter()
            .map(|qs| Policy::new(qs.iter().map(|&(i, c)| quota(i, c))).unwrap())
            .collect();
        let names: Vec<String> = (0..keys).map(|k| format!("key{k}")).collect();
        let limiter = CompoundLimiter::new();
        let mut model = Model::new(&policies);
        let mut now = T0;
        for (scopes, step, cost) in calls {
            let scopes: Vec<usize> = scopes.into_iter().filter(|&k| k < keys).collect();
            if scopes.is_empty() {
                continue;
            }
            now = now.checked_add_signed(step).unwrap();
            let args: Vec<(&str, &Policy)> =
                scopes.iter().map(|&k| (names[k].as_str(), &built[k])).collect();
            let got = limiter
                .check_scopes(&args, Duration::from_nanos(now), cost)
                .map(Decided::from);
            let want = model.call(&scopes, now, cost);
            prop_assert_eq!(got, want, "scopes {:?} at {} cost {}", scopes, now, cost);
            for k in 0..keys {
                prop_assert_eq!(
                    limiter.remaining(names[k].as_str(), &built[k], Duration::from_nanos(now)),
                    Ok(model.remaining(k, now)),
                    "key {}", k
                );
            }
        }
    }
}

#[test]
fn bad_policies_are_typed_errors() {
    let q = quota(1_000, 1);
    assert_eq!(Policy::new([]), Err(ConfigError::EmptyPolicy));
    assert_eq!(
        Policy::new([q; 9]),
        Err(ConfigError::TooManyQuotas { count: 9 })
    );
    assert_eq!(
        Policy::new([q; 8]).unwrap().quotas().len(),
        keyrate::MAX_QUOTAS
    );
    assert!(ConfigError::EmptyPolicy.to_string().contains("no quota"));
    assert!(ConfigError::TooManyQuotas { count: 9 }
        .to_string()
        .contains("at most 8"));
}

#[test]
fn bad_calls_spend_nothing() {
    let sec = 1_000_000_000;
    let policy = Policy::new([quota(sec, 10), quota(sec, 3)]).unwrap();
    let limiter = CompoundLimiter::new();
    let _ = limiter.check("a", &policy, 10.0, 1).unwrap();
    let before = limiter.remaining("a", &policy, 10.0).unwrap();
    assert_eq!(before, 2);

    // Duplicate keys, however far apart.
    assert_eq!(
        limiter.check_scopes(&[("a", &policy), ("b", &policy), ("a", &policy)], 10.0, 1),
        Err(CompoundDenial::DuplicateKey {
            first: 0,
            second: 2
        })
    );
    // No scope.
    assert_eq!(
        limiter.check_scopes::<str>(&[], 10.0, 1),
        Err(CompoundDenial::NoScopes)
    );
    // A cost above one quota's capacity names it, even past the others.
    assert_eq!(
        limiter.check_scopes(&[("b", &policy), ("a", &policy)], 10.0, 4),
        Err(CompoundDenial::ExceedsCapacity {
            cost: 4,
            capacity: 3,
            scope: 0,
            quota: 1
        })
    );
    assert!(matches!(
        limiter.check("a", &policy, 10.0, u64::MAX),
        Err(CompoundDenial::ExceedsCapacity { quota: 0, .. })
    ));
    // Bad instants.
    for at in [f64::NAN, f64::INFINITY, -1.0, 1e30] {
        assert_eq!(
            limiter.check("a", &policy, at, 1),
            Err(CompoundDenial::InvalidTimestamp)
        );
    }
    assert_eq!(
        limiter.remaining("a", &policy, f64::NAN),
        Err(CompoundDenial::InvalidTimestamp)
    );
    // None of these wrote "a" or made "b".
    assert_eq!(limiter.remaining("a", &policy, 10.0), Ok(before));
    assert_eq!(limiter.len(), 1);
    // Backwards time sees the bucket as it was then, spends charged.
    assert_eq!(limiter.remaining("a", &policy, 9.0), Ok(1));
    assert!(limiter.check("a", &policy, 9.0, 1).is_ok());
    assert_eq!(limiter.remaining("a", &policy, 10.0), Ok(1));
    // Cost 0 is admitted and spends nothing.
    assert!(limiter.check("a", &policy, 10.0, 0).is_ok());
    assert_eq!(limiter.remaining("a", &policy, 10.0), Ok(1));
}

#[test]
fn sweep_and_cap() {
    let sec = 1_000_000_000;
    let policy = Policy::new([quota(sec, 2), quota(2 * sec, 2)]).unwrap();
    let limiter = CompoundLimiter::new().with_max_keys(2);
    let _ = limiter.check("a", &policy, 0.0, 1).unwrap();
    let _ = limiter.check("b", &policy, 0.0, 2).unwrap();
    assert_eq!(
        limiter.check("c", &policy, 0.0, 1),
        Err(CompoundDenial::LimiterFull { max_keys: 2 })
    );
    // At 2 s "a" is full in both quotas; "b" still lacks 2 s of its second.
    assert_eq!(limiter.sweep(1.9), 0);
    assert!(limiter.check("c", &policy, 2.0, 1).is_ok());
    assert_eq!(limiter.len(), 2);
    // "b" and "c" are both full again at 4 s (their second quota).
    assert_eq!(limiter.sweep(3.9), 0);
    assert_eq!(limiter.sweep(4.0), 2);
    assert!(limiter.is_empty());
}

#[test]
fn public_types_are_send_sync_debug() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<CompoundLimiter>();
    check::<Policy>();
    check::<CompoundDecision>();
    check::<CompoundDenial>();
    // Keys do not print.
    let limiter = CompoundLimiter::new();
    let _ = limiter.check("sk_live_secret", &Policy::from(quota(1, 1)), 0.0, 1);
    assert!(!format!("{limiter:?}").contains("secret"));
}

/// Many threads charge overlapping scopes (their key, their org, one
/// global key). No bucket admits more than `capacity + span / interval`,
/// and at one instant every bucket's admitted count is exactly what its
/// words say it spent.
#[test]
fn threads_charging_overlapping_scopes() {
    const THREADS: usize = 4;
    const CALLS: u64 = 4_000;
    let ms = 1_000_000;
    let key_policy = Policy::new([quota(ms, 40), quota(10 * ms, 60)]).unwrap();
    let org_policy = Policy::from(quota(2 * ms, 70));
    let global_policy = Policy::new([quota(ms / 2, 90), quota(ms, 100)]).unwrap();

    for spread in [0u64, 200 * ms] {
        let limiter = CompoundLimiter::new();
        let admitted: Vec<AtomicU64> = (0..THREADS + 3).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (limiter, admitted) = (&limiter, &admitted);
                let (key_policy, org_policy, global_policy) =
                    (&key_policy, &org_policy, &global_policy);
                s.spawn(move || {
                    let key = format!("key{t}");
                    let org = format!("org{}", t % 2);
                    let mut x = t as u64 + 1;
                    for i in 0..CALLS {
                        // Time moves forward over the spread, with jitter
                        // backwards; at spread 0 every call is at T0.
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let jitter = if spread == 0 { 0 } else { x % (5 * ms) };
                        let now = T0 + (spread * i / CALLS).saturating_sub(jitter);
                        let scopes = [
                            (key.as_str(), key_policy),
                            (org.as_str(), org_policy),
                            ("global", global_policy),
                        ];
                        // Rotate the order: calls lock in one global order
                        // whatever the order of their scopes.
                        let mut order = scopes;
                        order.rotate_left((i % 3) as usize);
                        let cost = 1 + x % 2;
                        if limiter
                            .check_scopes(&order, Duration::from_nanos(now), cost)
                            .is_ok()
                        {
                            for idx in [t, THREADS + t % 2, THREADS + 2] {
                                admitted[idx].fetch_add(cost, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        let admitted: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        // Each bucket: at most capacity + span / interval.
        let bound = |policy: &Policy| {
            policy
                .quotas()
                .iter()
                .map(|q| q.capacity() + (spread as u128 / q.interval().as_nanos()) as u64)
                .min()
                .unwrap()
        };
        for (t, &n) in admitted[..THREADS].iter().enumerate() {
            assert!(n <= bound(&key_policy), "key{t}: {n}");
        }
        for o in 0..2 {
            assert!(admitted[THREADS + o] <= bound(&org_policy));
        }
        let global = admitted[THREADS + 2];
        assert!(global <= bound(&global_policy), "global: {global}");
        assert!(global > 0);
        if spread == 0 {
            // One instant: every admitted token is still missing.
            let at = Duration::from_nanos(T0);
            for (t, &n) in admitted[..THREADS].iter().enumerate() {
                let left = limiter.remaining(format!("key{t}").as_str(), &key_policy, at);
                assert_eq!(left, Ok(40 - n));
            }
            for o in 0..2 {
                let left = limiter.remaining(format!("org{o}").as_str(), &org_policy, at);
                assert_eq!(left, Ok(70 - admitted[THREADS + o]));
            }
            assert_eq!(
                limiter.remaining("global", &global_policy, at),
                Ok(90 - global)
            );
            assert_eq!(
                global,
                admitted[THREADS] + admitted[THREADS + 1],
                "every global admission is an org's"
            );
        }
    }
}

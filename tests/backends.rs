//! One semantic suite, run on every backend through the library's own
//! interface: each case is written once, and compiled as a function generic
//! over `keyrate::Limiter<str>` (run on the in-memory `TokenBucketLimiter`
//! and on `BlockingRedisLimiter`) and as an async one generic over
//! `keyrate::AsyncLimiter<str>` (run on the in-memory limiter again, and on
//! `RedisLimiter` with its local deny mirror and without, and on a Redis
//! Cluster with feature `redis-cluster`).
//!
//! The Redis cases need `KEYRATE_REDIS_URL`, the cluster cases
//! `KEYRATE_REDIS_CLUSTER_URLS` (see `redis_support`).
#![cfg(not(loom))]

mod common;
mod redis_support;

use common::model::{as_secs, outcome, Model, Outcome, RATES};
use common::plans::{PlanModel, PLANS};
use common::{XorShift, EPOCH_UNIX};
use keyrate::{
    BlockingRedisLimiter, Decision, Denial, Quota, RedisLimiter, Refusal, TokenBucketLimiter,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::HashMap;
use std::future::{ready, Future};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A fresh limiter (no buckets yet), and how to count the buckets it has
/// made: the one thing the suite asks of a backend that the library's
/// traits do not answer. `N` is `usize`, or for the async backends a future
/// of one. Every other call is the limiter's own, through `Deref`.
struct Fixture<L, N> {
    limiter: L,
    count: Box<dyn Fn(&L) -> N + Send + Sync>,
}

impl<L, N> Fixture<L, N> {
    fn new(limiter: L, count: impl Fn(&L) -> N + Send + Sync + 'static) -> Self {
        Fixture {
            limiter,
            count: Box::new(count),
        }
    }

    /// How many buckets exist.
    fn buckets(&self) -> N {
        (self.count)(&self.limiter)
    }
}

impl<L, N> Deref for Fixture<L, N> {
    type Target = L;

    fn deref(&self) -> &L {
        &self.limiter
    }
}

type AsyncFixture<L> = Fixture<L, BoxFuture<usize>>;

/// A call's answer as the suite compares it: the value, or the denial. A
/// backend that could not decide (Redis failing, closed) fails the test.
fn decided<T, E: Refusal>(answer: Result<T, E>) -> Result<T, Denial> {
    answer.map_err(|err| {
        *err.denial()
            .unwrap_or_else(|| panic!("the backend failed: {err}"))
    })
}

/// A check's answer: the tokens left, or the denial.
fn checked<E: Refusal>(answer: Result<Decision, E>) -> Result<u64, Denial> {
    decided(answer).map(|decision| decision.remaining())
}

// The backends. Each factory makes a fresh limiter under `quota`; a Redis
// factory fails the test when its server is not configured or does not
// answer (see `redis_support`): no case is skipped.
//
// The one setting where the Redis backends legitimately differ: an hour's
// floor under every key's TTL (`with_min_ttl`; `redis_support::limiter`
// sets the same). Redis expires a key on its own clock, while the suite's
// made-up timestamps do not advance in real time: without the floor a key
// could expire mid-case and its bucket refill early. In memory there is no
// TTL.

/// The in-memory limiter, as a sync backend.
fn memory(quota: Quota) -> Fixture<TokenBucketLimiter, usize> {
    Fixture::new(
        TokenBucketLimiter::with_quota(quota),
        |l: &TokenBucketLimiter| l.len(),
    )
}

/// The blocking Redis limiter over its own connection; buckets are counted
/// with `KEYS` over another.
fn blocking_redis(quota: Quota) -> Fixture<BlockingRedisLimiter, usize> {
    let url = redis_support::url();
    let no_redis = |err: &dyn std::fmt::Display| -> ! {
        panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}")
    };
    let limiter = BlockingRedisLimiter::connect_blocking(&url, quota)
        .unwrap_or_else(|err| no_redis(&err))
        .with_namespace(
            redis_support::unique_prefix("blocking"),
            keyrate::KeyNames::Encoded,
        )
        .with_min_ttl(Duration::from_secs(3600))
        .with_timeout(redis_support::TEST_TIMEOUT);
    let raw = redis::Client::open(url.as_str())
        .and_then(|client| client.get_connection())
        .unwrap_or_else(|err| no_redis(&err));
    let raw = Mutex::new(raw);
    Fixture::new(limiter, move |l: &BlockingRedisLimiter| {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", l.bucket_key("")))
            .query(&mut *raw.lock().unwrap())
            .expect("KEYS");
        keys.len()
    })
}

/// The in-memory limiter, as an async backend.
fn memory_async(quota: Quota) -> BoxFuture<AsyncFixture<TokenBucketLimiter>> {
    Box::pin(async move {
        Fixture::new(
            TokenBucketLimiter::with_quota(quota),
            |l: &TokenBucketLimiter| -> BoxFuture<usize> { Box::pin(ready(l.len())) },
        )
    })
}

/// The async Redis limiter, with its local deny mirror.
fn redis(quota: Quota) -> BoxFuture<AsyncFixture<RedisLimiter>> {
    Box::pin(async move {
        let limiter = redis_support::limiter("backends", quota).await;
        let raw = redis_support::raw(&redis_support::url()).await;
        Fixture::new(limiter, move |l: &RedisLimiter| -> BoxFuture<usize> {
            let (mut raw, prefix) = (raw.clone(), l.bucket_key(""));
            Box::pin(async move { redis_support::keys(&mut raw, &prefix).await.len() })
        })
    })
}

/// The async Redis limiter with its local deny mirror turned off: every
/// call asks Redis.
fn redis_without_mirror(quota: Quota) -> BoxFuture<AsyncFixture<RedisLimiter>> {
    Box::pin(async move {
        let Fixture { limiter, count } = redis(quota).await;
        Fixture {
            limiter: limiter.with_mirror_capacity(0),
            count,
        }
    })
}

/// The async Redis limiter over a Redis Cluster connection
/// (`KEYRATE_REDIS_CLUSTER_URLS`).
#[cfg(feature = "redis-cluster")]
fn cluster(
    quota: Quota,
) -> BoxFuture<AsyncFixture<RedisLimiter<redis::cluster_async::ClusterConnection>>> {
    Box::pin(async move {
        let urls = redis_support::cluster_urls();
        let raw = redis_support::cluster(&urls).await;
        let limiter = RedisLimiter::with_connection(raw.clone(), quota)
            .with_namespace(
                redis_support::unique_prefix("cluster"),
                keyrate::KeyNames::Encoded,
            )
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(redis_support::TEST_TIMEOUT);
        Fixture::new(limiter, move |l: &RedisLimiter<_>| -> BoxFuture<usize> {
            let (mut raw, prefix) = (raw.clone(), l.bucket_key(""));
            Box::pin(async move { redis_support::keys_on(&mut raw, &prefix).await.len() })
        })
    })
}

fn quota(rate: f64, capacity: u64) -> Quota {
    Quota::new(rate, capacity).unwrap()
}

const NANOS: f64 = 1e-9;

/// Writes each case once and compiles it twice: in `blocking`, as a
/// function generic over `L: Limiter<str>`; in `awaiting`, as an async one
/// generic over `L: AsyncLimiter<str>`. Each case is given `make`, the
/// backend's factory (`Make<L>`, the module's own). In a body, `call!`
/// marks what the async flavour awaits (the limiter's calls, `make`,
/// `buckets`); the sync flavour takes it as is. Each module's own items
/// (`Make`, `call!`, and the proptest driver) come first.
macro_rules! cases {
    (
        blocking { $($blocking:tt)* }
        awaiting { $($awaiting:tt)* }
        $(
            $(#[$meta:meta])*
            fn $name:ident($make:ident $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)? $body:block
        )*
    ) => {
        /// The cases over the sync interface.
        mod blocking {
            use super::*;
            use keyrate::Limiter;

            $($blocking)*

            $(
                $(#[$meta])*
                pub fn $name<L: Limiter<str>>($make: Make<L> $(, $arg: $ty)*) $(-> $ret)? $body
            )*
        }

        /// The same cases over the async interface.
        mod awaiting {
            use super::*;
            use keyrate::AsyncLimiter;

            $($awaiting)*

            $(
                $(#[$meta])*
                pub async fn $name<L: AsyncLimiter<str>>(
                    $make: Make<L> $(, $arg: $ty)*
                ) $(-> $ret)? $body
            )*
        }
    };
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    })
}

cases! {
    blocking {
        /// A sync backend's factory.
        pub type Make<L> = fn(Quota) -> Fixture<L, usize>;

        macro_rules! call {
            ($call:expr) => {
                $call
            };
        }

        /// proptest drives its cases synchronously: each trace runs as is.
        pub fn equals_the_exact_model<L: Limiter<str>>(make: Make<L>) {
            if let Err(err) = runner().run(&case(), |case| run_trace(make, case)) {
                panic!("{err}");
            }
        }
    }

    awaiting {
        /// An async backend's factory.
        pub type Make<L> = fn(Quota) -> BoxFuture<AsyncFixture<L>>;

        macro_rules! call {
            ($call:expr) => {
                $call.await
            };
        }

        /// proptest drives its cases synchronously: each trace runs on this
        /// runtime, from a blocking thread.
        pub async fn equals_the_exact_model<L: AsyncLimiter<str> + 'static>(make: Make<L>) {
            let handle = tokio::runtime::Handle::current();
            let result = tokio::task::spawn_blocking(move || {
                runner().run(&case(), |case| handle.block_on(run_trace(make, case)))
            })
            .await
            .expect("the property test panicked");
            if let Err(err) = result {
                panic!("{err}");
            }
        }
    }

    fn seed_example(make) {
        let b = call!(make(quota(1.0, 3)));
        assert!(call!(b.allow_n("key1", 0.0, 1)));
        assert!(call!(b.allow_n("key1", 0.0, 1)));
        assert!(call!(b.allow_n("key1", 0.0, 1)));
        assert!(!call!(b.allow_n("key1", 0.0, 1)));
        assert!(call!(b.allow_n("key1", 2.0, 1)));
        assert!(!call!(b.allow_n("key1", 2.0, 2)));
        assert_eq!(decided(call!(b.remaining("key1", 2.0))), Ok(1));
        assert_eq!(call!(b.buckets()), 1);
    }

    fn cost_zero(make) {
        let b = call!(make(quota(1.0, 3)));
        // On a key never seen: admitted, full, and no bucket made.
        assert_eq!(checked(call!(b.check("k", 5.0, 0))), Ok(3));
        assert_eq!(call!(b.buckets()), 0);
        // On an empty bucket: still admitted, and nothing changes.
        assert_eq!(checked(call!(b.check("k", 5.0, 3))), Ok(0));
        assert_eq!(checked(call!(b.check("k", 5.0, 0))), Ok(0));
        assert_eq!(checked(call!(b.check("k", 6.0, 0))), Ok(1));
        assert_eq!(decided(call!(b.remaining("k", 6.0))), Ok(1));
        assert_eq!(checked(call!(b.check("k", 6.0, 1))), Ok(0));
    }

    fn cost_above_capacity(make) {
        let b = call!(make(quota(1.0, 3)));
        for cost in [4, 1 << 40, u64::MAX] {
            assert_eq!(
                checked(call!(b.check("k", 0.0, cost))),
                Err(Denial::ExceedsCapacity { cost, capacity: 3 })
            );
        }
        assert_eq!(call!(b.buckets()), 0, "a denial makes no bucket");
        // Exactly the capacity is admitted on a full bucket.
        assert_eq!(checked(call!(b.check("k", 0.0, 3))), Ok(0));
        assert_eq!(
            checked(call!(b.check("k", 1000.0, u64::MAX))),
            Err(Denial::ExceedsCapacity {
                cost: u64::MAX,
                capacity: 3
            })
        );
        assert_eq!(decided(call!(b.remaining("k", 0.0))), Ok(0));
    }

    fn bad_timestamps(make) {
        let b = call!(make(quota(1.0, 3)));
        let bad = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
            -1e-9,
            1e300,
            9_223_372_037.0,
        ];
        for ts in bad {
            assert_eq!(checked(call!(b.check("k", ts, 1))), Err(Denial::InvalidTimestamp));
            assert_eq!(checked(call!(b.check("k", ts, 0))), Err(Denial::InvalidTimestamp));
            assert_eq!(checked(call!(b.check("k", ts, 9))), Err(Denial::InvalidTimestamp));
            assert!(!call!(b.allow_n("k", ts, 1)));
            assert_eq!(decided(call!(b.remaining("k", ts))), Err(Denial::InvalidTimestamp));
        }
        assert_eq!(call!(b.buckets()), 0, "bad timestamps create nothing");
        // ...and change nothing on an existing bucket.
        assert_eq!(checked(call!(b.check("k", 1.0, 2))), Ok(1));
        for ts in bad {
            let _ = call!(b.check("k", ts, 1));
        }
        assert_eq!(decided(call!(b.remaining("k", 1.0))), Ok(1));
        assert_eq!(checked(call!(b.check("k", 1.0, 1))), Ok(0));
    }

    fn backwards_time(make) {
        let b = call!(make(quota(1.0, 3)));
        assert_eq!(checked(call!(b.check("k", 10.0, 1))), Ok(2));
        // Half a second earlier the same bucket holds fewer tokens, never more.
        assert_eq!(decided(call!(b.remaining("k", 9.5))), Ok(1));
        assert_eq!(checked(call!(b.check("k", 9.5, 1))), Ok(0));
        assert_eq!(decided(call!(b.remaining("k", 10.0))), Ok(1));
        // Far in the past: nothing, and a denial with the exact wait.
        assert_eq!(decided(call!(b.remaining("k", 0.0))), Ok(0));
        assert_eq!(
            checked(call!(b.check("k", 0.0, 1))),
            Err(Denial::InsufficientTokens {
                retry_after: Duration::from_secs(10)
            })
        );
        // Time running forward again finds the bucket as the spends left it.
        assert_eq!(decided(call!(b.remaining("k", 12.0))), Ok(3));
    }

    fn retry_after_is_exact(make) {
        let b = call!(make(quota(2.0, 1)));
        assert_eq!(checked(call!(b.check("k", 0.0, 1))), Ok(0));
        let denial = checked(call!(b.check("k", 0.0, 1))).unwrap_err();
        let wait = denial.retry_after().unwrap();
        assert_eq!(wait, Duration::from_millis(500));
        // One nanosecond before the wait is over: denied by exactly 1 ns.
        let almost = wait.as_secs_f64() - NANOS;
        assert_eq!(
            checked(call!(b.check("k", almost, 1))).unwrap_err().retry_after(),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(checked(call!(b.check("k", wait.as_secs_f64(), 1))), Ok(0));

        // A fractional interval: 3 tokens/s is 333_333_333.3 ns per token,
        // charged as 333_333_334 whole ns, so a burst of 3 is whole.
        let b = call!(make(quota(3.0, 3)));
        assert_eq!(checked(call!(b.check("k", 0.0, 1))), Ok(2));
        assert_eq!(checked(call!(b.check("k", 0.0, 2))), Ok(0));
        assert_eq!(
            checked(call!(b.check("k", 0.0, 1))).unwrap_err().retry_after(),
            Some(Duration::from_nanos(333_333_334))
        );
        assert_eq!(checked(call!(b.check("k", 333_333_334.0 * NANOS, 1))), Ok(0));
    }

    fn refill_is_capped(make) {
        let b = call!(make(quota(1.0, 3)));
        assert_eq!(checked(call!(b.check("k", 0.0, 3))), Ok(0));
        assert_eq!(decided(call!(b.remaining("k", 1000.0))), Ok(3));
        assert_eq!(checked(call!(b.check("k", 1000.0, 3))), Ok(0));
        assert!(!call!(b.allow_n("k", 1000.0, 1)));
    }

    fn keys_are_independent(make) {
        let b = call!(make(quota(1.0, 1)));
        assert!(call!(b.allow_n("sk_live_a", 0.0, 1)));
        assert!(call!(b.allow_n("sk_live_b", 0.0, 1)));
        assert!(!call!(b.allow_n("sk_live_a", 0.0, 1)));
        assert_eq!(call!(b.buckets()), 2);
    }

    /// A full bucket admits calls whose costs sum to exactly its capacity, at
    /// one instant, at awkward rates and with mixed costs; one token more is
    /// denied for exactly one interval (the model's). The same after idling
    /// the time a full refill takes.
    fn whole_bursts(make) {
        let mut rng = XorShift::new(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.next();
        for (i, rate) in [
            0.1,
            0.3,
            1.0 / 3.0,
            3.0,
            7.0,
            1000.0 / 3.0,
            123_457.0,
            1e6 / 7.0,
        ]
        .into_iter()
        .enumerate()
        {
            for capacity in [1, 3, 7, 100, 2990] {
                let b = call!(make(quota(rate, capacity)));
                let key = format!("burst{i}");
                // The interval of the independent model, from the rate's
                // exact fraction.
                let (num, den) = Model::fraction(rate).expect("a representable rate");
                let model = Model::rounded(num, den, capacity);
                let interval = model.spend_ns(1);
                let window = model.spend_ns(capacity);
                let mut now = if i % 2 == 0 { EPOCH_UNIX } else { 0 };
                for _round in 0..2 {
                    let (secs, seen) = as_secs(now);
                    let mut left = capacity;
                    while left > 0 {
                        let cost = 1 + next() % left.min(1 + capacity / 4);
                        left -= cost;
                        assert_eq!(
                            checked(call!(b.check(&key, secs, cost))),
                            Ok(left),
                            "rate {rate}"
                        );
                    }
                    assert_eq!(
                        checked(call!(b.check(&key, secs, 1))),
                        Err(Denial::InsufficientTokens {
                            retry_after: Duration::from_nanos(interval)
                        }),
                        "rate {rate} capacity {capacity}"
                    );
                    // Idle at least refill_time (an f64 of Unix seconds rounds
                    // to ~240 ns, so a microsecond more).
                    let later = as_secs(seen + window + 1_000).1;
                    assert!(later >= seen + window);
                    now = later;
                }
            }
        }
    }

    /// Calls under quotas that change at random points decide as the
    /// independent model's rule says: the refill still missing is kept.
    fn quotas_changing_follow_the_model(make) {
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next();
        for round in 0..8 {
            let b = call!(make(quota(1.0, 5)));
            let mut model = PlanModel::new();
            let keys = ["sk_free_a", "sk_pro_b"];
            let mut now: u64 = if round % 2 == 0 { EPOCH_UNIX } else { 0 };
            for _ in 0..60 {
                let plan = &PLANS[(next() % PLANS.len() as u64) as usize];
                let q = quota(plan.rate(), plan.capacity);
                let step = next();
                now += match step % 4 {
                    0 => 0,
                    1 => step / 4 % 1_000_000,
                    2 => step / 4 % plan.token() as u64,
                    _ => step / 4 % 30_000_000_000,
                };
                let (secs, seen) = as_secs(now);
                let key = keys[(next() % 2) as usize];
                let cost = next() % 110;
                let got = outcome(call!(keyrate::Under::new(&*b, q).check(key, secs, cost)));
                assert_eq!(
                    got,
                    model.call(key, seen, cost, plan),
                    "cost {cost} at {seen} ns"
                );
            }
        }
    }

    /// One proptest case: the calls decide as the rounded model says, and
    /// the admitted ones stay within the exact budget.
    fn run_trace(make, case: Case) -> Result<(), TestCaseError> {
        let ((num, den), capacity, unix, ops) = case;
        let b = call!(make(quota(num as f64 / den as f64, capacity)));
        let mut model = Model::rounded(num, den, capacity);
        let interval = model.spend_ns(1);
        let window = model.spend_ns(capacity);
        let keys = ["sk_live_a", "sk_live_b"];
        let mut now = if unix { EPOCH_UNIX } else { 0 };
        let mut admitted: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for (key, step, cost) in ops {
            now += match step % 5 {
                0 => 0,
                1 => 1,
                2 => (step / 5) % interval,
                3 => interval,
                _ => (step / 5) % (2 * window),
            };
            let (secs, seen) = as_secs(now);
            let got = outcome(call!(b.check(keys[key], secs, cost)));
            let want = model.call(keys[key], seen, cost);
            prop_assert_eq!(got, want, "cost {} at {} ns", cost, seen);
            prop_assert_eq!(
                decided(call!(b.remaining(keys[key], secs))),
                Ok(model.remaining(keys[key], seen))
            );
            if matches!(want, Outcome::Admitted { .. }) && cost > 0 {
                admitted.entry(key).or_default().push((seen, cost));
            }
        }
        prop_assert_eq!(call!(b.buckets()), model.len());
        let exact = Model::exact(num, den, capacity);
        for history in admitted.values() {
            prop_assert!(exact.within_budget(history), "over budget: {:?}", history);
        }
        Ok(())
    }
}

type Case = ((u64, u64), u64, bool, Vec<(usize, u64, u64)>);

/// A rate, a capacity, a Unix-scale start or not, and `(key, step, cost)`
/// calls where `step` picks how far time moves.
fn case() -> impl Strategy<Value = Case> {
    (0..RATES.len(), 1u64..=8, any::<bool>()).prop_flat_map(|(r, capacity, unix)| {
        let ops = prop::collection::vec((0usize..2, any::<u64>(), 0..=capacity + 1), 1..40);
        (Just(RATES[r]), Just(capacity), Just(unix), ops)
    })
}

/// Every case on every backend: the sync flavour on plain test threads, the
/// async one on a runtime (multi-threaded for Redis, as a server would run
/// it).
macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        /// The in-memory limiter through `Limiter<str>`.
        mod in_memory {
            $(
                #[test]
                fn $case() {
                    super::blocking::$case(super::memory);
                }
            )*
        }
        /// The in-memory limiter through `AsyncLimiter<str>`.
        mod in_memory_async {
            $(
                #[tokio::test]
                async fn $case() {
                    super::awaiting::$case(super::memory_async).await;
                }
            )*
        }
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::awaiting::$case(super::redis).await;
                }
            )*
        }
        mod on_redis_without_mirror {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::awaiting::$case(super::redis_without_mirror).await;
                }
            )*
        }
        #[cfg(feature = "redis-cluster")]
        mod on_redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::awaiting::$case(super::cluster).await;
                }
            )*
        }
        /// `BlockingRedisLimiter` through `Limiter<str>`.
        mod on_redis_blocking {
            $(
                #[test]
                fn $case() {
                    super::blocking::$case(super::blocking_redis);
                }
            )*
        }
    };
}

suite!(
    seed_example,
    cost_zero,
    cost_above_capacity,
    bad_timestamps,
    backwards_time,
    retry_after_is_exact,
    whole_bursts,
    quotas_changing_follow_the_model,
    refill_is_capped,
    keys_are_independent,
    equals_the_exact_model,
);

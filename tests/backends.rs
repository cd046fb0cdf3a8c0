//! One semantic suite, run on every backend: the in-memory
//! `TokenBucketLimiter`, the Redis-backed `RedisLimiter` (with its local
//! deny mirror and without, and on a Redis Cluster with feature
//! `redis-cluster`), and its blocking twin `BlockingRedisLimiter`.
//!
//! Every case is written once against the small `Backend` trait below and
//! instantiated for each backend by `suite!`. The Redis cases need
//! `KEYRATE_REDIS_URL`, the cluster cases `KEYRATE_REDIS_CLUSTER_URLS`
//! (see `redis_support`).
#![cfg(not(loom))]

mod common;
mod redis_support;

use common::model::{as_secs, Model, Outcome};
use common::plans::{Outcome as PlanOutcome, Plan, PlanModel};
use keyrate::{BlockingRedisLimiter, Denial, Quota, RedisLimiter, TokenBucketLimiter};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::HashMap;
use std::time::Duration;

/// The decision API both backends share, as the suite uses it.
trait Backend: Sized {
    /// A fresh backend with no buckets, or `None` to skip.
    async fn new(quota: Quota) -> Option<Self>;
    async fn check(&self, key: &str, timestamp: f64, cost: u64) -> Result<u64, Denial>;
    /// `check` under `quota` instead of the default one.
    async fn check_under(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
        quota: &Quota,
    ) -> Result<u64, Denial>;
    async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool;
    async fn remaining(&self, key: &str, timestamp: f64) -> Option<u64>;
    /// How many buckets exist.
    async fn buckets(&self) -> usize;
}

struct Memory(TokenBucketLimiter);

impl Backend for Memory {
    async fn new(quota: Quota) -> Option<Self> {
        Some(Memory(TokenBucketLimiter::with_quota(quota)))
    }
    async fn check(&self, key: &str, timestamp: f64, cost: u64) -> Result<u64, Denial> {
        self.0.check(key, timestamp, cost)
    }
    async fn check_under(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
        quota: &Quota,
    ) -> Result<u64, Denial> {
        self.0.under(quota).check(key, timestamp, cost)
    }
    async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        self.0.allow_n(key, timestamp, cost)
    }
    async fn remaining(&self, key: &str, timestamp: f64) -> Option<u64> {
        self.0.remaining(key, timestamp)
    }
    async fn buckets(&self) -> usize {
        self.0.len()
    }
}

struct Redis {
    limiter: RedisLimiter,
    raw: redis::aio::MultiplexedConnection,
    prefix: String,
}

impl Backend for Redis {
    async fn new(quota: Quota) -> Option<Self> {
        let url = redis_support::url()?;
        let prefix = redis_support::unique_prefix("backends");
        let limiter = redis_support::limiter("unused", quota)
            .await?
            .with_prefix(prefix.clone());
        Some(Redis {
            limiter,
            raw: redis_support::raw(&url).await,
            prefix,
        })
    }
    async fn check(&self, key: &str, timestamp: f64, cost: u64) -> Result<u64, Denial> {
        self.limiter
            .check(key, timestamp, cost)
            .await
            .unwrap_or_else(|err| panic!("Redis failed: {err}"))
    }
    async fn check_under(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
        quota: &Quota,
    ) -> Result<u64, Denial> {
        self.limiter
            .under(quota)
            .check(key, timestamp, cost)
            .await
            .unwrap_or_else(|err| panic!("Redis failed: {err}"))
    }
    async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        self.limiter.allow_n(key, timestamp, cost).await
    }
    async fn remaining(&self, key: &str, timestamp: f64) -> Option<u64> {
        self.limiter
            .remaining(key, timestamp)
            .await
            .unwrap_or_else(|err| panic!("Redis failed: {err}"))
    }
    async fn buckets(&self) -> usize {
        redis_support::keys(&mut self.raw.clone(), &self.prefix)
            .await
            .len()
    }
}

/// The async limiter with its local deny mirror turned off: every call
/// asks Redis.
struct RedisNoMirror(Redis);

impl Backend for RedisNoMirror {
    async fn new(quota: Quota) -> Option<Self> {
        let mut redis = Redis::new(quota).await?;
        redis.limiter = redis.limiter.with_mirror_capacity(0);
        Some(RedisNoMirror(redis))
    }
    async fn check(&self, key: &str, timestamp: f64, cost: u64) -> Result<u64, Denial> {
        self.0.check(key, timestamp, cost).await
    }
    async fn check_under(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
        quota: &Quota,
    ) -> Result<u64, Denial> {
        self.0.check_under(key, timestamp, cost, quota).await
    }
    async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        self.0.allow_n(key, timestamp, cost).await
    }
    async fn remaining(&self, key: &str, timestamp: f64) -> Option<u64> {
        self.0.remaining(key, timestamp).await
    }
    async fn buckets(&self) -> usize {
        self.0.buckets().await
    }
}

/// The async limiter over a Redis Cluster connection
/// (`KEYRATE_REDIS_CLUSTER_URLS`).
#[cfg(feature = "redis-cluster")]
struct Cluster {
    limiter: RedisLimiter<redis::cluster_async::ClusterConnection>,
    raw: redis::cluster_async::ClusterConnection,
    prefix: String,
}

#[cfg(feature = "redis-cluster")]
impl Backend for Cluster {
    async fn new(quota: Quota) -> Option<Self> {
        let urls = redis_support::cluster_urls()?;
        let prefix = redis_support::unique_prefix("cluster");
        let raw = redis_support::cluster(&urls).await;
        let limiter = RedisLimiter::with_connection(raw.clone(), quota)
            .with_prefix(prefix.clone())
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(redis_support::TEST_TIMEOUT);
        Some(Cluster {
            limiter,
            raw,
            prefix,
        })
    }
    async fn check(&self, key: &str, timestamp: f64, cost: u64) -> Result<u64, Denial> {
        self.limiter
            .check(key, timestamp, cost)
            .await
            .unwrap_or_else(|err| panic!("Redis Cluster failed: {err}"))
    }
    async fn check_under(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
        quota: &Quota,
    ) -> Result<u64, Denial> {
        self.limiter
            .under(quota)
            .check(key, timestamp, cost)
            .await
            .unwrap_or_else(|err| panic!("Redis Cluster failed: {err}"))
    }
    async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        self.limiter.allow_n(key, timestamp, cost).await
    }
    async fn remaining(&self, key: &str, timestamp: f64) -> Option<u64> {
        self.limiter
            .remaining(key, timestamp)
            .await
            .unwrap_or_else(|err| panic!("Redis Cluster failed: {err}"))
    }
    async fn buckets(&self) -> usize {
        redis_support::keys_on(&mut self.raw.clone(), &self.prefix)
            .await
            .len()
    }
}

/// The blocking limiter, called from the async suite with
/// `block_in_place` (the Redis cases run on a multi-threaded runtime).
struct Blocking {
    limiter: BlockingRedisLimiter,
    raw: redis::aio::MultiplexedConnection,
    prefix: String,
}

impl Backend for Blocking {
    async fn new(quota: Quota) -> Option<Self> {
        let url = redis_support::url()?;
        let prefix = redis_support::unique_prefix("blocking");
        let limiter = tokio::task::block_in_place(|| BlockingRedisLimiter::connect(&url, quota))
            .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
            .with_prefix(prefix.clone())
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(redis_support::TEST_TIMEOUT);
        Some(Blocking {
            limiter,
            raw: redis_support::raw(&url).await,
            prefix,
        })
    }
    async fn check(&self, key: &str, timestamp: f64, cost: u64) -> Result<u64, Denial> {
        tokio::task::block_in_place(|| self.limiter.check(key, timestamp, cost))
            .unwrap_or_else(|err| panic!("Redis failed: {err}"))
    }
    async fn check_under(
        &self,
        key: &str,
        timestamp: f64,
        cost: u64,
        quota: &Quota,
    ) -> Result<u64, Denial> {
        tokio::task::block_in_place(|| self.limiter.under(quota).check(key, timestamp, cost))
            .unwrap_or_else(|err| panic!("Redis failed: {err}"))
    }
    async fn allow_n(&self, key: &str, timestamp: f64, cost: u64) -> bool {
        tokio::task::block_in_place(|| self.limiter.allow_n(key, timestamp, cost))
    }
    async fn remaining(&self, key: &str, timestamp: f64) -> Option<u64> {
        tokio::task::block_in_place(|| self.limiter.remaining(key, timestamp))
            .unwrap_or_else(|err| panic!("Redis failed: {err}"))
    }
    async fn buckets(&self) -> usize {
        redis_support::keys(&mut self.raw.clone(), &self.prefix)
            .await
            .len()
    }
}

fn quota(rate: f64, capacity: u64) -> Quota {
    Quota::new(rate, capacity).unwrap()
}

const NANOS: f64 = 1e-9;

async fn seed_example<B: Backend>() {
    let Some(b) = B::new(quota(1.0, 3)).await else {
        return;
    };
    assert!(b.allow_n("key1", 0.0, 1).await);
    assert!(b.allow_n("key1", 0.0, 1).await);
    assert!(b.allow_n("key1", 0.0, 1).await);
    assert!(!b.allow_n("key1", 0.0, 1).await);
    assert!(b.allow_n("key1", 2.0, 1).await);
    assert!(!b.allow_n("key1", 2.0, 2).await);
    assert_eq!(b.remaining("key1", 2.0).await, Some(1));
    assert_eq!(b.buckets().await, 1);
}

async fn cost_zero<B: Backend>() {
    let Some(b) = B::new(quota(1.0, 3)).await else {
        return;
    };
    // On a key never seen: admitted, full, and no bucket made.
    assert_eq!(b.check("k", 5.0, 0).await, Ok(3));
    assert_eq!(b.buckets().await, 0);
    // On an empty bucket: still admitted, and nothing changes.
    assert_eq!(b.check("k", 5.0, 3).await, Ok(0));
    assert_eq!(b.check("k", 5.0, 0).await, Ok(0));
    assert_eq!(b.check("k", 6.0, 0).await, Ok(1));
    assert_eq!(b.remaining("k", 6.0).await, Some(1));
    assert_eq!(b.check("k", 6.0, 1).await, Ok(0));
}

async fn cost_above_capacity<B: Backend>() {
    let Some(b) = B::new(quota(1.0, 3)).await else {
        return;
    };
    for cost in [4, 1 << 40, u64::MAX] {
        assert_eq!(
            b.check("k", 0.0, cost).await,
            Err(Denial::ExceedsCapacity { cost, capacity: 3 })
        );
    }
    assert_eq!(b.buckets().await, 0, "a denial makes no bucket");
    // Exactly the capacity is admitted on a full bucket.
    assert_eq!(b.check("k", 0.0, 3).await, Ok(0));
    assert_eq!(
        b.check("k", 1000.0, u64::MAX).await,
        Err(Denial::ExceedsCapacity {
            cost: u64::MAX,
            capacity: 3
        })
    );
    assert_eq!(b.remaining("k", 0.0).await, Some(0));
}

async fn bad_timestamps<B: Backend>() {
    let Some(b) = B::new(quota(1.0, 3)).await else {
        return;
    };
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
        assert_eq!(b.check("k", ts, 1).await, Err(Denial::InvalidTimestamp));
        assert_eq!(b.check("k", ts, 0).await, Err(Denial::InvalidTimestamp));
        assert_eq!(b.check("k", ts, 9).await, Err(Denial::InvalidTimestamp));
        assert!(!b.allow_n("k", ts, 1).await);
        assert_eq!(b.remaining("k", ts).await, None);
    }
    assert_eq!(b.buckets().await, 0, "bad timestamps create nothing");
    // ...and change nothing on an existing bucket.
    assert_eq!(b.check("k", 1.0, 2).await, Ok(1));
    for ts in bad {
        let _ = b.check("k", ts, 1).await;
    }
    assert_eq!(b.remaining("k", 1.0).await, Some(1));
    assert_eq!(b.check("k", 1.0, 1).await, Ok(0));
}

async fn backwards_time<B: Backend>() {
    let Some(b) = B::new(quota(1.0, 3)).await else {
        return;
    };
    assert_eq!(b.check("k", 10.0, 1).await, Ok(2));
    // Half a second earlier the same bucket holds fewer tokens, never more.
    assert_eq!(b.remaining("k", 9.5).await, Some(1));
    assert_eq!(b.check("k", 9.5, 1).await, Ok(0));
    assert_eq!(b.remaining("k", 10.0).await, Some(1));
    // Far in the past: nothing, and a denial with the exact wait.
    assert_eq!(b.remaining("k", 0.0).await, Some(0));
    assert_eq!(
        b.check("k", 0.0, 1).await,
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_secs(10)
        })
    );
    // Time running forward again finds the bucket as the spends left it.
    assert_eq!(b.remaining("k", 12.0).await, Some(3));
}

async fn retry_after_is_exact<B: Backend>() {
    let Some(b) = B::new(quota(2.0, 1)).await else {
        return;
    };
    assert_eq!(b.check("k", 0.0, 1).await, Ok(0));
    let denial = b.check("k", 0.0, 1).await.unwrap_err();
    let wait = denial.retry_after().unwrap();
    assert_eq!(wait, Duration::from_millis(500));
    // One nanosecond before the wait is over: denied by exactly 1 ns.
    let almost = wait.as_secs_f64() - NANOS;
    assert_eq!(
        b.check("k", almost, 1).await.unwrap_err().retry_after(),
        Some(Duration::from_nanos(1))
    );
    assert_eq!(b.check("k", wait.as_secs_f64(), 1).await, Ok(0));

    // A fractional interval: 3 tokens/s is 333_333_333.3 ns per token,
    // charged as 333_333_334 whole ns, so a burst of 3 is whole.
    let Some(b) = B::new(quota(3.0, 3)).await else {
        return;
    };
    assert_eq!(b.check("k", 0.0, 1).await, Ok(2));
    assert_eq!(b.check("k", 0.0, 2).await, Ok(0));
    assert_eq!(
        b.check("k", 0.0, 1).await.unwrap_err().retry_after(),
        Some(Duration::from_nanos(333_333_334))
    );
    assert_eq!(b.check("k", 333_333_334.0 * NANOS, 1).await, Ok(0));
}

async fn refill_is_capped<B: Backend>() {
    let Some(b) = B::new(quota(1.0, 3)).await else {
        return;
    };
    assert_eq!(b.check("k", 0.0, 3).await, Ok(0));
    assert_eq!(b.remaining("k", 1000.0).await, Some(3));
    assert_eq!(b.check("k", 1000.0, 3).await, Ok(0));
    assert!(!b.allow_n("k", 1000.0, 1).await);
}

async fn keys_are_independent<B: Backend>() {
    let Some(b) = B::new(quota(1.0, 1)).await else {
        return;
    };
    assert!(b.allow_n("sk_live_a", 0.0, 1).await);
    assert!(b.allow_n("sk_live_b", 0.0, 1).await);
    assert!(!b.allow_n("sk_live_a", 0.0, 1).await);
    assert_eq!(b.buckets().await, 2);
}

/// A full bucket admits calls whose costs sum to exactly its capacity, at
/// one instant, at awkward rates and with mixed costs; one token more is
/// denied for exactly one interval. The same after idling `refill_time`.
async fn whole_bursts<B: Backend>() {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
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
            let q = quota(rate, capacity);
            let Some(b) = B::new(q).await else {
                return;
            };
            let key = format!("burst{i}");
            let interval = q.interval().as_nanos() as u64;
            let window = q.refill_time().as_nanos() as u64;
            let mut now = if i % 2 == 0 { EPOCH_UNIX } else { 0 };
            for _round in 0..2 {
                let (secs, seen) = as_secs(now);
                let mut left = capacity;
                while left > 0 {
                    let cost = 1 + next() % left.min(1 + capacity / 4);
                    left -= cost;
                    assert_eq!(b.check(&key, secs, cost).await, Ok(left), "rate {rate}");
                }
                assert_eq!(
                    b.check(&key, secs, 1).await,
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

/// Plans for the quota-change case: whole and fractional intervals.
const PLANS: &[Plan] = &[
    Plan {
        num: 1,
        den: 1,
        capacity: 5,
    },
    Plan {
        num: 20,
        den: 1,
        capacity: 100,
    },
    Plan {
        num: 3,
        den: 1,
        capacity: 3,
    },
    Plan {
        num: 1,
        den: 4,
        capacity: 2,
    },
];

/// Calls under quotas that change at random points decide as the
/// independent model's rule says: the refill still missing is kept.
async fn quotas_changing_follow_the_model<B: Backend>() {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..8 {
        let Some(b) = B::new(quota(1.0, 5)).await else {
            return;
        };
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
            let got = match b.check_under(key, secs, cost, &q).await {
                Ok(remaining) => PlanOutcome::Admitted { remaining },
                Err(Denial::InsufficientTokens { retry_after }) => PlanOutcome::Wait {
                    retry_ns: retry_after.as_nanos() as u64,
                },
                Err(Denial::ExceedsCapacity { .. }) => PlanOutcome::ExceedsCapacity,
                Err(other) => panic!("unexpected {other:?}"),
            };
            assert_eq!(
                got,
                model.call(key, seen, cost, plan),
                "cost {cost} at {seen} ns"
            );
        }
    }
}

/// Rates as exact fractions `num / den`: whole and fractional intervals.
const RATES: &[(u64, u64)] = &[
    (1, 1),
    (3, 1),
    (1, 4),
    (7, 2),
    (1000, 1),
    (13, 16),
    (999_983, 1),
    (1_000_000_000, 1),
];

const EPOCH_UNIX: u64 = 1_700_000_000_000_000_000;

type Case = ((u64, u64), u64, bool, Vec<(usize, u64, u64)>);

/// A rate, a capacity, a Unix-scale start or not, and `(key, step, cost)`
/// calls where `step` picks how far time moves.
fn case() -> impl Strategy<Value = Case> {
    (0..RATES.len(), 1u64..=8, any::<bool>()).prop_flat_map(|(r, capacity, unix)| {
        let ops = prop::collection::vec((0usize..2, any::<u64>(), 0..=capacity + 1), 1..40);
        (Just(RATES[r]), Just(capacity), Just(unix), ops)
    })
}

async fn run_trace<B: Backend>(case: Case) -> Result<(), TestCaseError> {
    let ((num, den), capacity, unix, ops) = case;
    let Some(b) = B::new(quota(num as f64 / den as f64, capacity)).await else {
        return Ok(());
    };
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
        let got = match b.check(keys[key], secs, cost).await {
            Ok(remaining) => Outcome::Admitted { remaining },
            Err(Denial::InsufficientTokens { retry_after }) => Outcome::Wait {
                retry_ns: retry_after.as_nanos() as u64,
            },
            Err(Denial::ExceedsCapacity { .. }) => Outcome::ExceedsCapacity,
            Err(other) => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
        };
        let want = model.call(keys[key], seen, cost);
        prop_assert_eq!(got, want, "cost {} at {} ns", cost, seen);
        prop_assert_eq!(
            b.remaining(keys[key], secs).await,
            Some(model.remaining(keys[key], seen))
        );
        if matches!(want, Outcome::Admitted { .. }) && cost > 0 {
            admitted.entry(key).or_default().push((seen, cost));
        }
    }
    prop_assert_eq!(b.buckets().await, model.len());
    let exact = Model::exact(num, den, capacity);
    for history in admitted.values() {
        prop_assert!(exact.within_budget(history), "over budget: {:?}", history);
    }
    Ok(())
}

async fn equals_the_exact_model<B: Backend>() {
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    // proptest drives the cases synchronously; each runs on this runtime
    // from a blocking thread.
    let result = tokio::task::spawn_blocking(move || {
        runner.run(&case(), |case| handle.block_on(run_trace::<B>(case)))
    })
    .await
    .expect("the property test panicked");
    if let Err(err) = result {
        panic!("{err}");
    }
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case::<super::Memory>().await;
                }
            )*
        }
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case::<super::Redis>().await;
                }
            )*
        }
        mod on_redis_without_mirror {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case::<super::RedisNoMirror>().await;
                }
            )*
        }
        #[cfg(feature = "redis-cluster")]
        mod on_redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case::<super::Cluster>().await;
                }
            )*
        }
        mod on_redis_blocking {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case::<super::Blocking>().await;
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

//! The local deny mirror against a real Redis: the decisions of the
//! independent model, as the mirror-off limiter makes them, with the
//! caller's timestamps (several limiters, one Redis, random keys, costs and
//! timestamps, backwards time included), and with Redis's clock never an
//! admission Redis would refuse.
//!
//! Needs `KEYRATE_REDIS_URL` (see `redis_support`).
#![cfg(not(loom))]

mod common;
mod redis_support;

use common::model::{outcome, Model, Outcome};
use common::EPOCH_UNIX;
use keyrate::{AsyncLimiter, Decision, Denial, Now, Quota, RedisDenial, RedisLimiter, Refusal};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis_support::{raw, unique_prefix, url, TEST_TIMEOUT};
use std::time::{Duration, Instant};

/// Redis's answer to a check: the tokens left, or the denial; a Redis
/// error fails the test.
fn decided(answer: Result<Decision, RedisDenial>) -> Result<u64, Denial> {
    match answer {
        Ok(decision) => Ok(decision.remaining()),
        Err(err) => Err(*err
            .denial()
            .unwrap_or_else(|| panic!("Redis answers: {err}"))),
    }
}

/// `n` limiters over their own connections, sharing `prefix`, with the
/// mirror of `capacity` bounds (0: off).
async fn limiters(
    url: &str,
    quota: Quota,
    prefix: &str,
    n: usize,
    capacity: usize,
) -> Vec<RedisLimiter> {
    let mut out = Vec::new();
    for _ in 0..n {
        let limiter = RedisLimiter::connect(url, quota)
            .await
            .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
            .with_namespace(prefix, keyrate::KeyNames::Encoded)
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(TEST_TIMEOUT)
            .with_mirror_capacity(capacity);
        out.push(limiter);
    }
    out
}

/// One call: which limiter, which key, the step of time, the cost.
type Op = (usize, usize, u64, u64);

fn ops(capacity: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (0..3usize, 0..3usize, any::<u64>(), 0..=capacity + 1),
        1..80,
    )
}

/// Each op runs on limiter `i` of the mirrored set and of the mirror-off
/// set (two prefixes, so two copies of every bucket on one Redis), and in
/// the independent model of the rate `num / den`. Returns how many calls
/// the mirrors denied locally, without a round trip.
async fn differential(
    url: &str,
    (num, den, capacity): (u64, u64, u64),
    ops: Vec<Op>,
    mirror_capacity: usize,
) -> Result<u64, TestCaseError> {
    let quota = Quota::new(num as f64 / den as f64, capacity).unwrap();
    // Bounds that deny for an hour, far beyond a case: whether a call is
    // denied locally or goes to Redis follows from the ops alone, not from
    // how fast this machine runs them (the default second could lapse
    // between two calls on a busy one, sending them to Redis instead).
    // Nothing here resets a key, so every bound stays a lower bound.
    let mirrored: Vec<RedisLimiter> =
        limiters(url, quota, &unique_prefix("mirror_on"), 3, mirror_capacity)
            .await
            .into_iter()
            .map(|limiter| limiter.with_mirror_refresh(Duration::from_secs(3600)))
            .collect();
    let plain = limiters(url, quota, &unique_prefix("mirror_off"), 3, 0).await;
    let mut model = Model::rounded(num, den, capacity);
    let interval = model.spend_ns(1);
    let mut now = EPOCH_UNIX;
    for (i, key, step, cost) in ops {
        // Mostly forwards, sometimes still, sometimes backwards.
        now = match step % 5 {
            0 => now,
            1 => now + 1,
            2 => now + (step / 5) % (2 * interval + 1),
            3 => now - (step / 5) % (interval + 1),
            _ => now + (step / 5) % (interval / 3 + 1),
        };
        let at = Duration::from_nanos(now);
        let key = format!("k{key}");
        let want = model.call(&key, now, cost);
        let redis = outcome(plain[i].check(&key, at, cost).await);
        prop_assert_eq!(
            redis,
            want,
            "mirror off: limiter {} key {} cost {} at {}",
            i,
            &key,
            cost,
            now
        );
        let got = outcome(mirrored[i].check(&key, at, cost).await);
        match (got, want) {
            (Outcome::Wait { retry_ns: local }, Outcome::Wait { retry_ns: exact }) => {
                // Exact when this limiter is the key's only writer; a lower
                // bound when the other limiters spent it meanwhile.
                prop_assert!(local <= exact, "retry-after {} ns > {} ns", local, exact);
            }
            (got, want) => prop_assert_eq!(
                got,
                want,
                "mirror on: limiter {} key {} cost {} at {}",
                i,
                key,
                cost,
                now
            ),
        }
    }
    Ok(mirrored.iter().map(|l| l.stats().mirror_denials).sum())
}

fn run_differential(mirror_capacity: usize) {
    let url = url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    // (num, den, capacity): the rate is num / den tokens a second.
    let quotas = [(1, 1, 3), (3, 1, 5), (1_000_000, 1, 4), (1, 2, 1)];
    let strategy = (0..quotas.len()).prop_flat_map(move |q| {
        let quota = quotas[q];
        (Just(quota), ops(quota.2))
    });
    // Calls the mirrors denied locally, over every case run.
    let local = std::cell::Cell::new(0u64);
    let result = runner.run(&strategy, |(quota, ops)| {
        let denied = runtime.block_on(differential(&url, quota, ops, mirror_capacity))?;
        local.set(local.get() + denied);
        Ok(())
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    // The agreement above says nothing of the mirror if it never denied:
    // its path must have decided calls. (Thousands of calls on 3 keys,
    // capacities of 1 to 5: a case with repeated denials is the rule.)
    eprintln!("the mirrors denied {} calls locally", local.get());
    assert!(
        local.get() > 0,
        "the mirrors denied no call locally: only Redis decided"
    );
}

#[test]
fn the_mirror_decides_as_redis_alone() {
    run_differential(65_536);
}

#[test]
fn a_tiny_mirror_evicts_and_still_decides_as_redis_alone() {
    // Two bounds for three keys: bounds are dropped or not kept.
    run_differential(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_clock_the_mirror_only_denies_what_redis_denies() {
    let url = url();
    // One token per 1024 s: nothing refills during the test, so a call is
    // admitted exactly when the bucket still holds a token in Redis.
    let slow = Quota::new(1.0 / 1024.0, 3).unwrap();
    let prefix = unique_prefix("mirror_now");
    let mirrored = limiters(&url, slow, &prefix, 1, 1024).await.remove(0);
    let other = limiters(&url, slow, &prefix, 1, 0).await.remove(0);
    assert_eq!(decided(mirrored.check("k", Now, 1).await), Ok(2));
    // Another process spends behind the mirror's back: its bound is stale
    // (too low), so it asks Redis, which denies, and learns the word.
    assert_eq!(decided(other.check("k", Now, 2).await), Ok(0));
    assert!(decided(mirrored.check("k", Now, 1).await).is_err());
    for _ in 0..100 {
        let denial = decided(mirrored.check("k", Now, 1).await).unwrap_err();
        assert!(denial.retry_after().unwrap() > Duration::from_secs(1000));
        assert_eq!(other.remaining("k", Now).await.unwrap(), 0, "Redis agrees");
    }

    // A fast quota hammered from two tasks for a while: the mirrored
    // limiter admits no more than Redis's clock allows over the run
    // (capacity plus the refill of the elapsed time, measured around it on
    // Redis's clock).
    let rate = 2000.0;
    let fast = Quota::new(rate, 5).unwrap();
    let prefix = unique_prefix("mirror_now_fast");
    let mirrored = limiters(&url, fast, &prefix, 1, 1024).await.remove(0);
    let mut conn = raw(&url).await;
    let start = redis_time(&mut conn).await;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let limiter = mirrored.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            let until = Instant::now() + Duration::from_millis(300);
            while Instant::now() < until {
                if decided(limiter.check("hot", Now, 1).await).is_ok() {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    // On Redis's clock, which decided every call.
    let elapsed = (redis_time(&mut conn).await - start).as_secs_f64();
    let most = 5 + (elapsed * rate).ceil() as u64 + 1;
    assert!(
        admitted <= most,
        "admitted {admitted}, Redis allows at most {most}"
    );
    assert!(admitted > 0);
}

/// Redis's `TIME`, since the Unix epoch.
async fn redis_time(conn: &mut redis::aio::MultiplexedConnection) -> Duration {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    Duration::from_secs(secs) + Duration::from_micros(micros)
}

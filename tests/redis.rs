//! The Redis backend on its own: exactness at Unix-epoch nanoseconds, the
//! stored word and its TTL, Redis's clock, concurrency across connections,
//! typed failures, and a server killed and restarted mid-run.
//!
//! Needs `KEYRATE_REDIS_URL` (see `redis_support`); the restart test also
//! starts its own `redis-server` (`KEYRATE_REDIS_SERVER_BIN`, or the one on
//! `PATH`).
#![cfg(not(loom))]

mod common;
mod redis_support;

use common::model::{as_secs, outcome, Model};
use common::EPOCH_UNIX;
use keyrate::{
    AsyncLimiter, BlockingRedisLimiter, Decision, Denial, FailurePolicy, Limiter, Now, Quota,
    RedisDenial, RedisErrorKind, RedisLimiter, RedisLimiterError, Refusal, MAX_TIMESTAMP_NANOS,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::aio::MultiplexedConnection;
use redis_support::{limiter, raw, url, PrivateServer, TEST_TIMEOUT};
use std::time::{Duration, Instant};

const SEC: u64 = 1_000_000_000;
fn quota(rate: f64, capacity: u64) -> Quota {
    Quota::new(rate, capacity).unwrap()
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

/// The key's TTL in ms: -1 when it has none (a key that would never
/// expire), -2 when there is no key.
async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

/// The TTL of a fresh bucket that spends `cost` at 5 s, whose TTL is at
/// most `most` ms, read right after: between 0 (read in its last
/// millisecond) and `most`. Such a key may be gone before it is read, so a
/// read that finds no key (-2) tries again on a new key (named `name` and
/// a number); one that finds a key without a TTL (-1) fails at once.
async fn short_ttl(
    conn: &mut MultiplexedConnection,
    limiter: &RedisLimiter,
    name: &str,
    cost: u64,
    most: i64,
) -> i64 {
    for attempt in 0..1000 {
        let key = format!("{name}{attempt}");
        assert!(limiter.allow_n(key.as_str(), 5.0, cost).await);
        let ttl = pttl(conn, &limiter.bucket_key(&key)).await;
        assert_ne!(ttl, -1, "a bucket without a TTL");
        if ttl != -2 {
            assert!((0..=most).contains(&ttl), "PTTL {ttl}, at most {most}");
            return ttl;
        }
    }
    panic!("every one of 1000 keys expired before its TTL was read");
}

/// Redis's answer, failing the test on a Redis error.
fn answered<T>(answer: Result<T, RedisDenial>) -> Result<T, Denial> {
    answer.map_err(|err| {
        *err.denial()
            .unwrap_or_else(|| panic!("Redis failed: {err}"))
    })
}

/// Redis's answer to a check: the tokens left, or the denial; a Redis
/// error fails the test.
fn decided(answer: Result<Decision, RedisDenial>) -> Result<u64, Denial> {
    answered(answer).map(|decision| decision.remaining())
}

/// The Redis failure a fail-closed call answers; anything else fails the
/// test.
fn failure<T: std::fmt::Debug>(answer: Result<T, RedisDenial>) -> RedisLimiterError {
    match answer {
        Err(RedisDenial::Failed(err)) => err,
        other => panic!("expected a Redis failure, got {other:?}"),
    }
}

#[test]
fn public_types_are_send_sync_debug() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<RedisLimiter>();
    check::<BlockingRedisLimiter>();
    check::<RedisLimiterError>();
    check::<RedisDenial>();
    check::<FailurePolicy>();
    check::<RedisErrorKind>();
}

#[tokio::test]
async fn nanosecond_exact_at_unix_epoch_scale() {
    let l = limiter("unix_ns", quota(1.0, 3)).await;
    let mut conn = raw(&url()).await;
    let key = l.bucket_key("k");
    let t = Duration::from_nanos(EPOCH_UNIX + 123_456_789);
    for left in [2, 1, 0] {
        assert_eq!(decided(l.check("k", t, 1).await), Ok(left));
    }
    // The stored word is full_at in ns, exactly: beyond 2^53, where a Lua
    // double would have rounded it.
    let full_at = EPOCH_UNIX + 123_456_789 + 3 * SEC;
    assert!(full_at > 1 << 53);
    assert_eq!(get(&mut conn, &key).await, Some(full_at.to_string()));
    // One token is back exactly 1 s later, not 1 ns sooner.
    let almost = t + Duration::from_nanos(SEC - 1);
    assert_eq!(
        decided(l.check("k", almost, 1).await),
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_nanos(1)
        })
    );
    assert_eq!(get(&mut conn, &key).await, Some(full_at.to_string()));
    assert_eq!(
        decided(l.check("k", t + Duration::from_secs(1), 1).await),
        Ok(0)
    );
    assert_eq!(
        get(&mut conn, &key).await,
        Some((full_at + SEC).to_string())
    );
    // A timestamp past the range is a plain denial.
    let past = Duration::from_nanos(MAX_TIMESTAMP_NANOS) + Duration::from_nanos(1);
    assert_eq!(
        decided(l.check("k", past, 1).await),
        Err(Denial::InvalidTimestamp)
    );
}

#[tokio::test]
async fn extreme_quotas_equal_the_model() {
    // Windows and timestamps far beyond 2^53 ns, and words beyond 2^63.
    // The last instants sit a few ms below 2^63 ns: an f64 of seconds
    // resolves about 2 us there, and must not round past the range. The
    // model's interval is computed from each rate's exact fraction in
    // 128 bits (1.1e-10 has a denominator of 2^86).
    let late = MAX_TIMESTAMP_NANOS - 10_000_000;
    let cases: [(f64, u64, &[u64]); 3] = [
        (1.1e-10, 1, &[0, late - 5_000_000, late]),
        (1e9, 1 << 62, &[MAX_TIMESTAMP_NANOS / 2, late]),
        (1.0, 9_223_372_036, &[EPOCH_UNIX, EPOCH_UNIX + 1, late]),
    ];
    for (rate, capacity, instants) in cases {
        let l = limiter("extreme", quota(rate, capacity)).await;
        let mut model = Model::rounded_f64(rate, capacity);
        let mut conn = raw(&url()).await;
        for &ns in instants {
            // f64 seconds, as the in-memory API takes them, and the
            // nanoseconds they stand for.
            let (secs, seen) = as_secs(ns);
            for cost in [1, capacity / 2, capacity, 0] {
                assert_eq!(
                    outcome(l.check("k", secs, cost).await),
                    model.call("k", seen, cost),
                    "rate {rate} capacity {capacity} cost {cost} at {secs} s"
                );
            }
            assert_eq!(
                answered(l.remaining("k", secs).await),
                Ok(model.remaining("k", seen))
            );
        }
        let word: u64 = get(&mut conn, &l.bucket_key("k"))
            .await
            .expect("a bucket")
            .parse()
            .expect("a u64 word");
        assert!(word > MAX_TIMESTAMP_NANOS, "word {word} past 2^63");
    }
}

type Trace = ((u64, u64), u64, Vec<(u64, u64)>);

/// Nanosecond-exact traces at Unix scale, through `check` at a `Duration`.
fn trace() -> impl Strategy<Value = Trace> {
    let rates = [
        (1u64, 1u64),
        (3, 1),
        (7, 2),
        (13, 16),
        (999_983, 1),
        (1_000_000_000, 1),
    ];
    (0..rates.len(), 1u64..=6).prop_flat_map(move |(r, capacity)| {
        let ops = prop::collection::vec((any::<u64>(), 0..=capacity + 1), 1..40);
        (Just(rates[r]), Just(capacity), ops)
    })
}

async fn run_unix_trace(l: RedisLimiter, trace: Trace) -> Result<(), TestCaseError> {
    let ((num, den), capacity, ops) = trace;
    let mut model = Model::rounded(num, den, capacity);
    let interval = model.spend_ns(1);
    let mut now = EPOCH_UNIX;
    for (step, cost) in ops {
        now += match step % 4 {
            0 => 0,
            1 => 1,
            2 => (step / 4) % interval,
            _ => (step / 4) % (3 * interval),
        };
        let got = outcome(l.check("k", Duration::from_nanos(now), cost).await);
        prop_assert_eq!(
            got,
            model.call("k", now, cost),
            "cost {} at {} ns",
            cost,
            now
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_nanosecond_traces_equal_the_model() {
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        });
        runner.run(&trace(), |trace| {
            handle.block_on(async {
                let rate = trace.0 .0 as f64 / trace.0 .1 as f64;
                let l = limiter("unix_trace", quota(rate, trace.1)).await;
                run_unix_trace(l, trace).await
            })
        })
    })
    .await
    .unwrap();
    if let Err(err) = result {
        panic!("{err}");
    }
}

#[tokio::test]
async fn ttl_is_the_time_until_full() {
    // 100 s per token, so that the bounds below hold even if the test
    // stalls for a while between two commands.
    let l = limiter("ttl", quota(0.01, 3)).await;
    // No floor: the TTL is exactly the time to full.
    let l = l.with_min_ttl(Duration::ZERO);
    let mut conn = raw(&url()).await;
    let key = l.bucket_key("k");
    assert_eq!(decided(l.check("k", 100.0, 2).await), Ok(1));
    let ttl = pttl(&mut conn, &key).await;
    assert!(
        100_000 < ttl && ttl <= 200_000,
        "PTTL {ttl} for a bucket full in 200 s"
    );
    // A denial writes nothing: neither the word nor the TTL.
    let word = get(&mut conn, &key).await;
    assert!(decided(l.check("k", 100.0, 3).await).is_err());
    assert_eq!(get(&mut conn, &key).await, word);
    let after = pttl(&mut conn, &key).await;
    assert!(0 < after && after <= ttl, "PTTL {after} after {ttl}");
    // An admission that fills the bucket until later extends the TTL.
    assert_eq!(decided(l.check("k", 100.0, 1).await), Ok(0));
    let longer = pttl(&mut conn, &key).await;
    assert!(200_000 < longer && longer <= 300_000, "PTTL {longer}");

    // Time to full rounds up to the millisecond, and is at least 1 ms.
    let fast = limiter("ttl_fast", quota(1e9, 1_500_000))
        .await
        .with_min_ttl(Duration::ZERO);
    short_ttl(&mut conn, &fast, "a", 1_500_000, 2).await; // 1.5 ms -> 2 ms
    short_ttl(&mut conn, &fast, "b", 1, 1).await; // 1 ns -> 1 ms

    // A floor raises every TTL (to the hour `limiter` sets).
    let floored = limiter("ttl_floor", quota(1.0, 3)).await;
    assert!(floored.allow("k", 0.0).await);
    let ttl = pttl(&mut conn, &floored.bucket_key("k")).await;
    assert!(3000 < ttl && ttl <= 3_600_000, "PTTL {ttl}");
}

/// At Redis's clock, an admission on a key whose word the mirror knows and
/// whose bucket is not full takes the script's fast path (the new word is
/// the old one plus the spend, whatever the instant): its expiry is still
/// the instant the bucket is full again.
#[tokio::test]
async fn at_redis_clock_the_ttl_is_the_time_until_full() {
    // 100 s per token; no floor: the TTL is exactly the time to full.
    let l = limiter("ttl_now", quota(0.01, 3))
        .await
        .with_min_ttl(Duration::ZERO);
    let mut conn = raw(&url()).await;
    let key = l.bucket_key("k");
    // `PXAT` is the word rounded up to the millisecond, and Redis counts
    // PTTL from its clock's whole millisecond: up to 1 ms over.
    // A missing key: the general path.
    assert_eq!(decided(l.check("k", Now, 1).await), Ok(2));
    let ttl = pttl(&mut conn, &key).await;
    assert!(0 < ttl && ttl <= 100_001, "PTTL {ttl}, full in 100 s");
    // The word the mirror learned, not full: the fast path.
    assert_eq!(decided(l.check("k", Now, 1).await), Ok(1));
    let ttl = pttl(&mut conn, &key).await;
    assert!(100_000 < ttl && ttl <= 200_001, "PTTL {ttl}, full in 200 s");
    let word = get(&mut conn, &key).await;
    assert!(decided(l.check("k", Now, 2).await).is_err());
    assert_eq!(get(&mut conn, &key).await, word, "a denial writes nothing");
    assert_eq!(decided(l.check("k", Now, 1).await), Ok(0));
    let ttl = pttl(&mut conn, &key).await;
    assert!(200_000 < ttl && ttl <= 300_001, "PTTL {ttl}, full in 300 s");
    // Each admission added exactly its spend to the word: 100 s a token
    // after the first spend's instant.
    let word: u64 = get(&mut conn, &key).await.unwrap().parse().unwrap();
    assert!(!l.allow("k", Now).await);
    assert_eq!(
        get(&mut conn, &key).await.unwrap().parse::<u64>().unwrap(),
        word
    );

    // A floor raises the fast path's expiry too (to the hour `limiter`
    // sets).
    let floored = limiter("ttl_now_floor", quota(1.0, 3)).await;
    for _ in 0..2 {
        assert!(floored.allow("k", Now).await);
    }
    let ttl = pttl(&mut conn, &floored.bucket_key("k")).await;
    assert!(3000 < ttl && ttl <= 3_600_000, "PTTL {ttl}");
}

/// At Redis's clock, a bucket that has refilled since the word the mirror
/// knows spends from Redis's instant, not from that word (the script's
/// fast path does not apply to a full bucket).
#[tokio::test]
async fn at_redis_clock_a_refilled_bucket_spends_from_now() {
    // 1 ms a token: full again 1 ms after a spend. The hour's TTL floor
    // keeps the key.
    let l = limiter("now_refilled", quota(1000.0, 3)).await;
    let mut conn = raw(&url()).await;
    let key = l.bucket_key("k");
    for round in 0..3 {
        assert!(l.allow("k", Now).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = redis_time(&mut conn).await.as_nanos() as u64;
        assert!(l.allow("k", Now).await);
        let word: u64 = get(&mut conn, &key).await.unwrap().parse().unwrap();
        assert!(
            word >= before + 1_000_000,
            "round {round}: word {word}, spent from before Redis's {before}"
        );
    }
}

#[tokio::test]
async fn idle_keys_vanish_when_full() {
    let l = limiter("vanish", quota(1000.0, 2)).await;
    let l = l.with_min_ttl(Duration::ZERO);
    let mut conn = raw(&url()).await;
    let key = l.bucket_key("k");
    assert!(l.allow_n("k", Now, 2).await);
    // Full again 2 ms later (on Redis's clock): the key expires by itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&mut conn, &key).await.is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(get(&mut conn, &key).await, None, "the idle key expired");
    assert_eq!(l.remaining("k", Now).await.unwrap(), 2);
}

#[tokio::test]
async fn redis_time_mode() {
    // One token per 1024 s: nothing refills during the test.
    let l = limiter("time", quota(1.0 / 1024.0, 3)).await;
    let mut conn = raw(&url()).await;
    assert_eq!(l.remaining("k", Now).await.unwrap(), 3);
    // Redis's clock before and after the first spend brackets the instant
    // the script read.
    let before = redis_time(&mut conn).await;
    assert_eq!(decided(l.check("k", Now, 2).await), Ok(1));
    let after = redis_time(&mut conn).await;
    assert!(l.allow("k", Now).await);
    assert!(!l.allow("k", Now).await);
    let denial = decided(l.check("k", Now, 1).await).unwrap_err();
    assert!(denial.retry_after().unwrap() > Duration::from_secs(1000));
    assert!(matches!(
        decided(l.check("k", Now, 4).await),
        Err(Denial::ExceedsCapacity { .. })
    ));
    assert_eq!(l.remaining("k", Now).await.unwrap(), 0);
    // The word is Unix time in ns from TIME, whose resolution is 1 us.
    let word: u64 = get(&mut conn, &l.bucket_key("k"))
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(word % 1000, 0, "TIME has microsecond resolution");
    // Spent 3 tokens of 1024 s each, from an empty bucket at the first
    // spend: full 3072 s after it, on Redis's clock (not this machine's).
    let full_at = Duration::from_nanos(word);
    let spent = Duration::from_secs(3072);
    assert!(
        before + spent <= full_at && full_at <= after + spent,
        "full at {full_at:?}, the first spend between {before:?} and {after:?}"
    );
}

/// Redis's `TIME`, since the Unix epoch.
async fn redis_time(conn: &mut MultiplexedConnection) -> Duration {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    Duration::from_secs(secs) + Duration::from_micros(micros)
}

/// On a server of its own: `SCRIPT FLUSH` on the shared one would take the
/// script from under every other test running on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_cache_flush_is_survived() {
    let server = tokio::task::block_in_place(PrivateServer::start);
    let l = RedisLimiter::connect(&server.url(), quota(1.0, 2))
        .await
        .expect("the fresh server answers")
        .with_timeout(TEST_TIMEOUT);
    let mut conn = raw(&server.url()).await;
    assert!(l.allow("k", 0.0).await);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // EVALSHA answers NOSCRIPT; the script is loaded again and run once.
    assert_eq!(decided(l.check("k", 0.0, 1).await), Ok(0));
    assert!(!l.allow("k", 0.0).await);
}

#[tokio::test]
async fn a_foreign_value_is_a_typed_script_error() {
    // An API key, in a bucket name that shows it (this suite's names are
    // `KeyNames::Encoded`): the error, which reaches logs, must not.
    const KEY: &str = "sk_live_f0reign5ecret";
    let l = limiter("foreign", quota(1.0, 2)).await;
    let mut conn = raw(&url()).await;
    let key = l.bucket_key(KEY);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("not a word")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The policy (closed by default) answers inside `check`: the failure.
    let err = failure(l.check(KEY, 0.0, 1).await);
    assert_eq!(err.kind(), RedisErrorKind::Script, "{err}");
    assert!(key.contains("f0reign5ecret"), "{key}");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(!shown.contains("f0reign5ecret"), "{shown}");
    }
    assert!(!l.allow(KEY, 0.0).await, "fail closed by default");
    let open = l.clone().with_failure_policy(FailurePolicy::Open);
    assert!(open.allow(KEY, 0.0).await, "fail open admits");
    assert!(open.check(KEY, 0.0, 1).await.unwrap().is_degraded());
    assert_eq!(
        get(&mut conn, &key).await.as_deref(),
        Some("not a word"),
        "nothing written"
    );
    // Cost 0 and remaining read the key too, and fail the same way
    // (remaining under either policy: it admits nothing).
    assert_eq!(
        failure(l.remaining(KEY, 0.0).await).kind(),
        RedisErrorKind::Script
    );
    assert_eq!(
        failure(open.remaining(KEY, 0.0).await).kind(),
        RedisErrorKind::Script
    );
}

/// `n` limiters on the test server, each over its own connection, sharing
/// one fresh prefix.
async fn pool(test: &str, quota: Quota, n: usize) -> Vec<RedisLimiter> {
    let url = url();
    let prefix = redis_support::unique_prefix(test);
    let mut limiters = Vec::new();
    for _ in 0..n {
        let l = RedisLimiter::connect(&url, quota)
            .await
            .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
            .with_namespace(prefix.clone(), keyrate::KeyNames::Encoded)
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(TEST_TIMEOUT);
        limiters.push(l);
    }
    limiters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_spends_admit_exactly_capacity() {
    const CAPACITY: u64 = 100;
    const TASKS: usize = 400;
    // At one caller instant; then at Redis's own time, with a rate too slow
    // to refill a token during the test.
    for server_time in [false, true] {
        let rate = if server_time { 1.0 / 86_400.0 } else { 1.0 };
        let limiters = pool("concurrent", quota(rate, CAPACITY), 4).await;
        let mut tasks = Vec::new();
        for i in 0..TASKS {
            let l = limiters[i % limiters.len()].clone();
            tasks.push(tokio::spawn(async move {
                if server_time {
                    l.check("hot", Now, 1).await
                } else {
                    l.check("hot", 42.0, 1).await
                }
            }));
        }
        let mut admitted = 0;
        for task in tasks {
            if decided(task.await.unwrap()).is_ok() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, CAPACITY, "server time: {server_time}");
        let left = if server_time {
            limiters[0].remaining("hot", Now).await.unwrap()
        } else {
            limiters[0].remaining("hot", 42.0).await.unwrap()
        };
        assert_eq!(left, 0);
    }
}

#[test]
fn blocking_threads_admit_exactly_capacity() {
    const CAPACITY: u64 = 100;
    let url = url();
    let prefix = redis_support::unique_prefix("blocking_threads");
    let admitted: u64 = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (url, prefix) = (&url, &prefix);
                scope.spawn(move || {
                    // Each thread its own limiter, so its own connection.
                    let l = BlockingRedisLimiter::connect_blocking(url, quota(1.0, CAPACITY))
                        .unwrap()
                        .with_namespace(prefix.clone(), keyrate::KeyNames::Encoded)
                        .with_min_ttl(Duration::from_secs(3600))
                        .with_timeout(TEST_TIMEOUT);
                    (0..50)
                        .filter(|_| decided(l.check("hot", 7.0, 1)).is_ok())
                        .count() as u64
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    assert_eq!(admitted, CAPACITY);
}

/// The server killed under the limiters, and started again on its port.
/// Calls whose outcome the test states exactly run with the patient
/// `TEST_TIMEOUT`, so a slow machine cannot turn them into failures (nor a
/// late reply into a call applied but reported failed); only the calls made
/// while the server is down use a short one, to fail fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted() {
    const DOWN_TIMEOUT: Duration = Duration::from_millis(500);
    let mut server = tokio::task::block_in_place(PrivateServer::start);
    let port = server.port();
    let url = server.url();

    let patient = RedisLimiter::connect(&url, quota(1.0, 5))
        .await
        .expect("the fresh server answers")
        .with_timeout(TEST_TIMEOUT)
        .with_min_ttl(Duration::from_secs(3600));
    let patient_open = patient.clone().with_failure_policy(FailurePolicy::Open);
    // Clones share the connection and the mirror.
    let closed = patient.clone().with_timeout(DOWN_TIMEOUT);
    let open = closed.clone().with_failure_policy(FailurePolicy::Open);
    assert_eq!(decided(patient.check("k", 0.0, 1).await), Ok(4));
    let blocking = tokio::task::block_in_place(|| {
        let blocking = BlockingRedisLimiter::connect_blocking(&url, quota(1.0, 5))
            .expect("the fresh server answers")
            .with_timeout(TEST_TIMEOUT)
            .with_min_ttl(Duration::from_secs(3600));
        assert_eq!(decided(blocking.check("b", 0.0, 1)), Ok(4));
        blocking.with_timeout(DOWN_TIMEOUT)
    });

    // Empty "m": the next call at the same instant is denied by the local
    // deny mirror, with no round trip.
    for left in (0..5).rev() {
        assert_eq!(decided(patient.check("m", 0.0, 1).await), Ok(left));
    }

    server.kill();
    // A local denial needs no Redis: it stays a denial while Redis is down,
    // even failing open.
    assert!(matches!(
        open.check("m", 0.0, 1).await,
        Err(RedisDenial::Denied(Denial::InsufficientTokens { .. }))
    ));
    assert!(
        !open.allow("m", 0.0).await,
        "the mirror denies, policy or not"
    );
    // While it is down: typed errors, never a panic, and the policies.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = None;
    while seen.is_none() && Instant::now() < deadline {
        match closed.check("k", 0.0, 1).await {
            Err(RedisDenial::Failed(err)) => seen = Some(err.kind()),
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let kind = seen.expect("an error while the server is down");
    assert!(
        matches!(kind, RedisErrorKind::Unavailable | RedisErrorKind::Timeout),
        "{kind:?}"
    );
    assert!(!closed.allow("k", 0.0).await, "fail closed");
    assert!(open.allow("k", 0.0).await, "fail open");
    assert!(open.check("k", 0.0, 1).await.unwrap().is_degraded());
    assert!(closed.remaining("k", 0.0).await.is_err());
    let blocking = tokio::task::block_in_place(|| {
        let err = failure(blocking.check("b", 0.0, 1));
        assert!(
            matches!(
                err.kind(),
                RedisErrorKind::Unavailable | RedisErrorKind::Timeout
            ),
            "{err}"
        );
        assert!(!blocking.allow("b", 0.0), "fail closed");
        blocking.with_timeout(TEST_TIMEOUT)
    });

    // Back on the same port: the manager reconnects by itself. The new
    // server kept no data, so the bucket starts full again. (Should another
    // process have taken the port meanwhile, the test says so.)
    let _server = tokio::task::block_in_place(|| PrivateServer::start_on(port))
        .unwrap_or_else(|| panic!("port {port} was taken while the server was down"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut back = None;
    while back.is_none() && Instant::now() < deadline {
        match patient.check("k", 0.0, 1).await {
            Err(RedisDenial::Failed(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            answer => back = Some(decided(answer)),
        }
    }
    assert_eq!(back, Some(Ok(4)), "works again after the restart");
    assert_eq!(decided(patient_open.check("k", 0.0, 1).await), Ok(3));
    // The blocking limiter reconnects on its next call.
    tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut back = None;
        while back.is_none() && Instant::now() < deadline {
            match blocking.check("b", 0.0, 1) {
                Err(RedisDenial::Failed(_)) => std::thread::sleep(Duration::from_millis(50)),
                answer => back = Some(decided(answer)),
            }
        }
        assert_eq!(back, Some(Ok(4)), "blocking works again after the restart");
    });
}

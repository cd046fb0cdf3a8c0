//! Redis down or slow: one deadline per call (the wait for calls in
//! flight on the key and the round trip together), and the circuit
//! breaker that fails calls fast while Redis is known to be down.
//!
//! The deadline and the breaker's counts run over a connection of the
//! test's own (no Redis) under tokio's paused clock, so they are exact;
//! one test kills a throwaway `redis-server` (`KEYRATE_REDIS_SERVER_BIN`,
//! or the one on `PATH`) under traffic and restarts it on the same port.
//! The ignored `outage_recovery_time` is a measurement, not a test: it
//! prints times and checks nothing (`cargo test --features redis --test
//! redis_outage -- --ignored --nocapture`).
#![cfg(not(loom))]

mod common;
mod redis_support;

use common::sync::PATIENCE;
use redis_support::PrivateServer;

use keyrate::{AsyncLimiter, FailurePolicy, Quota, RedisDenial, RedisErrorKind, RedisLimiter};
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the test's connection does with a command.
const HANG: u8 = 0;
const REFUSE: u8 = 1;
const ANSWER: u8 = 2;

/// A connection that hangs, refuses or answers every script call as a
/// fresh bucket would (admitted, the word read empty), and counts them.
#[derive(Clone, Default)]
struct Fake {
    mode: Arc<AtomicU8>,
    calls: Arc<AtomicU64>,
}

impl Fake {
    fn new(mode: u8) -> Self {
        let fake = Fake::default();
        fake.mode.store(mode, Relaxed);
        fake
    }

    fn calls(&self) -> u64 {
        self.calls.load(Relaxed)
    }
}

impl ConnectionLike for Fake {
    fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
        self.calls.fetch_add(1, Relaxed);
        match self.mode.load(Relaxed) {
            HANG => Box::pin(std::future::pending()),
            REFUSE => Box::pin(async {
                Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
            }),
            _ => Box::pin(async {
                Ok(Value::Array(vec![
                    Value::Int(1),
                    Value::BulkString(Vec::new()),
                    Value::Int(0),
                    Value::Int(0),
                ]))
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a Pipeline,
        _: usize,
        _: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        unimplemented!("the limiter sends no pipeline")
    }

    fn get_db(&self) -> i64 {
        0
    }
}

const TIMEOUT: Duration = Duration::from_millis(300);

fn quota() -> Quota {
    Quota::new(1.0, 1).unwrap()
}

/// A call that waits for a call in flight on its key, which never lands,
/// fails at its one deadline: it does not then start a round trip of its
/// own with a fresh timeout (which made it wait twice the deadline).
#[tokio::test(start_paused = true)]
async fn a_coalesced_call_keeps_one_deadline() {
    let fake = Fake::new(HANG);
    let limiter = RedisLimiter::with_connection(fake.clone(), quota())
        .with_timeout(TIMEOUT)
        .with_circuit_breaker(0, Duration::ZERO);
    let started = tokio::time::Instant::now();
    // Capacity 1: the first call is in flight with the key's only token,
    // so the second waits for it.
    let (first, second) = tokio::join!(limiter.check("k", 0.0, 1), async {
        tokio::task::yield_now().await;
        let answer = limiter.check("k", 0.0, 1).await;
        (answer, started.elapsed())
    });
    let err = match first {
        Err(RedisDenial::Failed(err)) => err,
        other => panic!("expected a timeout, got {other:?}"),
    };
    assert_eq!(err.kind(), RedisErrorKind::Timeout);
    let (answer, waited) = second;
    match answer {
        Err(RedisDenial::Failed(err)) => assert_eq!(err.kind(), RedisErrorKind::Timeout),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // tokio's paused clock: exact, whatever the machine's load.
    assert_eq!(
        waited, TIMEOUT,
        "one deadline for the wait and the round trip"
    );
    assert_eq!(fake.calls(), 1, "the waiting call made no round trip");
}

/// Consecutive failures open the breaker: later calls are decided by the
/// failure policy without a round trip, until a probe finds Redis back.
#[tokio::test(start_paused = true)]
async fn the_breaker_fails_fast_and_probes() {
    let fake = Fake::new(REFUSE);
    let probe_every = Duration::from_millis(50);
    let closed = RedisLimiter::with_connection(fake.clone(), quota())
        .with_timeout(TIMEOUT)
        .with_mirror_capacity(0)
        .with_circuit_breaker(3, probe_every);
    let open = closed.clone().with_failure_policy(FailurePolicy::Open);
    for i in 0..100 {
        let err = match closed.check(&format!("k{i}"), 0.0, 1).await {
            Err(RedisDenial::Failed(err)) => err,
            other => panic!("expected a failure, got {other:?}"),
        };
        assert_eq!(err.kind(), RedisErrorKind::Unavailable);
        assert_eq!(err.is_circuit_open(), i >= 3, "call {i}");
    }
    assert!(open.allow("k", 0.0).await, "fail open, fast");
    assert!(open.check("k", 0.0, 1).await.unwrap().is_degraded());
    assert!(closed.remaining("k", 0.0).await.is_err());
    assert_eq!(fake.calls(), 3, "3 round trips, then none");
    let stats = closed.circuit_stats();
    assert!(stats.open);
    assert_eq!(
        (stats.trips, stats.fast_failures, stats.probes),
        (1, 100, 0)
    );
    assert_eq!(
        closed.stats().backend_errors,
        103,
        "fast failures count as backend errors"
    );

    // Redis answers again; the next call after the probe interval is the
    // probe, and closes the breaker.
    fake.mode.store(ANSWER, Relaxed);
    tokio::time::advance(probe_every).await;
    assert!(
        closed.allow("k", 0.0).await,
        "the probe is decided by Redis"
    );
    assert_eq!(fake.calls(), 4);
    let stats = closed.circuit_stats();
    assert!(!stats.open);
    assert_eq!(stats.probes, 1);
    assert!(closed.allow("other", 0.0).await);
    assert_eq!(fake.calls(), 5);
}

/// The same port again, after the server there was killed.
fn restart(port: u16) -> PrivateServer {
    PrivateServer::start_on(port).expect("the killed server's port is free again")
}

/// Waits until the server at `url` answers `PING`, for at most a minute.
async fn until_ping(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(mut conn) = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
        {
            let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
            if pong.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no redis-server answered at {url}");
}

/// Traffic on `limiter`: 8 tasks calling in a loop, counting admissions
/// in `admitted`, until [`Traffic::stop`].
struct Traffic {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    fn start(limiter: &RedisLimiter, admitted: &Arc<AtomicU64>) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..8)
            .map(|t| {
                let (limiter, stop, admitted) = (limiter.clone(), stop.clone(), admitted.clone());
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Relaxed) {
                        if limiter
                            .allow(&format!("t{t}:{}", i % 100), keyrate::Now)
                            .await
                        {
                            admitted.fetch_add(1, Relaxed);
                        }
                        i += 1;
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        Traffic { stop, tasks }
    }

    /// Stops the tasks and waits until none is left in a call.
    async fn stop(self) {
        self.stop.store(true, Relaxed);
        for task in self.tasks {
            tokio::time::timeout(PATIENCE, task)
                .await
                .unwrap_or_else(|_| panic!("a traffic task still ran {PATIENCE:?} after the stop"))
                .expect("a traffic task panicked");
        }
    }
}

/// Waits until `admitted` reaches `count`, for at most [`PATIENCE`].
async fn until_admitted(admitted: &AtomicU64, count: u64, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while admitted.load(Relaxed) < count {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {count} admissions in {PATIENCE:?}",
            admitted.load(Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A real outage: redis-server killed under traffic, then restarted on the
/// same port. While it is down, calls fail fast: once the breaker opens,
/// only its probes (one per probe interval) make round trips. Afterwards
/// calls are admitted again. Counts, not wall time, are asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_costs_calls_no_round_trip() {
    let mut server = PrivateServer::start();
    let (port, url) = (server.port(), server.url());
    until_ping(&url).await;
    let probe_every = Duration::from_millis(50);
    let limiter = RedisLimiter::connect(&url, Quota::new(1e6, 1 << 40).unwrap())
        .await
        .expect("the fresh server answers")
        .with_timeout(Duration::from_secs(5))
        .with_circuit_breaker(3, probe_every);

    let admitted = Arc::new(AtomicU64::new(0));
    let traffic = Traffic::start(&limiter, &admitted);
    until_admitted(&admitted, 100, "before the kill").await;

    server.kill();
    // Wait for the breaker to open under the traffic.
    let deadline = Instant::now() + PATIENCE;
    while !limiter.circuit_stats().open {
        assert!(Instant::now() < deadline, "the breaker never opened");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The traffic shares the breaker and the counters: stopped (no call
    // of it left in flight) before the count, the counts below are the
    // measured calls' own. Nothing can close the breaker meanwhile: only
    // an answer from Redis does.
    traffic.stop().await;
    assert!(limiter.circuit_stats().open);
    // Down: calls made now fail at once. Count them, and the round trips.
    let (before, started) = (limiter.circuit_stats(), Instant::now());
    let errors_before = limiter.stats().backend_errors;
    let mut failed = 0u64;
    for i in 0..2000 {
        match limiter.check(&format!("down{i}"), keyrate::Now, 1).await {
            Err(RedisDenial::Failed(_)) => failed += 1,
            other => panic!("Redis is down: {other:?}"),
        }
    }
    let (after, elapsed) = (limiter.circuit_stats(), started.elapsed());
    assert_eq!(failed, 2000);
    let probes = after.probes - before.probes;
    let fast = after.fast_failures - before.fast_failures;
    // With the breaker open, `admit` lets each call through as the probe
    // or fails it fast: nothing else.
    assert_eq!(
        fast + probes,
        2000,
        "{fast} fast failures, {probes} probes: a call went to Redis uncounted"
    );
    // One call at a time: each probe fails, and the next may come only a
    // probe interval after it, so the k-th probe came at least (k - 1)
    // intervals after the count began. A bound from the time the calls
    // took, so a slow machine only loosens it.
    let interval_ms = probe_every.as_millis() as u64;
    assert!(
        probes <= elapsed.as_millis() as u64 / interval_ms + 1,
        "{probes} probes in {elapsed:?}"
    );
    assert_eq!(
        after.trips, before.trips,
        "the breaker closed and opened again, with Redis down"
    );
    assert_eq!(
        limiter.stats().backend_errors - errors_before,
        2000,
        "each failed call is one backend error, fast or not"
    );

    // Back on the same port: admissions resume.
    let _server = restart(port);
    until_ping(&url).await;
    let resumed = admitted.load(Relaxed);
    let traffic = Traffic::start(&limiter, &admitted);
    let deadline = Instant::now() + PATIENCE;
    while limiter.circuit_stats().open {
        assert!(Instant::now() < deadline, "the breaker never closed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    until_admitted(&admitted, resumed + 100, "after the restart").await;
    assert!(limiter.check("after", keyrate::Now, 1).await.is_ok());
    traffic.stop().await;
}

/// A measurement, not a test: it checks nothing and prints how long
/// calls take while Redis is down, and how long after a restarted Redis
/// answers `PING` the first admission comes, under traffic, with the
/// default settings (`RedisLimiter::connect`, 1 s timeout, the default
/// breaker). Ignored, so the suite never runs it; BENCHMARKS.md and
/// docs/redis.md quote what it prints (`cargo test --all-features --test
/// redis_outage -- --ignored --nocapture`). It lives here, beside the
/// outage test, for `PrivateServer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn outage_recovery_time() {
    let mut server = PrivateServer::start();
    let (port, url) = (server.port(), server.url());
    until_ping(&url).await;
    let limiter = RedisLimiter::connect(&url, Quota::new(1e6, 1 << 40).unwrap())
        .await
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The latest admission, in nanoseconds since `origin`, and the
    // slowest failed call so far, in microseconds.
    let last_admitted = Arc::new(AtomicU64::new(0));
    let slowest_failure = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let origin = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let limiter = limiter.clone();
            let (stop, last, slowest, failures) = (
                stop.clone(),
                last_admitted.clone(),
                slowest_failure.clone(),
                failures.clone(),
            );
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let started = Instant::now();
                    match limiter
                        .check(&format!("t{t}:{}", i % 100), keyrate::Now, 1)
                        .await
                    {
                        Ok(_) => last.store(origin.elapsed().as_nanos() as u64, Relaxed),
                        Err(_) => {
                            failures.fetch_add(1, Relaxed);
                            slowest.fetch_max(started.elapsed().as_micros() as u64, Relaxed);
                        }
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill();
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let down_failures = failures.load(Relaxed);
    let _server = restart(port);
    until_ping(&url).await;
    let answering = origin.elapsed().as_nanos() as u64;
    let restarted_after = killed.elapsed();
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(
            Instant::now() < deadline,
            "no admission within {PATIENCE:?} of the restarted server answering PING"
        );
        let last = last_admitted.load(Relaxed);
        if last > answering {
            println!(
                "killed, restarted after {restarted_after:?}; {down_failures} calls failed \
                 while down, the slowest in {} us; first admission {:?} after the restarted \
                 server answered PING",
                slowest_failure.load(Relaxed),
                Duration::from_nanos(last - answering)
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop.store(true, Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
}

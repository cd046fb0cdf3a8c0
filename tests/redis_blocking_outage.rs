//! The blocking limiter with Redis slow, silent or down: its calls fail with
//! the timeout error at their deadline, and its circuit breaker fails them
//! fast while Redis is known to be down, then closes when a probe finds
//! Redis back.
//!
//! That the deadline is one per call (each socket operation gets the time
//! left) is unit-tested in `src/redis/deadline.rs`, where the time is an
//! argument; these tests assert kinds and counts, never elapsed time. Each
//! runs against a throwaway `redis-server` of its own
//! (`KEYRATE_REDIS_SERVER_BIN`, or the one on `PATH`) or a listener of its
//! own.
#![cfg(not(loom))]

mod redis_support;

use redis_support::PrivateServer;

use keyrate::{BlockingRedisLimiter, Limiter, Quota, RedisDenial, RedisErrorKind};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_millis(200);

/// Far longer than any test: a breaker that never probes during one.
const NO_PROBE: Duration = Duration::from_secs(3600);

fn quota() -> Quota {
    Quota::new(1e6, 1 << 40).unwrap()
}

/// The failure of a check that Redis did not decide.
fn failure(limiter: &BlockingRedisLimiter, key: &str) -> keyrate::RedisLimiterError {
    match limiter.check(key, keyrate::Now, 1) {
        Err(RedisDenial::Failed(err)) => err,
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// A listener that takes connections (the kernel completes the handshake)
/// and never answers: connecting fails with the timeout error, which says
/// so, not with a hang or a connection error.
#[test]
fn a_server_that_never_answers_times_out() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let err = BlockingRedisLimiter::connect_blocking(&url, quota()).unwrap_err();
    assert_eq!(err.kind(), RedisErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{:?}", keyrate::DEFAULT_REDIS_TIMEOUT)),
        "{err}"
    );
}

/// A connected limiter whose Redis stops answering (`CLIENT PAUSE ... ALL`:
/// it takes commands and answers none): each call fails with the timeout
/// error, the first on its open connection, the next ones on the connect
/// that follows it; after the breaker's threshold the calls fail fast,
/// with no round trip.
#[test]
fn a_paused_server_times_calls_out_then_the_breaker_fails_them_fast() {
    let server = PrivateServer::start();
    let limiter = BlockingRedisLimiter::connect_blocking(&server.url(), quota())
        .expect("the fresh server answers")
        .with_timeout(TIMEOUT)
        .with_circuit_breaker(3, NO_PROBE);
    // No call before the pause: under the short deadline a loaded machine
    // could time it out.

    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(600_000)
        .arg("ALL")
        .query(&mut admin)
        .expect("CLIENT PAUSE");

    for call in 0..3 {
        let err = failure(&limiter, "k");
        assert_eq!(err.kind(), RedisErrorKind::Timeout, "call {call}: {err}");
        assert!(!err.is_circuit_open(), "call {call}");
        assert!(err.to_string().contains("timed out"), "{err}");
        assert!(err.to_string().contains("200ms"), "{err}");
    }
    assert!(limiter.circuit_stats().open, "3 timeouts in a row open it");
    for call in 0..10 {
        let err = failure(&limiter, "k");
        assert_eq!(err.kind(), RedisErrorKind::Unavailable, "{err}");
        assert!(err.is_circuit_open(), "fast failure {call}: {err}");
    }
    assert!(!limiter.allow("k", keyrate::Now), "fails closed, fast");
    let stats = limiter.circuit_stats();
    assert_eq!((stats.trips, stats.fast_failures, stats.probes), (1, 11, 0));
    assert_eq!(limiter.stats().backend_errors, 14);
}

/// Redis killed: calls fail (`Unavailable`) until the breaker opens, then
/// fast; restarted on the same port, the next probe closes the breaker and
/// the limiter decides again.
#[test]
fn a_killed_server_opens_the_breaker_and_a_probe_closes_it() {
    let mut server = PrivateServer::start();
    let (port, url) = (server.port(), server.url());
    // Probes never, to see the fast failures; probes at every call once
    // open, to see the recovery without waiting for a probe interval.
    let never = BlockingRedisLimiter::connect_blocking(&url, quota())
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_circuit_breaker(3, NO_PROBE);
    let always = BlockingRedisLimiter::connect_blocking(&url, quota())
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_circuit_breaker(3, Duration::ZERO);
    assert!(never.allow("k", keyrate::Now) && always.allow("k", keyrate::Now));

    server.kill();
    for limiter in [&never, &always] {
        for call in 0..3 {
            let err = failure(limiter, "k");
            assert_eq!(err.kind(), RedisErrorKind::Unavailable, "{call}: {err}");
            assert!(!err.is_circuit_open(), "{call}: {err}");
        }
        assert!(limiter.circuit_stats().open);
    }
    for _ in 0..5 {
        assert!(failure(&never, "k").is_circuit_open());
    }

    let _server = PrivateServer::start_on(port).expect("the killed server's port is free again");
    assert!(
        failure(&never, "k").is_circuit_open(),
        "no probe: still open"
    );
    assert!(
        always.allow("k", keyrate::Now),
        "the probe is decided by Redis"
    );
    let stats = always.circuit_stats();
    assert!(!stats.open);
    assert_eq!((stats.trips, stats.probes), (1, 1));
    assert!(always.allow("other", keyrate::Now));
    assert_eq!(never.circuit_stats().fast_failures, 6);
}

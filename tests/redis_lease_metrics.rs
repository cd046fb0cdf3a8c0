//! A `RedisConcurrencyLimiter` in the Prometheus exposition: permits held,
//! acquired, refused, failed (and degraded), renewals and leases lost, each
//! series the value `stats()` reads, beside an in-memory limiter whose own
//! series (keys) the Redis one does not have. On a private Redis
//! server of its own (it is killed midway), in a namespace of its own.
#![cfg(not(loom))]

mod lease_support;
mod redis_support;

use keyrate::prometheus::Metrics;
use keyrate::{ConcurrencyLimiter, FailurePolicy, RedisConcurrencyDenial, RedisConcurrencyStats};
use lease_support::{at_limit, limiter, until};
use redis_support::{raw, unique_prefix, PrivateServer};
use std::sync::Arc;
use std::time::Duration;

/// The value of the series `series` (name and labels, exactly) in `text`,
/// or `None` if it is not there.
fn value(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{series} = {v}")))
}

/// Checks that `series` is in `text` with a value between the counts read
/// before and after the scrape (renewals go on meanwhile).
fn between(
    text: &str,
    series: &str,
    read: fn(&RedisConcurrencyStats) -> u64,
    before: &RedisConcurrencyStats,
    after: &RedisConcurrencyStats,
) {
    let got = value(text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    assert!(
        read(before) <= got && got <= read(after),
        "{series} = {got}, stats {}..{}",
        read(before),
        read(after)
    );
}

#[tokio::test]
async fn redis_leases_are_exposed_with_what_redis_measures() {
    let mut server = PrivateServer::start();
    let url = server.url();
    let namespace = unique_prefix("leases-metrics");
    let closed = limiter(&url, &namespace, 2, Duration::from_secs(3))
        .await
        .with_timeout(Duration::from_secs(2))
        .with_circuit_breaker(0, Duration::from_millis(50));
    let open = closed.clone().with_failure_policy(FailurePolicy::Open);
    let memory = Arc::new(ConcurrencyLimiter::new(1));
    let metrics = Metrics::new()
        .concurrency("leases", Arc::new(closed.clone()))
        .concurrency("memory", memory.clone());
    let _mem = memory.try_acquire("sk_live_memory").unwrap();

    let held = [
        closed.try_acquire("sk_live_secret").await.unwrap(),
        closed.try_acquire("sk_live_secret").await.unwrap(),
    ];
    assert_eq!(at_limit(closed.try_acquire("sk_live_secret").await), (2, 2));
    // Lost behind the limiter's back.
    let mut conn = raw(&url).await;
    let _: () = redis::cmd("DEL")
        .arg(closed.lease_key("sk_live_secret"))
        .query_async(&mut conn)
        .await
        .unwrap();
    until("a renewal finds both leases lost", || async {
        closed.stats().leases_lost == 2
    })
    .await;
    // Redis down: the closed limiter fails, the open one degrades.
    server.kill();
    assert!(matches!(
        closed.try_acquire("other").await,
        Err(RedisConcurrencyDenial::Failed(_))
    ));
    assert!(open.try_acquire("other").await.unwrap().is_degraded());

    let before = closed.stats();
    let text = metrics.render();
    let after = closed.stats();
    let l = r#"{limiter="leases"}"#;
    let s = |name: &str| format!("keyrate_concurrency_{name}{l}");
    assert_eq!((before.acquired, before.refused_at_limit), (2, 1));
    assert_eq!(
        (before.failed, before.degraded, before.leases_lost),
        (2, 1, 2)
    );
    assert!(before.renew_rounds >= 1 && before.renew_calls >= 1);
    between(&text, &s("in_flight"), |s| s.held, &before, &after);
    between(&text, &s("acquired_total"), |s| s.acquired, &before, &after);
    between(
        &text,
        r#"keyrate_concurrency_refused_total{limiter="leases",reason="at_limit"}"#,
        |s| s.refused_at_limit,
        &before,
        &after,
    );
    between(&text, &s("failed_total"), |s| s.failed, &before, &after);
    between(&text, &s("degraded_total"), |s| s.degraded, &before, &after);
    between(
        &text,
        &s("leases_lost_total"),
        |s| s.leases_lost,
        &before,
        &after,
    );
    between(
        &text,
        &s("renew_rounds_total"),
        |s| s.renew_rounds,
        &before,
        &after,
    );
    between(
        &text,
        &s("renew_calls_total"),
        |s| s.renew_calls,
        &before,
        &after,
    );
    between(
        &text,
        &s("renew_failures_total"),
        |s| s.renew_failures,
        &before,
        &after,
    );
    between(
        &text,
        &s("release_failures_total"),
        |s| s.release_failures,
        &before,
        &after,
    );
    // What Redis does not measure here is not exported for it...
    assert_eq!(value(&text, &s("keys")), None);
    assert_eq!(value(&text, &s("waiting")), Some(0));
    assert!(!text.contains(r#"limiter="leases",reason="limiter_full""#));
    // ...and the in-memory limiter keeps its own series, none of Redis's.
    let m = |name: &str| format!(r#"keyrate_concurrency_{name}{{limiter="memory"}}"#);
    assert_eq!(value(&text, &m("in_flight")), Some(1));
    assert_eq!(value(&text, &m("keys")), Some(1));
    assert_eq!(value(&text, &m("waiting")), Some(0));
    assert_eq!(value(&text, &m("leases_lost_total")), None);
    assert_eq!(value(&text, &m("failed_total")), None);
    // No key is named.
    assert!(!text.contains("sk_live"), "{text}");
    drop(held);
}

//! `RedisConcurrencyLimiter::acquire`: waiting for a permit on a real
//! Redis (`KEYRATE_REDIS_URL`) by polling. A waiter is served when a
//! permit comes back; a wait that ends empty is one `TimedOut` (its polls
//! are not counted as refusals); this process's waiters for a key are
//! served in arrival order; a cancelled wait leaves its place. Each test
//! in its own namespace; counts and orders only: the waits are long
//! (a minute) where a test expects a permit, short where it expects none.
#![cfg(not(loom))]

mod lease_support;
mod redis_support;

use keyrate::{ConcurrencyDenial, RedisConcurrencyLimiter};
use lease_support::{limiter, until};
use redis_support::{unique_prefix, url};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(15);

async fn setup(test: &str) -> RedisConcurrencyLimiter {
    limiter(&url(), &unique_prefix(test), 1, LEASE).await
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiter_gets_the_permit_given_back() {
    let limiter = setup("wait-served").await;
    let held = limiter.try_acquire("k").await.unwrap();
    let other = limiter.clone();
    let waiter = tokio::spawn(async move { other.acquire("k", LONG).await });
    until("the waiter waits", || async {
        limiter.stats().waiting == 1
    })
    .await;
    assert!(!waiter.is_finished());
    drop(held);
    let permit = waiter.await.unwrap().expect("served within the wait");
    assert!(!permit.is_degraded());
    assert_eq!(limiter.held("k").await.unwrap(), 1);
    let stats = limiter.stats();
    assert_eq!((stats.acquired, stats.waiting, stats.timed_out), (2, 0, 0));
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_that_ends_empty_is_one_timeout() {
    let limiter = setup("wait-timeout").await;
    let _held = limiter.try_acquire("k").await.unwrap();
    let denial = limiter
        .acquire("k", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(
        denial.denial(),
        Some(&ConcurrencyDenial::TimedOut {
            held: 1,
            max: 1,
            waited: Duration::from_millis(300)
        })
    );
    let stats = limiter.stats();
    // Several polls, one refusal counted, as a timeout.
    assert_eq!((stats.timed_out, stats.refused_at_limit), (1, 0));
    assert_eq!(stats.waiting, 0);
    // No wait: one try, an AtLimit; a limit of 0 refuses at once.
    let at_limit = limiter.acquire("k", Duration::ZERO).await.unwrap_err();
    assert_eq!(
        at_limit.denial(),
        Some(&ConcurrencyDenial::AtLimit { held: 1, max: 1 })
    );
    let suspended = limiter.acquire_under("k", 0, LONG).await.unwrap_err();
    assert_eq!(
        suspended.denial(),
        Some(&ConcurrencyDenial::AtLimit { held: 0, max: 0 })
    );
}

/// One runtime thread: a spawned waiter runs until its first round trip
/// before the test goes on, so it has its place in the key's queue when
/// the gauge counts it.
#[tokio::test(flavor = "current_thread")]
async fn this_process_waiters_are_served_first_come_first_served() {
    let limiter = setup("wait-fifo").await;
    let held = limiter.try_acquire("k").await.unwrap();
    let mut waiters = Vec::new();
    for n in 1..=3u64 {
        let other = limiter.clone();
        waiters.push(tokio::spawn(async move { other.acquire("k", LONG).await }));
        until("the waiter queues", || async {
            limiter.stats().waiting == n
        })
        .await;
    }
    // A cancelled waiter (the second) leaves its place to the next.
    waiters.remove(1).abort();
    until("the cancelled waiter leaves", || async {
        limiter.stats().waiting == 2
    })
    .await;
    drop(held);
    for (i, waiter) in waiters.into_iter().enumerate() {
        let permit = waiter.await.unwrap().expect("served within the wait");
        // Served in order: the ones behind still wait.
        assert_eq!(limiter.stats().waiting, 1 - i as u64);
        assert_eq!(limiter.held("k").await.unwrap(), 1);
        drop(permit);
    }
    until("the last permit is released", || async {
        limiter.held("k").await.unwrap() == 0
    })
    .await;
}

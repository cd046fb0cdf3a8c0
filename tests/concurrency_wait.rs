//! Waiting for a concurrency permit: first come first served, timeouts and
//! cancellation. tokio's clock is paused: no wall-clock thresholds.
#![cfg(not(loom))]

mod common;

use common::sync::PATIENCE;
use keyrate::{ConcurrencyDenial, ConcurrencyLimiter};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(3600);

/// Yields until `limiter` has `n` callers waiting, failing the test after
/// [`PATIENCE`] of real time (tokio's clock is paused, and does not move
/// while tasks yield).
async fn until_waiting(limiter: &ConcurrencyLimiter, n: u64) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while limiter.stats().waiting != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} callers waiting, not {n}, after {PATIENCE:?}",
            limiter.stats().waiting
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_and_not_overtaken() {
    let limiter = Arc::new(ConcurrencyLimiter::new(1));
    let held = limiter.try_acquire("k").unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let (limiter2, order) = (Arc::clone(&limiter), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let permit = limiter2.acquire("k", LONG).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::task::yield_now().await; // hold it across a yield
            drop(permit);
        }));
        until_waiting(&limiter, i + 1).await;
    }
    // Queued waiters are never overtaken by an immediate call.
    assert_eq!(
        limiter.try_acquire("k").unwrap_err(),
        ConcurrencyDenial::AtLimit { held: 1, max: 1 }
    );
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(limiter.held("k"), 0);
    assert_eq!(limiter.stats().acquired, 5);
}

#[tokio::test(start_paused = true)]
async fn a_wait_times_out_holding_nothing() {
    let limiter = ConcurrencyLimiter::new(1);
    let held = limiter.try_acquire("k").unwrap();
    let started = tokio::time::Instant::now();
    let refused = limiter.acquire("k", Duration::from_secs(10)).await;
    assert_eq!(
        refused.unwrap_err(),
        ConcurrencyDenial::TimedOut {
            held: 1,
            max: 1,
            waited: Duration::from_secs(10)
        }
    );
    assert_eq!(started.elapsed(), Duration::from_secs(10)); // the paused clock
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.timed_out), (0, 1));
    drop(held);
    // The queue emptied: an immediate call is served again.
    let _p = limiter.try_acquire("k").unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_loses_nobody_their_place() {
    let limiter = Arc::new(ConcurrencyLimiter::new(1));
    let held = limiter.try_acquire("k").unwrap();
    let first = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire("k", LONG).await.map(drop) })
    };
    until_waiting(&limiter, 1).await;
    let second = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire("k", LONG).await.map(drop) })
    };
    until_waiting(&limiter, 2).await;
    first.abort(); // its future is dropped: it leaves the queue
    until_waiting(&limiter, 1).await;
    drop(held);
    second.await.unwrap().unwrap();
    assert!(first.await.unwrap_err().is_cancelled());
    assert_eq!(limiter.held("k"), 0);
    assert_eq!(limiter.stats().waiting, 0);
}

/// A permit handed to a waiter whose future is dropped before it runs
/// goes on to the next waiter.
#[tokio::test(start_paused = true)]
async fn a_permit_handed_to_a_dropped_waiter_goes_to_the_next() {
    let limiter = Arc::new(ConcurrencyLimiter::new(1));
    let held = limiter.try_acquire("k").unwrap();
    let first = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire("k", LONG).await.map(drop) })
    };
    until_waiting(&limiter, 1).await;
    let second = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire("k", LONG).await.map(drop) })
    };
    until_waiting(&limiter, 2).await;
    // Handed to `first` (woken, not yet run on this one-thread runtime),
    // which is then dropped before it can take it.
    drop(held);
    assert_eq!(limiter.held("k"), 1);
    first.abort();
    second.await.unwrap().unwrap();
    assert!(first.await.unwrap_err().is_cancelled());
    assert_eq!(limiter.held("k"), 0);
    let _p = limiter.try_acquire("k").unwrap();
}

/// A future polled once (queued) and then dropped, without a task.
#[tokio::test(start_paused = true)]
async fn a_future_dropped_after_one_poll_leaves_the_queue() {
    let limiter = ConcurrencyLimiter::new(1);
    let held = limiter.try_acquire("k").unwrap();
    {
        let mut waiting = std::pin::pin!(limiter.acquire("k", LONG));
        let polled = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(waiting.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(polled);
        assert_eq!(limiter.stats().waiting, 1);
    }
    assert_eq!(limiter.stats().waiting, 0);
    drop(held);
    let _p = limiter.try_acquire("k").unwrap(); // not refused: nobody queued
}

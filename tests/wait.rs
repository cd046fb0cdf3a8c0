#![cfg(not(loom))]
//! Waiting until a cost can be admitted: exact sleeps, the maximum wait,
//! cancellation, contention; async on tokio's paused clock, and blocking.

use keyrate::{AsyncLimiter, Clock, Denial, Limiter, ManualClock, Now, TokenBucketLimiter};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A clock on tokio's time (paused in these tests) that counts its readings:
/// each attempt of a wait reads it exactly once.
#[derive(Debug, Clone)]
struct TokioClock {
    origin: Instant,
    reads: Arc<AtomicU64>,
}

impl TokioClock {
    fn new() -> Self {
        TokioClock {
            origin: Instant::now(),
            reads: Arc::default(),
        }
    }

    fn reads(&self) -> u64 {
        self.reads.load(Relaxed)
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.reads.fetch_add(1, Relaxed);
        self.origin.elapsed()
    }
}

fn limiter(rate: f64, capacity: u64) -> (TokenBucketLimiter, TokioClock) {
    let clock = TokioClock::new();
    let limiter = TokenBucketLimiter::new(rate, capacity).with_clock(clock.clone());
    (limiter, clock)
}

#[tokio::test(start_paused = true)]
async fn sleeps_exactly_the_retry_after_once() {
    let (limiter, clock) = limiter(4.0, 2); // a token every 250 ms
    assert_eq!(limiter.check("k", Now, 2).map(|d| d.remaining()), Ok(0));
    let start = Instant::now();
    let reads = clock.reads();
    assert_eq!(
        limiter
            .wait("k", 2, Duration::from_secs(10))
            .await
            .map(|d| d.remaining()),
        Ok(0)
    );
    // One denial, one sleep of exactly the reported 500 ms, one admission.
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(clock.reads() - reads, 2);
}

#[tokio::test(start_paused = true)]
async fn admits_at_once_without_sleeping() {
    let (limiter, clock) = limiter(1.0, 3);
    let start = Instant::now();
    assert_eq!(
        limiter
            .wait("k", 2, Duration::ZERO)
            .await
            .map(|d| d.remaining()),
        Ok(1)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(clock.reads(), 1);
}

#[tokio::test(start_paused = true)]
async fn returns_the_denial_at_once_when_the_wait_exceeds_max_wait() {
    let (limiter, _clock) = limiter(1.0, 1);
    assert_eq!(limiter.check("k", Now, 1).map(|d| d.remaining()), Ok(0));
    let start = Instant::now();
    let denial = limiter.wait("k", 1, Duration::from_millis(999)).await;
    assert_eq!(
        denial,
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_secs(1)
        })
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "no pointless sleep");
    // A maximum wait that covers the retry-after is enough.
    assert_eq!(
        limiter
            .wait("k", 1, Duration::from_secs(1))
            .await
            .map(|d| d.remaining()),
        Ok(0)
    );
}

#[tokio::test(start_paused = true)]
async fn never_waits_for_what_waiting_cannot_fix() {
    let (limiter, _clock) = limiter(1.0, 2);
    let start = Instant::now();
    assert_eq!(
        limiter.wait("k", 3, Duration::from_secs(3600)).await,
        Err(Denial::ExceedsCapacity {
            cost: 3,
            capacity: 2
        })
    );
    assert_eq!(
        limiter
            .bucket("k")
            .wait(&(), 3, Duration::from_secs(3600))
            .await,
        Err(Denial::ExceedsCapacity {
            cost: 3,
            capacity: 2
        })
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(limiter.remaining("k", Now), Ok(2));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_spends_nothing() {
    let (limiter, _clock) = limiter(1.0, 2);
    assert_eq!(limiter.check("k", Now, 2).map(|d| d.remaining()), Ok(0));
    // The wait needs 2 s; abandon it after 1.5 s, in the middle of its sleep.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(1500),
        limiter.wait("k", 2, Duration::from_secs(60)),
    )
    .await;
    assert!(abandoned.is_err(), "the timeout fired first");
    tokio::time::advance(Duration::from_millis(500)).await;
    // 2 s after the spend the bucket holds 2 again: nothing was taken.
    assert_eq!(limiter.remaining("k", Now), Ok(2));
    let handle = limiter.bucket("k");
    assert_eq!(handle.check(Now, 2).map(|d| d.remaining()), Ok(0));
    let abandoned = tokio::time::timeout(
        Duration::from_millis(10),
        handle.wait(&(), 1, Duration::MAX),
    )
    .await;
    assert!(abandoned.is_err());
    tokio::time::advance(Duration::from_millis(990)).await;
    assert_eq!(limiter.remaining("k", Now), Ok(1));
}

#[tokio::test(start_paused = true)]
async fn waiters_share_refills_in_turn() {
    let (limiter, _clock) = limiter(1.0, 1);
    assert_eq!(limiter.check("k", Now, 1).map(|d| d.remaining()), Ok(0));
    let start = Instant::now();
    let waiter = || async {
        let result = limiter.wait("k", 1, Duration::from_secs(10)).await;
        (result, start.elapsed())
    };
    let (a, b, c) = tokio::join!(waiter(), waiter(), waiter());
    let mut finished: Vec<_> = [a, b, c]
        .into_iter()
        .map(|(result, at)| {
            assert_eq!(result.map(|d| d.remaining()), Ok(0));
            at
        })
        .collect();
    finished.sort();
    // One token a second: each waiter gets its own, one after the other.
    let expected: Vec<_> = (1..=3).map(Duration::from_secs).collect();
    assert_eq!(finished, expected);
}

#[tokio::test(start_paused = true)]
async fn gives_up_when_another_caller_took_the_refill() {
    let clock = ManualClock::new();
    let limiter = TokenBucketLimiter::new(1.0, 1).with_clock(clock.clone());
    assert_eq!(limiter.check("k", Now, 1).map(|d| d.remaining()), Ok(0));
    let start = Instant::now();
    // The patient caller may wait 1.5 s; it sleeps the reported 1 s.
    let patient = limiter.wait("k", 1, Duration::from_millis(1500));
    // Meanwhile the refill arrives and another caller takes it.
    let thief = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        clock.advance(Duration::from_secs(1));
        assert_eq!(limiter.check("k", Now, 1).map(|d| d.remaining()), Ok(0));
    };
    let (patient, ()) = tokio::join!(patient, thief);
    // On waking it tries again, is told 1 s more, and with 0.5 s left it
    // gives up at once with that denial.
    assert_eq!(
        patient,
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_secs(1)
        })
    );
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn handles_wait_on_the_shared_bucket() {
    let (limiter, clock) = limiter(10.0, 5); // a token every 100 ms
    let handle = limiter.bucket("k");
    assert_eq!(limiter.check("k", Now, 5).map(|d| d.remaining()), Ok(0));
    let start = Instant::now();
    let reads = clock.reads();
    assert_eq!(
        handle
            .wait(&(), 3, Duration::from_secs(1))
            .await
            .map(|d| d.remaining()),
        Ok(0)
    );
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(clock.reads() - reads, 2);
}

#[test]
fn wait_futures_are_send() {
    fn send<T: Send>(value: T) -> T {
        value
    }
    let limiter = TokenBucketLimiter::new(1.0, 1).with_clock(ManualClock::new());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let keyed = send(limiter.wait("k", 1, Duration::ZERO));
    assert_eq!(runtime.block_on(keyed).map(|d| d.remaining()), Ok(0));
    let handle = limiter.bucket("k");
    let handled = send(handle.wait(&(), 1, Duration::ZERO));
    assert!(runtime.block_on(handled).is_err());
}

/// On the real clock: each wait is admitted, and only after the refill it
/// needed. A sleep may run late on a busy machine (the bucket then holds
/// more when the wait wakes), so the tokens left are bounded, not exact,
/// and the time is bounded below only.
#[test]
fn blocking_wait_is_admitted_after_a_real_sleep() {
    let limiter = TokenBucketLimiter::new(1000.0, 2); // a token every ms
    let start = std::time::Instant::now();
    assert_eq!(limiter.check("k", Now, 2).map(|d| d.remaining()), Ok(0));
    // Cost 2 of capacity 2 leaves nothing, however late it wakes.
    assert_eq!(
        limiter
            .wait_blocking("k", 2, Duration::from_secs(10))
            .map(|d| d.remaining()),
        Ok(0)
    );
    let handle = limiter.bucket("k");
    let left = handle
        .wait_blocking(&(), 1, Duration::from_secs(10))
        .map(|d| d.remaining());
    assert!(matches!(left, Ok(0 | 1)), "{left:?}");
    // 5 tokens admitted from a bucket of 2 empty at `start`: at least 3 ms
    // of refill, on the limiter's monotonic clock as on this one.
    assert!(
        start.elapsed() >= Duration::from_millis(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn blocking_wait_returns_hopeless_denials_at_once() {
    let clock = ManualClock::new();
    let limiter = TokenBucketLimiter::new(0.001, 1).with_clock(clock.clone()); // 1000 s a token
    assert_eq!(limiter.check("k", Now, 1).map(|d| d.remaining()), Ok(0));
    // The next token is 1000 s away (on a clock that does not move): a
    // 1 s maximum wait returns the denial without sleeping at all.
    let denial = limiter.wait_blocking("k", 1, Duration::from_secs(1));
    assert_eq!(
        denial,
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_secs(1000)
        })
    );
    assert!(matches!(
        limiter.bucket("k").wait_blocking(&(), 2, Duration::MAX),
        Err(Denial::ExceedsCapacity { .. })
    ));
    clock.advance(Duration::from_secs(1000));
    assert_eq!(
        limiter
            .wait_blocking("k", 1, Duration::ZERO)
            .map(|d| d.remaining()),
        Ok(0)
    );
}

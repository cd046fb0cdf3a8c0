//! The coalescing protocol (boarding, the flight guard, the wake-up)
//! under contention, on a multi-threaded runtime, against a fake Redis
//! that decides on one word under a lock: the differential tests run
//! their calls one at a time, so their waits never happen.

use super::*;
use crate::error::Denial;
use crate::gcra::{self, Quota};
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// What the test counts: calls that went to the fake Redis, its
/// admissions and denials, denials by the bound, and waits.
#[derive(Default)]
struct Tally {
    round_trips: StdAtomicU64,
    admitted: StdAtomicU64,
    denied_by_redis: StdAtomicU64,
    denied_by_bound: StdAtomicU64,
    waits: StdAtomicU64,
}

/// One call, as `RedisLimiter` makes it: deny by the bound, board,
/// wait and decide again, or go to Redis, raise the bound to its
/// answer and land (drop the guard).
async fn call(
    mirror: Arc<Mirror>,
    redis: Arc<Mutex<Nanos>>,
    tally: Arc<Tally>,
    at: Nanos,
    quota: Quota,
) {
    let (key, cost) = ("k", 1);
    let spend = gcra::spend_for(cost, &quota).expect("a unit cost fits");
    loop {
        let sent = mirror.local_now();
        if let Some(bound) = mirror.bound(key, sent).and_then(|known| known.fresh) {
            if gcra::decide(bound, at, cost, &quota).is_err() {
                tally.denied_by_bound.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let guard = match mirror.board(key, at, cost, spend, &quota) {
            Boarding::Go(guard) => guard,
            Boarding::Wait(landed) => {
                tally.waits.fetch_add(1, Ordering::Relaxed);
                landed.await;
                continue;
            }
        };
        assert!(guard.is_some(), "the mirror keeps the test's one key");
        // The round trip: other tasks run meanwhile.
        tokio::task::yield_now().await;
        tally.round_trips.fetch_add(1, Ordering::Relaxed);
        let (decided, word) = {
            let mut word = redis.lock().unwrap();
            let decided = gcra::decide(*word, at, cost, &quota);
            if let Ok(next) = decided {
                *word = next;
            }
            (decided, *word)
        };
        tokio::task::yield_now().await;
        mirror.learn(key, word, at, sent);
        drop(guard);
        match decided {
            Ok(_) => tally.admitted.fetch_add(1, Ordering::Relaxed),
            Err(Denial::InsufficientTokens { .. }) => {
                tally.denied_by_redis.fetch_add(1, Ordering::Relaxed)
            }
            Err(other) => panic!("{other:?}"),
        };
        return;
    }
}

/// Rounds of many tasks calling one key at one instant each, a window
/// apart (the bucket is full again at each round). Every call ends (a
/// lost wake-up would hang the round: the timeout fails it), and is
/// decided once, by the bound or by Redis; Redis admits exactly the
/// capacity each round (the bound denies nothing Redis would admit);
/// no call boards twice or stays boarded (the pending refill is back to
/// zero after each round); and calls waited. Redis may deny a few: a
/// call that read the bound just before a landing raised it boards
/// with no flight to count, and Redis answers it.
#[test]
fn contended_boarding_coalesces_and_loses_no_call() {
    const ROUNDS: u64 = 200;
    const TASKS: u64 = 48;
    const CAPACITY: u64 = 8;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("a runtime");
    let quota = Quota::new(CAPACITY as f64, CAPACITY).expect("a valid quota");
    // A refresh far longer than the test: every bound stays fresh.
    let mirror = Arc::new(Mirror::new(
        DEFAULT_MIRROR_CAPACITY,
        Duration::from_secs(3600),
    ));
    let redis = Arc::new(Mutex::new(Nanos::ZERO));
    let tally = Arc::new(Tally::default());
    for round in 1..=ROUNDS {
        let at = Nanos::new(round * quota.window().as_u64());
        let before = tally.admitted.load(Ordering::Relaxed);
        let trips_before = tally.round_trips.load(Ordering::Relaxed);
        runtime.block_on(async {
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (mirror, redis, tally) =
                        (Arc::clone(&mirror), Arc::clone(&redis), Arc::clone(&tally));
                    tokio::spawn(call(mirror, redis, tally, at, quota))
                })
                .collect();
            let all = async {
                for task in tasks {
                    task.await.expect("a call panicked");
                }
            };
            tokio::time::timeout(Duration::from_secs(60), all)
                .await
                .expect("a call never ended: a lost wake-up");
        });
        let admitted = tally.admitted.load(Ordering::Relaxed) - before;
        let trips = tally.round_trips.load(Ordering::Relaxed) - trips_before;
        assert_eq!(admitted, CAPACITY, "round {round}: admitted {admitted}");
        assert!(trips >= admitted, "round {round}: {trips} round trips");
        let pending = mirror.shard("k").read().get("k").map(|e| e.pending);
        assert_eq!(
            pending,
            Some(Nanos::ZERO),
            "round {round}: a flight never landed"
        );
    }
    let calls = ROUNDS * TASKS;
    let by_bound = tally.denied_by_bound.load(Ordering::Relaxed);
    let by_redis = tally.denied_by_redis.load(Ordering::Relaxed);
    let trips = tally.round_trips.load(Ordering::Relaxed);
    assert_eq!(
        trips,
        ROUNDS * CAPACITY + by_redis,
        "a call went to Redis twice"
    );
    assert_eq!(trips + by_bound, calls, "every call decided once");
    let waits = tally.waits.load(Ordering::Relaxed);
    eprintln!("{calls} calls: {trips} round trips ({by_redis} denied by Redis), {by_bound} denied by the bound, {waits} waits");
    assert!(waits > 0, "no call waited: the contended path never ran");
}

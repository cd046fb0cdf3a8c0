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

/// A reset on Redis (this limiter's `reset` or `reset_all`: the fake's
/// word back to zero, then `forget` or `forget_all`) while calls on the
/// key are in flight, sent before it: their answers carry the word from
/// before the reset, and reach the mirror only after `forget`. The floor
/// must drop them: learnt, they would make the bound exceed the word
/// Redis keeps (zero: the bucket is full), and deny locally, for up to
/// `refresh`, calls Redis admits. The race happens in every run, by
/// construction: each call runs on its own thread and is held between
/// Redis's decision and its `learn` until the reset is done (barriers).
/// A call sent after the reset is learnt: the floor drops only the
/// answers from before it.
#[test]
fn a_reset_drops_the_answers_of_calls_sent_before_it() {
    use std::sync::Barrier;
    const CALLS: u64 = 4;
    let quota = Quota::new(CALLS as f64, CALLS).expect("a valid quota");
    let spend = gcra::spend_for(1, &quota).expect("a unit cost fits");
    // The calls together empty the bucket, full at `at`.
    let at = quota.window();
    for reset_all in [false, true] {
        // A refresh far longer than the test: every bound stays fresh.
        let mirror = Arc::new(Mirror::new(
            DEFAULT_MIRROR_CAPACITY,
            Duration::from_secs(3600),
        ));
        let redis = Mutex::new(Nanos::ZERO);
        let (decided, reset) = (
            Barrier::new(CALLS as usize + 1),
            Barrier::new(CALLS as usize + 1),
        );
        // Nothing panics before the barriers (a thread that did would
        // leave the others waiting forever): the checks come after.
        let (calls, clock_moved) = std::thread::scope(|scope| {
            let calls: Vec<_> = (0..CALLS)
                .map(|_| {
                    scope.spawn(|| {
                        let sent = mirror.local_now();
                        let guard = match mirror.board("k", at, 1, spend, &quota) {
                            Boarding::Go(guard) => guard,
                            Boarding::Wait(_) => None,
                        };
                        let word = {
                            let mut word = redis.lock().unwrap();
                            let decided = gcra::decide(*word, at, 1, &quota);
                            *word = decided.unwrap_or(*word);
                            decided.ok()
                        };
                        decided.wait();
                        // The answer is on its way back while Redis is reset.
                        reset.wait();
                        if let Some(word) = word {
                            mirror.learn("k", word, at, sent);
                        }
                        (guard.is_some(), word.is_some())
                    })
                })
                .collect();
            decided.wait();
            // Every call was sent at or before `last_sent`; the reset reads
            // the clock after it has moved on, so every `sent` is strictly
            // below the floor (a call sent at the floor's very instant
            // could be either side of the reset).
            let last_sent = mirror.local_now();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut clock_moved = true;
            while mirror.local_now() <= last_sent {
                if std::time::Instant::now() >= deadline {
                    clock_moved = false;
                    break;
                }
                std::hint::spin_loop();
            }
            *redis.lock().unwrap() = Nanos::ZERO;
            if reset_all {
                mirror.forget_all();
            } else {
                mirror.forget("k");
            }
            reset.wait();
            let calls: Vec<_> = calls
                .into_iter()
                .map(|call| call.join().expect("a call panicked"))
                .collect();
            (calls, clock_moved)
        });
        assert!(clock_moved, "the monotonic clock did not move in 10 s");
        assert!(
            calls.iter().all(|&(boarded, admitted)| boarded && admitted),
            "the calls fit in the bucket: each boards without waiting and is admitted: {calls:?}"
        );
        let known = mirror
            .bound("k", mirror.local_now())
            .expect("the entry the calls boarded");
        assert_eq!(
            known.guess,
            Nanos::ZERO,
            "reset_all {reset_all}: the bound is an answer sent before the reset"
        );
        // So a call Redis admits (the bucket is full) is not denied by it.
        let bound = known.fresh.expect("a fresh bound");
        assert!(gcra::decide(bound, at, CALLS, &quota).is_ok());

        // A call sent after the reset: its answer is the bound.
        let sent = mirror.local_now();
        let word = gcra::decide(Nanos::ZERO, at, CALLS, &quota).expect("a full bucket");
        *redis.lock().unwrap() = word;
        mirror.learn("k", word, at, sent);
        let known = mirror.bound("k", mirror.local_now()).expect("the entry");
        assert_eq!(
            known.fresh,
            Some(word),
            "reset_all {reset_all}: an answer after the reset is dropped"
        );
    }
}

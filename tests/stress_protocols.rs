//! Each concurrent protocol that the loom models check (`loom_tests/`), run
//! at scale on real OS threads: millions of calls, exact counts.
//!
//! loom proves the protocols for 2-3 threads and a few calls; these tests
//! run the same protocols with more threads than cores, so that preemption
//! lands anywhere, and check the same counts. They assert counts only,
//! never timings. A failed assertion in any thread fails the test at once:
//! barriers break and loops stop (`common::sync`), nothing waits forever.
#![cfg(not(loom))]

mod common;

use common::sync::{Barrier, SetOnDrop, PATIENCE};
use common::XorShift;
use keyrate::{BucketHandle, TokenBucketLimiter};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

/// More threads than the CI machine's cores, so threads are preempted
/// mid-protocol as well as racing on other cores.
const THREADS: usize = 4;

/// Runs `f(thread index)` on `THREADS` threads released together; returns
/// each thread's result.
fn on_threads<T: Send>(f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let start = Barrier::new(THREADS);
    thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (f, start) = (&f, &start);
                scope.spawn(move || {
                    let _guard = start.guard();
                    start.wait();
                    f(t)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a stress thread panicked"))
            .collect()
    })
}

/// Model 1 at scale: same-instant unit spends on one hot key, through the
/// map and through handles on the same bucket, admit exactly `capacity`.
#[test]
fn same_instant_spends_on_one_key_admit_exactly_capacity() {
    const CALLS_PER_THREAD: u64 = 500_000; // 2 million calls in all
    let capacity = 1_000_000;
    let limiter = TokenBucketLimiter::new(1.0, capacity);
    let admitted: u64 = on_threads(|t| {
        // Odd threads spend through a handle, even threads by key: both
        // paths share the one bucket.
        let handle = (t % 2 == 1).then(|| limiter.bucket("sk_live_hot"));
        (0..CALLS_PER_THREAD)
            .filter(|_| match &handle {
                Some(handle) => handle.allow(7.0),
                None => limiter.allow("sk_live_hot", 7.0),
            })
            .count() as u64
    })
    .into_iter()
    .sum();
    let attempts = CALLS_PER_THREAD * THREADS as u64;
    assert_eq!(admitted, capacity.min(attempts));
    assert_eq!(limiter.remaining("sk_live_hot", 7.0), Ok(0));
    assert_eq!(limiter.len(), 1);
}

/// Model 1 with mixed costs at scale: the bucket ends holding exactly
/// `capacity - sum(admitted costs)`, however the spends interleaved.
#[test]
fn mixed_costs_leave_exactly_capacity_minus_spent() {
    const CALLS_PER_THREAD: u64 = 500_000; // 2 million calls in all
                                           // Costs average 2.5, so the 2 million calls ask for about 5 million
                                           // tokens: the bucket runs dry part-way, and denials near empty (a cost
                                           // of 5 with 3 left) race admissions of smaller costs.
    let capacity = 3_000_000;
    let limiter = TokenBucketLimiter::new(1.0, capacity);
    let spent: u64 = on_threads(|t| {
        let handle = (t % 2 == 1).then(|| limiter.bucket("sk_live_mixed"));
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
        let mut spent = 0;
        for _ in 0..CALLS_PER_THREAD {
            let cost = rng.next() % 6; // 0..=5, cost 0 included
            let admitted = match &handle {
                Some(handle) => handle.allow_n(7.0, cost),
                None => limiter.allow_n("sk_live_mixed", 7.0, cost),
            };
            if admitted {
                spent += cost;
            }
        }
        spent
    })
    .into_iter()
    .sum();
    assert!(spent <= capacity, "spent {spent} of {capacity}");
    assert_eq!(
        limiter.remaining("sk_live_mixed", 7.0),
        Ok(capacity - spent)
    );
}

/// Model 2 at scale: threads spend on one key at timestamps that advance
/// at different paces, so that calls stamped earlier keep arriving after
/// later ones. At most `capacity + rate * span` tokens are admitted, and the
/// bucket's clock never moves backwards: an observer reading the tokens
/// left at a fixed later instant (which can only fall as the clock moves
/// forward) never sees them rise.
#[test]
fn mixed_timestamps_never_exceed_capacity_plus_refill() {
    const CALLS_PER_THREAD: u64 = 400_000; // 1.6 million calls in all
    const STEP_NS: u64 = 1_000; // per call, for the fastest thread
                                // 1000 tokens/s: 1 ms per token, exact.
    let (rate_per_ms, capacity) = (1, 50);
    let limiter = TokenBucketLimiter::new(1000.0, capacity);
    let end_ns = 1_000_000_000 + CALLS_PER_THREAD * STEP_NS;
    let end = end_ns as f64 / 1e9;
    let done = AtomicBool::new(false);
    let (admitted, rises) = thread::scope(|scope| {
        let observer = scope.spawn(|| {
            let mut last = capacity;
            let mut rises = 0u64;
            // Acquire pairs with the Release store of `done`.
            while !done.load(Ordering::Acquire) {
                let now = limiter.remaining("sk_live_clock", end).unwrap_or(0);
                rises += u64::from(now > last);
                last = now;
            }
            rises
        });
        // Stops the observer however this scope ends: a spender that
        // panics must fail the test, not leave the observer spinning.
        let stop = SetOnDrop(&done);
        let admitted: u64 = on_threads(|t| {
            // Thread t's clock runs at 1/(t+1) of the fastest one's pace and
            // starts t ms late: its calls are stamped ever further behind.
            let pace = STEP_NS / (t as u64 + 1);
            (0..CALLS_PER_THREAD)
                .filter(|i| {
                    let ns = 1_000_000_000 - t as u64 * 1_000_000 + i * pace;
                    limiter.allow("sk_live_clock", ns as f64 / 1e9)
                })
                .count() as u64
        })
        .into_iter()
        .sum();
        drop(stop);
        (admitted, observer.join().expect("the observer panicked"))
    });
    // The earliest stamp is thread 3's first, the latest thread 0's last.
    let start_ns = 1_000_000_000 - (THREADS as u64 - 1) * 1_000_000;
    let span_ms = (end_ns - STEP_NS - start_ns) / 1_000_000;
    let bound = capacity + rate_per_ms * span_ms;
    eprintln!("admitted {admitted} of at most {bound}");
    assert!(
        admitted <= bound,
        "admitted {admitted} > capacity + rate * span = {bound}"
    );
    assert_eq!(
        rises, 0,
        "the tokens left at a fixed instant rose: the clock moved backwards"
    );
}

/// Model 3 at scale: every thread walks the same fresh keys in the same
/// order (re-synchronised every few keys, so first calls really collide),
/// some through a new handle and some by key. Each key ends with exactly
/// one bucket and exactly `capacity` admitted.
#[test]
fn first_use_races_on_fresh_keys_make_one_bucket_and_admit_capacity() {
    const KEYS: usize = 200_000;
    const CALLS_PER_KEY: usize = 2; // per thread: 1.6 million calls in all
    const STRIDE: usize = 256;
    let capacity = 5;
    let limiter = TokenBucketLimiter::new(1.0, capacity);
    let keys: Vec<String> = (0..KEYS).map(|k| format!("sk_fresh_{k:08}")).collect();
    let per_key: Vec<AtomicU32> = (0..KEYS).map(|_| AtomicU32::new(0)).collect();
    let lockstep = Barrier::new(THREADS);
    on_threads(|t| {
        // A thread that fails breaks the lockstep for the others.
        let _guard = lockstep.guard();
        for (k, key) in keys.iter().enumerate() {
            if k % STRIDE == 0 {
                lockstep.wait();
            }
            for call in 0..CALLS_PER_KEY {
                // One thread in four opens each key with a handle.
                let admitted = if (k + t + call) % THREADS == 0 {
                    limiter.bucket(key.as_str()).allow(3.0)
                } else {
                    limiter.allow(key.as_str(), 3.0)
                };
                if admitted {
                    // Relaxed: a tally read after the threads are joined.
                    per_key[k].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    assert_eq!(limiter.len(), KEYS, "exactly one bucket per key");
    for (k, admitted) in per_key.iter().enumerate() {
        assert_eq!(
            u64::from(admitted.load(Ordering::Relaxed)),
            capacity.min((THREADS * CALLS_PER_KEY) as u64),
            "key {k}"
        );
    }
}

/// Model 4 at scale: a sweeper thread evicts full buckets while spender
/// threads spend, keyed and through short-lived handles. Time advances in
/// rounds one refill window apart, so every bucket is full again when a
/// round starts: the first spends of each round race eviction of that same
/// bucket. After each round the tokens left on every key must be exactly
/// `capacity` minus what that round admitted: an admitted spend that
/// landed on a bucket the sweeper then dropped would show as tokens that
/// should not be there.
///
/// The race happens in every round by construction, not by the
/// scheduler's grace: the sweeper is a party to the rounds, starts
/// sweeping at the round's instant before any spender may spend, and
/// sweeps without a pause until every spender is through. So each spend
/// lands while a sweep of its bucket's instant is under way, however the
/// threads are scheduled, and a slow machine only makes the test slower.
/// (An earlier version let a free-running sweeper race the rounds and
/// required it to have evicted during 100 of them within 60 s: a count
/// and a time limit that a busy machine could miss.) Each round then
/// also checks that the sweeps ran at that instant: the keys that sat the
/// round out were full all through it, so none of them may be left.
#[test]
fn sweeps_racing_spends_never_lose_an_admitted_spend() {
    const ROUNDS: u64 = 2_000;
    const KEYS: usize = 32;
    const CALLS_PER_KEY: u64 = 6; // per spender and round: 1.15 million calls
    const SPENDERS: usize = THREADS - 1;
    // 8 tokens/s and capacity 8: the window is exactly 1 s, and round r
    // spends at r seconds, when every bucket is full again.
    let capacity = 8;
    let limiter = TokenBucketLimiter::new(8.0, capacity);
    let keys: Vec<String> = (0..KEYS).map(|k| format!("sk_swept_{k:02}")).collect();
    let spent: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    // Some keys sit a round out, so their full buckets are evicted and
    // recreated rather than only raced.
    let active = |k: usize, r: u64| (k as u64 + r) % 3 != 0;
    // The round being spent; the sweeper sweeps at this instant, never
    // later, so it only drops buckets that no spender of the round can tell
    // from new ones.
    let round = AtomicU64::new(0);
    // Round r + 1 once the sweeper is sweeping round r: the spenders wait
    // for it before their first spend.
    let sweeping = AtomicU64::new(0);
    // Spenders through with their rounds' spends, over all rounds: the
    // sweeper sweeps round r until it reaches SPENDERS * (r + 1).
    let through = AtomicU64::new(0);
    // Sweeps made and buckets evicted by the sweeper, for the summary.
    let sweeps = AtomicU64::new(0);
    let evicted = AtomicU64::new(0);
    // Tells the spenders and the sweeper, at the start of a round, that
    // there is none.
    let last = AtomicBool::new(false);
    // Set when any of the threads ends, however it ends: the waits for
    // the sweeper or the spenders inside a round stop (they hold no
    // barrier) when a thread has failed.
    let ended = AtomicBool::new(false);
    // The sweeper is a party too: it sweeps inside each round.
    let round_over = Barrier::new(SPENDERS + 2);
    let round_checked = Barrier::new(SPENDERS + 2);
    thread::scope(|scope| {
        scope.spawn(|| {
            // A failed sweeper breaks the barriers for the others and
            // stops the spenders waiting for its sweeps.
            let _guards = (round_over.guard(), round_checked.guard());
            let _ended = SetOnDrop(&ended);
            loop {
                round_checked.wait();
                // Relaxed: both were stored before the barrier.
                if last.load(Ordering::Relaxed) {
                    return;
                }
                let r = round.load(Ordering::Relaxed);
                // Release pairs with the spenders' Acquire load: no spend
                // of the round comes before this.
                sweeping.store(r + 1, Ordering::Release);
                // Only a guard against a spender stuck for good.
                let deadline = Instant::now() + PATIENCE;
                loop {
                    // Read before the sweep: the sweep that sees every
                    // spender through started after their last spends.
                    let all_through = through.load(Ordering::Acquire) >= SPENDERS as u64 * (r + 1);
                    let n = limiter.sweep(r as f64);
                    // Relaxed: tallies read after the threads are joined.
                    evicted.fetch_add(n as u64, Ordering::Relaxed);
                    sweeps.fetch_add(1, Ordering::Relaxed);
                    if all_through {
                        break;
                    }
                    // Acquire pairs with `SetOnDrop`'s Release store; the
                    // broken barrier below then tells why.
                    if ended.load(Ordering::Acquire) {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "round {r}: the spenders were not through within {PATIENCE:?}"
                    );
                }
                round_over.wait();
            }
        });
        for s in 0..SPENDERS {
            let (limiter, keys, spent) = (&limiter, &keys, &spent);
            let (round, last, sweeping, through) = (&round, &last, &sweeping, &through);
            let ended = &ended;
            let (round_over, round_checked) = (&round_over, &round_checked);
            scope.spawn(move || {
                // A failed spender breaks the barriers for the others and
                // stops the sweeper waiting for it to be through.
                let _guards = (round_over.guard(), round_checked.guard());
                let _ended = SetOnDrop(ended);
                let mut rng = XorShift::new(0x2545_f491_4f6c_dd1d ^ (s as u64 + 1));
                loop {
                    round_checked.wait();
                    // Relaxed: both were stored before the barrier.
                    if last.load(Ordering::Relaxed) {
                        return;
                    }
                    let r = round.load(Ordering::Relaxed);
                    let now = r as f64;
                    // The deadline only turns a sweeper that never starts
                    // (it failed, or is stuck) into a failure, not a hang.
                    let deadline = Instant::now() + PATIENCE;
                    while sweeping.load(Ordering::Acquire) != r + 1 {
                        // Acquire pairs with `SetOnDrop`'s Release store.
                        assert!(
                            !ended.load(Ordering::Acquire),
                            "round {r}: another thread ended"
                        );
                        assert!(
                            Instant::now() < deadline,
                            "round {r}: the sweeper did not start within {PATIENCE:?}"
                        );
                        thread::yield_now();
                    }
                    // Spender 0 holds handles for the round: a live handle
                    // must keep its bucket in the map while it lives.
                    let handles: Vec<Option<BucketHandle>> = (0..KEYS)
                        .map(|k| (s == 0 && active(k, r)).then(|| limiter.bucket(keys[k].as_str())))
                        .collect();
                    for _ in 0..CALLS_PER_KEY {
                        for k in (0..KEYS).filter(|&k| active(k, r)) {
                            let cost = 1 + rng.next() % 3;
                            let admitted = match &handles[k] {
                                Some(handle) => handle.allow_n(now, cost),
                                None => limiter.allow_n(keys[k].as_str(), now, cost),
                            };
                            if admitted {
                                // Relaxed: read after the round's barrier.
                                spent[k].fetch_add(cost, Ordering::Relaxed);
                            }
                        }
                    }
                    drop(handles);
                    // Release pairs with the sweeper's Acquire load.
                    through.fetch_add(1, Ordering::Release);
                    // The barrier orders the round's spends before the check.
                    round_over.wait();
                }
            });
        }
        // However this thread ends, the others stop waiting for it.
        let _guards = (round_over.guard(), round_checked.guard());
        let _ended = SetOnDrop(&ended);
        for r in 0..ROUNDS {
            // Relaxed: the barrier below publishes it to the others.
            round.store(r, Ordering::Relaxed);
            round_checked.wait();
            round_over.wait();
            for (k, key) in keys.iter().enumerate() {
                let spent = spent[k].swap(0, Ordering::Relaxed);
                assert!(spent <= capacity, "round {r}, key {k}: spent {spent}");
                assert_eq!(
                    limiter.remaining(key.as_str(), r as f64),
                    Ok(capacity - spent),
                    "round {r}, key {k}: an admitted spend was lost"
                );
            }
            // Every active key was spent (its first spend of the round
            // finds a full bucket), so its bucket is not full at `r` and
            // stays; the others were full all round, under sweeps at `r`.
            let spent_keys = (0..KEYS).filter(|&k| active(k, r)).count();
            assert_eq!(
                limiter.len(),
                spent_keys,
                "round {r}: the sweeps at the round's instant left a full bucket, or lost one"
            );
        }
        last.store(true, Ordering::Relaxed);
        round_checked.wait();
    });
    eprintln!(
        "the sweeper made {} sweeps during {ROUNDS} rounds' spends, evicting {} buckets",
        sweeps.into_inner(),
        evicted.into_inner()
    );
}

/// Model 5 at scale: threads race to create far more new keys than the cap
/// allows. Exactly `max_buckets` of them get a bucket, every other first
/// call is refused with `LimiterFull`, and the keys that got in keep
/// working.
#[test]
fn racing_creations_fill_the_cap_exactly() {
    use keyrate::Denial;
    const KEYS_PER_THREAD: usize = 250_000; // 1 million creations in all
    const MAX_BUCKETS: usize = 10_000;
    let limiter = TokenBucketLimiter::new(1.0, 2).with_max_buckets(MAX_BUCKETS);
    let admitted: Vec<Vec<String>> = on_threads(|t| {
        let mut admitted = Vec::new();
        for i in 0..KEYS_PER_THREAD {
            // Interleave the threads' keys so that they contend for the
            // same shards; every key is distinct.
            let key = format!("sk_new_{:08}", i * THREADS + t);
            // At 0 s every bucket holds a debt, so no sweep can free a place.
            match limiter.check(key.as_str(), 0.0, 1) {
                Ok(_) => admitted.push(key),
                Err(Denial::LimiterFull { max_buckets }) => assert_eq!(max_buckets, MAX_BUCKETS),
                Err(other) => panic!("{key}: {other:?}"),
            }
        }
        admitted
    });
    let admitted: Vec<String> = admitted.into_iter().flatten().collect();
    assert_eq!(
        admitted.len(),
        MAX_BUCKETS,
        "exactly the cap's worth of new keys"
    );
    assert_eq!(limiter.len(), MAX_BUCKETS);
    for key in &admitted {
        assert!(limiter.allow(key.as_str(), 0.0), "{key} lost its bucket");
        assert!(
            !limiter.allow(key.as_str(), 0.0),
            "{key} holds more than capacity"
        );
    }
}

/// The hot-key cache's share/retire protocol at scale (loom compiles the
/// cache out, see `src/hot.rs`): a few keys hammered from several threads
/// are promoted into each thread's cache, which then spends on the moved
/// bucket it shares with the map and with the other threads' caches; a
/// sweeper retires those buckets while cached (the cache holds no pin),
/// both racing the round's spends and, deterministically, after each
/// round in which a key sat out. The caches must then drop the retired
/// bucket and go to the map, and every round's admitted spends must show
/// exactly in the key's bucket, whichever path they took.
#[test]
fn hot_key_caches_racing_sweeps_never_lose_an_admitted_spend() {
    const ROUNDS: u64 = 600;
    const KEYS: usize = 4;
    // Per spender, key and round: enough votes to promote a key within a
    // round (one miss in 4 votes, 16 net votes promote).
    const CALLS_PER_KEY: u64 = 192;
    const SPENDERS: usize = THREADS - 1;
    // 64 tokens/s and capacity 64: the window is exactly 1 s, and round r
    // spends at r seconds, when every bucket is full again. Most calls are
    // denials, served from the caches once the key is promoted.
    let capacity = 64;
    let limiter = TokenBucketLimiter::new(64.0, capacity).with_hot_key_cache(true);
    let keys: Vec<String> = (0..KEYS).map(|k| format!("sk_hot_{k}")).collect();
    let spent: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    let round = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let round_over = Barrier::new(SPENDERS + 1);
    let round_checked = Barrier::new(SPENDERS + 1);
    // A key sits out every third round: its bucket is full at the next
    // round's instant, and swept while the caches still hold it.
    let active = |k: usize, r: u64| (k as u64 + r) % 3 != 0;
    let mut retired_while_cached = 0;
    thread::scope(|scope| {
        // However this thread ends (a failed check below), the sweeper
        // stops and the spenders stop waiting for it; without these it
        // would sweep for ever and the scope never end.
        let _stop = SetOnDrop(&done);
        let _guards = (round_over.guard(), round_checked.guard());
        scope.spawn(|| {
            // Acquire pairs with `SetOnDrop`'s Release store; `round` is
            // read Relaxed: a stale (earlier) round only sweeps less.
            while !done.load(Ordering::Acquire) {
                let _ = limiter.sweep(round.load(Ordering::Relaxed) as f64);
                thread::yield_now();
            }
        });
        for s in 0..SPENDERS {
            let (limiter, keys, spent) = (&limiter, &keys, &spent);
            let (round_over, round_checked) = (&round_over, &round_checked);
            scope.spawn(move || {
                // A failed spender breaks the barriers for the main thread.
                let _guards = (round_over.guard(), round_checked.guard());
                let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15 ^ (s as u64 + 1));
                for r in 0..ROUNDS {
                    round_checked.wait();
                    let now = r as f64;
                    for _ in 0..CALLS_PER_KEY {
                        for k in (0..KEYS).filter(|&k| active(k, r)) {
                            let cost = 1 + rng.next() % 2;
                            if limiter.allow_n(keys[k].as_str(), now, cost) {
                                // Relaxed: read after the round's barrier.
                                spent[k].fetch_add(cost, Ordering::Relaxed);
                            }
                        }
                    }
                    // The barrier orders the round's spends before the check.
                    round_over.wait();
                }
            });
        }
        for r in 0..ROUNDS {
            // Relaxed: the barrier below publishes it to the spenders.
            round.store(r, Ordering::Relaxed);
            round_checked.wait();
            round_over.wait();
            for (k, key) in keys.iter().enumerate() {
                let spent = spent[k].swap(0, Ordering::Relaxed);
                assert!(spent <= capacity, "round {r}, key {k}: spent {spent}");
                assert_eq!(
                    limiter.remaining(key.as_str(), r as f64),
                    Ok(capacity - spent),
                    "round {r}, key {k}: an admitted spend was lost"
                );
            }
            // The keys that sat this round out are full at `r`: this sweep
            // retires their buckets whatever the racing sweeper did, while
            // the spenders' caches still hold them.
            retired_while_cached += limiter.sweep(r as f64);
        }
    });
    let stats = limiter.stats();
    let calls: u64 = (0..ROUNDS)
        .map(|r| (0..KEYS).filter(|&k| active(k, r)).count() as u64)
        .sum::<u64>()
        * CALLS_PER_KEY
        * SPENDERS as u64;
    assert_eq!(stats.admitted + stats.denied(), calls, "every call decided");
    // Each key promoted in each spender once, and again after (most of)
    // the ~ROUNDS / 3 times its bucket was retired under the caches: the
    // share/retire path was taken, not only the first promotion.
    let first_promotions = (SPENDERS * KEYS) as u64;
    eprintln!(
        "hot-key promotions {}, buckets retired by the round sweeps {retired_while_cached}",
        stats.hot_key_promotions
    );
    assert!(
        stats.hot_key_promotions > 10 * first_promotions,
        "the caches took keys in {} times: retired buckets were not re-promoted",
        stats.hot_key_promotions
    );
}

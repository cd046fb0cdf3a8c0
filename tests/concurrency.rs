//! `ConcurrencyLimiter`: the limit held at every instant on real threads,
//! the memory bound, and bad input. Counts only, never timings.
#![cfg(not(loom))]

mod common;

use common::keys::{panics, DropsBadly};
use common::sync::PATIENCE;
use keyrate::{ConcurrencyDenial, ConcurrencyLimiter, ConfigError, Permit};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

const THREADS: usize = 4;
const KEYS: [&str; 3] = ["a", "b", "c"];
const MAX: u32 = 2;

/// A small xorshift generator: reproducible per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Counts `permit` among its key's `holders` while held: never above MAX.
fn hold(holders: &AtomicU32, permit: Permit) {
    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(now <= MAX, "{now} holders of a key limited to {MAX}");
    holders.fetch_sub(1, Ordering::SeqCst);
    drop(permit);
}

/// Millions of acquire/release pairs over three keys from more threads
/// than cores, some holding two permits at once, some waiting, one also
/// sweeping: the holders of a key never exceed MAX at any instant, and at
/// the end nothing is held and nothing tracked.
#[test]
fn stress_holders_never_exceed_max() {
    let limiter = ConcurrencyLimiter::new(MAX);
    let holders: Vec<AtomicU32> = KEYS.iter().map(|_| AtomicU32::new(0)).collect();
    let pairs: u64 = if cfg!(debug_assertions) {
        250_000
    } else {
        1_000_000
    };
    let start = Barrier::new(THREADS);
    let given: u64 = thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (limiter, holders, start) = (&limiter, &holders, &start);
                scope.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                    let mut given = 0u64;
                    start.wait();
                    for i in 0..pairs {
                        let k = (rng.next() % KEYS.len() as u64) as usize;
                        let key = KEYS[k];
                        let permit = match rng.next() % 64 {
                            // A few waits, short: served in turn or timed out.
                            0 => limiter.acquire_blocking(key, Duration::from_micros(50)),
                            _ => limiter.try_acquire(key),
                        };
                        let Ok(permit) = permit else { continue };
                        given += 1;
                        // Sometimes hold a second permit of the same key.
                        let now = holders[k].fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= MAX, "{now} holders of a key limited to {MAX}");
                        if let Ok(second) = limiter.try_acquire(key) {
                            given += 1;
                            hold(&holders[k], second);
                        }
                        holders[k].fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                        if t == 0 && i % 1024 == 0 {
                            limiter.sweep();
                        }
                    }
                    given
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    assert!(
        given > pairs,
        "the keys were almost never free: {given} permits"
    );
    for key in KEYS {
        assert_eq!(limiter.held(key), 0, "{key} still holds permits");
    }
    let stats = limiter.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
    assert_eq!(stats.acquired, given);
    limiter.sweep();
    assert!(limiter.is_empty(), "{} keys left", limiter.len());
}

/// A flood of keys, each taking and giving back one permit, keeps the
/// tracked keys bounded by the automatic sweep (at most 12,288 idle ones;
/// see also `tests/concurrency_sweep.rs`).
#[test]
fn key_flood_stays_bounded() {
    let limiter = ConcurrencyLimiter::new(1);
    let mut most = 0;
    for i in 0..200_000u32 {
        drop(limiter.try_acquire(&format!("flood-{i}")).unwrap());
        most = most.max(limiter.len());
    }
    assert!(most <= 3 * 4_096, "{most} keys tracked at once");
    // Keys holding permits are never swept.
    let held: Vec<_> = (0..100)
        .map(|i| limiter.try_acquire(&format!("held-{i}")).unwrap())
        .collect();
    for i in 0..50_000u32 {
        drop(limiter.try_acquire(&format!("more-{i}")).unwrap());
    }
    for i in 0..100 {
        assert_eq!(limiter.held(&format!("held-{i}")), 1);
    }
    drop(held);
    limiter.sweep();
    assert!(limiter.is_empty());
}

#[test]
fn max_keys_refuses_new_keys_only() {
    let limiter = ConcurrencyLimiter::new(2).with_max_keys(2);
    let a = limiter.try_acquire("a").unwrap();
    let _b = limiter.try_acquire("b").unwrap();
    assert_eq!(
        limiter.try_acquire("c").unwrap_err(),
        ConcurrencyDenial::LimiterFull { max_keys: 2 }
    );
    let _a2 = limiter.try_acquire("a").unwrap(); // a tracked key is not refused
    assert_eq!(limiter.stats().refused_limiter_full, 1);
    drop((a, _a2));
    limiter.sweep();
    let _c = limiter.try_acquire("c").unwrap();
}

#[test]
fn zero_max_is_a_config_error_or_a_documented_denial() {
    assert_eq!(
        ConcurrencyLimiter::try_new(0).unwrap_err(),
        ConfigError::ZeroMaxPermits
    );
    let limiter = ConcurrencyLimiter::new(1);
    assert_eq!(limiter.set_max(0), Err(ConfigError::ZeroMaxPermits));
    assert_eq!(limiter.max(), 1);
    // Per call: every call refused (a suspended plan), nothing tracked.
    assert_eq!(
        limiter.try_acquire_under("k", 0).unwrap_err(),
        ConcurrencyDenial::AtLimit { held: 0, max: 0 }
    );
    assert_eq!(
        limiter
            .acquire_blocking_under("k", 0, Duration::from_secs(60))
            .unwrap_err(),
        ConcurrencyDenial::AtLimit { held: 0, max: 0 }
    );
    assert!(limiter.is_empty());
}

#[test]
#[should_panic(expected = "invalid concurrency limit 0")]
fn new_with_zero_max_panics_with_the_message() {
    let _ = ConcurrencyLimiter::new(0);
}

/// A permit outlives its limiter: dropping it then releases into the
/// orphaned slot, with no panic and no effect on anything else.
#[test]
fn permit_dropped_after_its_limiter() {
    let limiter = ConcurrencyLimiter::new(2);
    let a = limiter.try_acquire("k").unwrap();
    let b = limiter.try_acquire("k").unwrap();
    drop(limiter);
    assert_eq!(a.held(), 2);
    drop(a);
    assert_eq!(b.held(), 1);
    let moved = thread::spawn(move || drop(b));
    moved.join().unwrap();
}

#[test]
fn lowering_the_limit_revokes_nothing() {
    let limiter = ConcurrencyLimiter::new(3);
    let permits: Vec<_> = (0..3).map(|_| limiter.try_acquire("k").unwrap()).collect();
    limiter.set_max(1).unwrap();
    assert_eq!(limiter.held("k"), 3);
    let mut permits = permits.into_iter();
    drop(permits.next());
    assert_eq!(
        limiter.try_acquire("k").unwrap_err(),
        ConcurrencyDenial::AtLimit { held: 2, max: 1 }
    );
    drop(permits.next());
    assert!(limiter.try_acquire("k").is_err());
    drop(permits.next());
    let _p = limiter.try_acquire("k").unwrap();
}

#[test]
fn public_types_are_send_sync_and_debug() {
    fn send_sync<T: Send + Sync + std::fmt::Debug>() {}
    send_sync::<ConcurrencyLimiter>();
    send_sync::<Permit>();
    send_sync::<ConcurrencyDenial>();
    send_sync::<keyrate::ConcurrencyStats>();
}

/// FIFO in threads: waiters queued one after another are served in that
/// order, and a `try_acquire` never overtakes them.
#[test]
fn blocking_waiters_are_served_in_order() {
    use std::sync::{Arc, Mutex};
    let limiter = Arc::new(ConcurrencyLimiter::new(1));
    let held = limiter.try_acquire("k").unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3u64 {
        let (limiter2, order) = (Arc::clone(&limiter), Arc::clone(&order));
        waiters.push(thread::spawn(move || {
            // A waiter never served fails (and so ends, for the join
            // below) after PATIENCE, far beyond the honest wait.
            let permit = limiter2
                .acquire_blocking("k", PATIENCE)
                .unwrap_or_else(|err| panic!("waiter {i} never served: {err:?}"));
            order.lock().unwrap().push(i);
            drop(permit);
        }));
        // Wait until this waiter is queued before starting the next.
        let deadline = Instant::now() + PATIENCE;
        while limiter.stats().waiting != i + 1 {
            assert!(
                Instant::now() < deadline,
                "waiter {i} not queued within {PATIENCE:?}"
            );
            thread::yield_now();
        }
    }
    assert!(matches!(
        limiter.try_acquire("k"),
        Err(ConcurrencyDenial::AtLimit { .. })
    ));
    drop(held);
    for waiter in waiters {
        waiter.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    assert_eq!(limiter.held("k"), 0);
}

/// The combined call takes a permit and a token, or neither.
#[test]
fn rate_and_concurrency_together_or_neither() {
    use keyrate::{Denial, TokenBucketLimiter};
    let streams = ConcurrencyLimiter::new(1);
    let rate = TokenBucketLimiter::new(1.0, 3);
    let (permit, decision) = streams.try_acquire_with("k", &rate, 0.0, 1).unwrap();
    assert_eq!(decision.remaining(), 2);
    // A refused permit spends no token.
    assert_eq!(
        streams.try_acquire_with("k", &rate, 0.0, 1).unwrap_err(),
        ConcurrencyDenial::AtLimit { held: 1, max: 1 }
    );
    assert_eq!(rate.remaining("k", 0.0), Ok(2));
    drop(permit);
    // A refused token holds no permit.
    assert!(matches!(
        streams.try_acquire_with("k", &rate, 0.0, 3).unwrap_err(),
        ConcurrencyDenial::RateLimited(Denial::InsufficientTokens { .. })
    ));
    assert_eq!(streams.held("k"), 0);
    assert_eq!(rate.remaining("k", 0.0), Ok(2));
    assert_eq!(streams.stats().rate_limited, 1);
}

/// A sweep that unwinds (a key's drop panics on eviction) still gives
/// back the places of the keys it removed: at the cap of one key, the
/// removed key's place goes to the next new key.
#[test]
fn a_key_that_panics_on_eviction_leaves_its_place_under_the_cap() {
    let limiter: ConcurrencyLimiter<DropsBadly, std::hash::RandomState> =
        ConcurrencyLimiter::try_with_hasher(1, std::hash::RandomState::new())
            .unwrap()
            .with_max_keys(1);
    drop(limiter.try_acquire(&DropsBadly::boom(0)).unwrap());
    assert_eq!(limiter.len(), 1);
    assert!(panics(|| limiter.sweep()), "the drop panicked");
    assert_eq!(limiter.len(), 0);
    let next = limiter.try_acquire(&DropsBadly::new(1));
    assert!(next.is_ok(), "the removed key's place was kept: {next:?}");
}

//! Bad input is a plain denial that changes nothing: after any bad call, a
//! bucket behaves exactly like one that never saw it.
#![cfg(not(loom))]

mod common;

use common::keys::{panics, DropsBadly, HashesBadly, Touchy};
use common::model::{as_secs, outcome, Model, Outcome};
use common::sync::returns;
use keyrate::{Denial, TokenBucketLimiter, MAX_TIMESTAMP_NANOS};
use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

const BAD_TIMESTAMPS: &[f64] = &[
    f64::NAN,
    -f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -1e-9,
    -1.0,
    -1e300,
    9_223_372_036.854_776, // just past 2^63 - 1 ns
    1e19,
    f64::MAX,
];

#[test]
fn bad_timestamps_are_denied_and_create_nothing() {
    let limiter = TokenBucketLimiter::new(1.0, 3);
    for &t in BAD_TIMESTAMPS {
        for cost in [0, 1, 3, 4, u64::MAX] {
            assert!(!limiter.allow_n("k", t, cost), "{t} {cost}");
            assert_eq!(limiter.check("k", t, cost), Err(Denial::InvalidTimestamp));
        }
        assert!(!limiter.allow("k", t));
        assert_eq!(limiter.remaining("k", t), Err(Denial::InvalidTimestamp));
        assert_eq!(limiter.sweep(t), 0);
        let handle = limiter.bucket("h");
        assert_eq!(handle.check(t, 1), Err(Denial::InvalidTimestamp));
        assert_eq!(handle.remaining(t), Err(Denial::InvalidTimestamp));
    }
    assert_eq!(limiter.len(), 1, "only the handle's bucket exists");
    assert_eq!(limiter.remaining("k", 0.0), Ok(3));
    assert_eq!(limiter.remaining("h", 0.0), Ok(3));
}

#[test]
fn the_largest_timestamp_is_accepted() {
    let limiter = TokenBucketLimiter::new(1.0, 3);
    // The f64 nearest below 2^63 - 1 ns (f64 spacing there is ~1.9 us).
    let last = 9_223_372_036.854_77;
    assert!(last * 1e9 < MAX_TIMESTAMP_NANOS as f64);
    assert!(limiter.allow("k", last));
    assert_eq!(limiter.remaining("k", last), Ok(2));
}

#[test]
fn absurd_costs_are_plain_denials() {
    let limiter = TokenBucketLimiter::new(1e9, 1 << 62);
    for cost in [(1 << 62) + 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
        assert_eq!(
            limiter.check("k", 1.0, cost),
            Err(Denial::ExceedsCapacity {
                cost,
                capacity: 1 << 62
            })
        );
    }
    assert!(limiter.is_empty());
    // The largest admissible cost still works, and only once.
    assert!(limiter.allow_n("k", 1.0, 1 << 62));
    assert!(!limiter.allow("k", 1.0));
}

/// One call of a trace: a good call, or a bad one injected before it.
#[derive(Debug, Clone)]
struct Call {
    key: u8,
    dt_ms: u64,
    cost: u64,
    bad: Option<(usize, u64)>,
}

fn calls() -> impl Strategy<Value = Vec<Call>> {
    prop::collection::vec(
        (
            0u8..3,
            0u64..1500,
            0u64..6,
            prop::option::weighted(0.4, (0..BAD_TIMESTAMPS.len(), 0u64..8)),
        )
            .prop_map(|(key, dt_ms, cost, bad)| Call {
                key,
                dt_ms,
                cost,
                bad,
            }),
        1..80,
    )
}

proptest! {
    /// A limiter that takes bad calls between the good ones decides every
    /// good call as the independent model, which never sees the bad ones.
    #[test]
    fn bad_calls_leave_no_trace(trace in calls(), backwards_ms in 1u64..5000) {
        let (rate, capacity) = (2.0, 4);
        let mut model = Model::rounded(2, 1, capacity);
        let dirty = TokenBucketLimiter::new(rate, capacity);
        let mut now_ms = 0u64;
        for call in &trace {
            now_ms += call.dt_ms;
            let key = format!("k{}", call.key);
            let (t, seen) = as_secs(now_ms * 1_000_000);
            if let Some((bad, cost)) = call.bad {
                // Invalid timestamps, costs above capacity, u64::MAX: none
                // may change anything.
                prop_assert!(!dirty.allow_n(key.as_str(), BAD_TIMESTAMPS[bad], cost));
                prop_assert!(!dirty.allow_n(key.as_str(), t, 5 + cost));
                prop_assert!(!dirty.allow_n(key.as_str(), t, u64::MAX));
                // A spend stamped in the past, of one token more than the
                // bucket held then, is denied with the model's wait and
                // changes nothing either (an admitted call in the past is
                // tested below).
                let (past, past_seen) =
                    as_secs(now_ms.saturating_sub(backwards_ms) * 1_000_000);
                let held = model.remaining(&key, past_seen);
                if held < capacity {
                    let want = model.call(&key, past_seen, held + 1);
                    prop_assert!(matches!(want, Outcome::Wait { .. }), "{:?}", want);
                    prop_assert_eq!(outcome(dirty.check(key.as_str(), past, held + 1)), want);
                }
            }
            prop_assert_eq!(
                outcome(dirty.check(key.as_str(), t, call.cost)),
                model.call(&key, seen, call.cost),
                "cost {} at {} ms", call.cost, now_ms
            );
            prop_assert_eq!(dirty.len(), model.len());
        }
    }

    #[test]
    fn backwards_time_never_creates_tokens(
        calls in prop::collection::vec((0u64..4000, 0u64..6000, 1u64..4), 1..60),
    ) {
        // Timestamps jump forwards and backwards (up to 6 s back).
        let capacity = 5;
        let limiter = TokenBucketLimiter::new(1.0, capacity);
        let mut model = Model::rounded(1, 1, capacity);
        let (mut latest, mut earliest_admitted) = (0u64, u64::MAX);
        let mut total = 0u64;
        for (forward_ms, back_ms, cost) in calls {
            latest += forward_ms;
            let t_ms = latest.saturating_sub(back_ms);
            let at_latest = latest as f64 / 1e3;
            let before = limiter.remaining("k", at_latest).unwrap();
            let (t, seen) = as_secs(t_ms * 1_000_000);
            let admitted = limiter.allow_n("k", t, cost);
            let after = limiter.remaining("k", at_latest).unwrap();
            // The independent model, time running backwards included.
            let want = model.call("k", seen, cost);
            prop_assert_eq!(admitted, matches!(want, Outcome::Admitted { .. }));
            if admitted {
                // Judged no more leniently than the same call made now...
                prop_assert!(before >= cost, "late call took tokens the bucket lacks now");
                // ...and it only ever spends, at most its cost (less if the
                // tokens it took at `t` have refilled by `latest`): the
                // state never moves back.
                prop_assert!(after <= before && after + cost >= before);
                total += cost;
                earliest_admitted = earliest_admitted.min(t_ms);
            } else {
                prop_assert_eq!(after, before, "a denial changed the bucket");
            }
            // The exact budget: capacity plus 1 token/s over the span.
            let span_ms = latest - earliest_admitted.min(latest);
            prop_assert!(total * 1000 <= capacity * 1000 + span_ms, "over budget");
        }
    }
}

/// A limiter of keys of type `K` at `rate` and `capacity`, with no
/// hot-key cache: a key's only copy is its map entry's.
fn uncached<K: std::hash::Hash + Eq + 'static>(
    rate: f64,
    capacity: u64,
) -> TokenBucketLimiter<K, std::hash::RandomState> {
    let quota = keyrate::Quota::new(rate, capacity).unwrap();
    TokenBucketLimiter::with_quota_and_hasher(quota, std::hash::RandomState::new())
        .with_hot_key_cache(false)
}

/// A call for a new key that panics before its bucket is stored (its
/// `Clone`) gives its place under the cap back, on both stores and for a
/// handle: another new key gets in, and the cap still holds. Nor does it
/// count a bucket created.
#[test]
fn a_new_key_whose_copy_panics_leaves_its_place_under_the_cap() {
    for store in [keyrate::Store::Sharded, keyrate::Store::DashMap] {
        let limiter = uncached::<Touchy>(1.0, 5)
            .with_store(store)
            .with_max_buckets(1)
            .with_auto_sweep(false);
        for _ in 0..3 {
            assert!(panics(|| limiter.allow(&Touchy("boom"), 0.0)));
            assert!(panics(|| limiter.try_bucket(&Touchy("boom"))));
        }
        assert_eq!(limiter.len(), 0, "{store:?}");
        assert_eq!(limiter.stats().buckets_created, 0, "{store:?}");
        assert!(
            limiter.allow(&Touchy("ok"), 0.0),
            "{store:?}: the place was lost"
        );
        assert_eq!(limiter.stats().buckets_created, 1, "{store:?}");
        assert!(
            matches!(
                limiter.check(&Touchy("other"), 0.0, 1),
                Err(Denial::LimiterFull { .. })
            ),
            "{store:?}: the cap holds"
        );
    }
}

/// The concurrency limiter, likewise: a new key whose `Clone` panics, by
/// a try or by a wait, leaves its place under the cap and counts no key
/// created.
#[test]
fn a_new_key_whose_copy_panics_leaves_the_concurrency_limiters_place() {
    let limiter =
        keyrate::ConcurrencyLimiter::<Touchy, _>::try_with_hasher(1, std::hash::RandomState::new())
            .unwrap()
            .with_max_keys(1);
    for _ in 0..3 {
        assert!(panics(|| limiter.try_acquire(&Touchy("boom"))));
        assert!(panics(|| {
            limiter.acquire_blocking(&Touchy("boom"), std::time::Duration::ZERO)
        }));
    }
    assert_eq!(limiter.len(), 0);
    assert_eq!(limiter.stats().keys_created, 0);
    let permit = limiter.try_acquire(&Touchy("ok"));
    assert!(permit.is_ok(), "the place was lost");
    assert_eq!(limiter.stats().keys_created, 1);
    assert!(
        matches!(
            limiter.try_acquire(&Touchy("other")),
            Err(keyrate::ConcurrencyDenial::LimiterFull { .. })
        ),
        "the cap holds"
    );
}

/// A key whose drop panics when the automatic sweep evicts it does not
/// stop the sweep: the step is let go on the way out, and the map stays
/// bounded under a flood of keys each seen once.
#[test]
fn a_key_that_panics_on_eviction_does_not_stop_the_sweep() {
    let limiter = uncached::<DropsBadly>(1e9, 1);
    let mut panics = 0;
    for id in 0..200_000u64 {
        let key = DropsBadly::in_flood(id);
        let at = std::time::Duration::from_micros(id);
        let call = std::panic::AssertUnwindSafe(|| limiter.allow(&key, at));
        match std::panic::catch_unwind(call) {
            Ok(admitted) => assert!(admitted, "key {id} is new"),
            Err(_) => panics += 1,
        }
    }
    assert_eq!(panics, 1, "key 0's copy panicked once, when evicted");
    // Three passes of 8,192 keys at most (docs/memory.md), with room.
    assert!(
        limiter.len() < 50_000,
        "{} buckets: the sweep stopped",
        limiter.len()
    );
}

/// An automatic sweep that hashes a key as it evicts it (one eviction in
/// 256, for its pacing) and unwinds there (the key's `Hash` panics)
/// leaves that key's bucket live in the map, not retired there: once the
/// key hashes again, every key gets its answer.
#[test]
fn a_key_whose_hash_panics_in_the_sweep_leaves_no_dead_bucket() {
    const KEYS: u64 = 20_000;
    let armed = Arc::new(AtomicBool::new(false));
    let limiter = Arc::new(uncached::<HashesBadly>(1e9, 1));
    let at = |id: u64| std::time::Duration::from_micros(id);
    for id in 0..KEYS {
        assert!(limiter.allow(&HashesBadly::new(id, &armed), at(id)));
    }
    // New keys, each full a nanosecond after its call, step the sweep
    // over the keys above; each eviction it samples panics. So may a
    // shard's growth, which hashes stored keys too: every call runs, so
    // that such panics cannot end the loop before the sweep's.
    armed.store(true, SeqCst);
    let panicked = (KEYS..KEYS * 5)
        .filter(|&id| panics(|| limiter.allow(&HashesBadly::new(id, &armed), at(id))))
        .count();
    assert!(panicked > 0, "no stored key was hashed");
    armed.store(false, SeqCst);
    let (caller, armed) = (Arc::clone(&limiter), Arc::clone(&armed));
    let denied = returns(move || {
        (0..KEYS * 5)
            .filter(|&id| !caller.allow(&HashesBadly::new(id, &armed), at(KEYS * 5)))
            .count()
    });
    assert_eq!(denied, 0, "full buckets denied a call");
}

/// A sweep by hand that unwinds (a key's drop panics on eviction) still
/// gives back the places of the buckets it removed: at the cap of one
/// key, the removed key's place goes to the next new key.
#[test]
fn a_key_that_panics_on_eviction_leaves_its_place_under_the_cap() {
    let limiter = uncached::<DropsBadly>(1.0, 5)
        .with_max_buckets(1)
        .with_auto_sweep(false);
    assert!(limiter.allow(&DropsBadly::boom(0), 0.0));
    // Full again at 1 s: the sweep removes it, and its copy's drop panics.
    assert!(panics(|| limiter.sweep(10.0)), "the drop panicked");
    assert_eq!(limiter.len(), 0);
    assert!(
        limiter.allow(&DropsBadly::new(1), 10.0),
        "the removed key's place was kept"
    );
}

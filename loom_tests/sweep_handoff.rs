//! Model 9: the automatic sweep handed from one creation to another.
//!
//! A creation that finds a step due takes the sweep's flag (`sweeping`)
//! with a swap, sweeps one shard by the second-chance rule, advances the
//! cursor and the pass bookkeeping (`cursor`, `slices`, `pass_started`,
//! `idle_since`: plain `Relaxed` fields that only the flag's holder
//! touches), and releases the flag. These models run the real limiter over
//! a two-shard loom store (`loom_api::with_shards`), so a pass takes two
//! steps and the cursor moves, and race two creations that both find a
//! step due. In every interleaving one or both take a step, never at once,
//! each on the shard after the previous step's, and each step retires
//! exactly the buckets idle since the previous pass began.
//!
//! The broken twins switch one step of the real code (`loom_api::Flaw`):
//! the flag taken with a load and a store (two steps at once), or taken
//! and released `Relaxed` (the next holder may read the cursor and pass
//! bookkeeping as they were before the previous step).

use crate::support::{key_in, model};
use keyrate::loom_api::{self, Flaw};
use keyrate::TokenBucketLimiter;
use loom::sync::Arc;

/// Shards of the models' store.
const SHARDS: usize = 2;

/// Two creations at 4 s, each finding a sweep step due, on a limiter
/// (capacity 1, 1 token/s; under loom, every creation finds a step due)
/// prepared so that the race starts a pass: "x0" and "x1" (one per shard)
/// were spent at 0 s and "f0" and "f1" at 2 s, and the pass that ended
/// before the race began at 2 s. The pass the race starts retires the
/// buckets full at 2 s: the x's (full at 1 s), one per step, and none of
/// the f's (full at 3 s), spent since the previous pass began.
fn two_creations_hand_the_sweep_over() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1));
    let (x0, x1) = (key_in("x", 0, SHARDS), key_in("x", 1, SHARDS));
    let (f0, f1) = (key_in("f", 0, SHARDS), key_in("f", 1, SHARDS));
    // Four steps: two passes, begun at 0 s and 2 s.
    for (key, at) in [(&x0, 0.0), (&x1, 0.0), (&f0, 2.0), (&f1, 2.0)] {
        assert!(limiter.allow(key.as_str(), at));
    }
    let before = limiter.stats();
    assert_eq!((before.sweeps, before.buckets_evicted), (4, 0));
    assert_eq!(loom_api::sweep_position(&limiter), (0, 0), "a pass ended");

    let creators: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|key| {
            let limiter = Arc::clone(&limiter);
            loom::thread::spawn(move || limiter.allow(key, 4.0))
        })
        .collect();
    for creator in creators {
        assert!(creator.join().expect("a creator panicked"));
    }

    let stats = limiter.stats();
    let steps = stats.sweeps - before.sweeps;
    // The first creation always steps; the second, unless it finds the
    // first still stepping.
    assert!((1..=2).contains(&steps), "{steps} steps");
    // One step: shard 0 swept (x0 retired), shard 1 next. Two: the pass
    // is over, both x's retired. Held: f0, f1, a, b, and x1 unless the
    // second step retired it.
    let position = if steps == 1 { (1, 1) } else { (0, 0) };
    assert_eq!(
        (
            loom_api::sweep_position(&limiter),
            stats.buckets_evicted,
            limiter.len() as u64
        ),
        (position, steps, 6 - steps),
        "the sweep was not handed over whole: (cursor and steps this pass, \
         evicted, held) after {steps} steps"
    );
    assert_eq!(stats.buckets_created - stats.buckets_evicted, 6 - steps);
}

#[test]
fn two_creations_hand_the_sweep_over_in_turn() {
    loom_api::with_shards(SHARDS, || {
        model(
            "8 sweep hand-off: 2 creations, 2 shards",
            two_creations_hand_the_sweep_over,
        );
    });
}

#[test]
#[should_panic(expected = "the sweep was not handed over whole")]
fn broken_flag_check_then_set_steps_twice_at_once() {
    loom_api::with_shards(SHARDS, || {
        loom_api::with_flaw(Flaw::SweepFlagCheckThenSet, || {
            model(
                "8 broken: sweep flag by check-then-set, 2 creations",
                two_creations_hand_the_sweep_over,
            );
        });
    });
}

#[test]
#[should_panic(expected = "the sweep was not handed over whole")]
fn broken_relaxed_flag_hands_over_a_stale_cursor() {
    loom_api::with_shards(SHARDS, || {
        loom_api::with_flaw(Flaw::SweepFlagRelaxed, || {
            model(
                "8 broken: sweep flag taken and released Relaxed, 2 creations",
                two_creations_hand_the_sweep_over,
            );
        });
    });
}

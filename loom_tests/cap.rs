//! Model 5: the bucket cap (`with_max_buckets`) and its accounting.
//!
//! A call that would create a bucket first reserves a place with a
//! `fetch_add` on the held count, and gives it back if another thread
//! created the key's bucket first or the cap was reached; a sweep gives
//! back the places of the buckets it removed. These models run the real
//! limiter over the loom store (see `first_use.rs` for what that assumes
//! about DashMap), and check that racing creations never exceed the cap
//! and that the count is exact afterwards: exactly `max_buckets - len()`
//! new keys still fit.

use crate::support::{key_in, model};
use keyrate::loom_api::{self, Flaw};
use keyrate::{Denial, TokenBucketLimiter};
use loom::sync::Arc;

/// Asserts that exactly `max_buckets - len()` new keys fit now, so the
/// held count equals the buckets really held.
fn assert_exact_room(limiter: &TokenBucketLimiter, max_buckets: usize, now: f64) {
    let room = max_buckets - limiter.len();
    for i in 0..=room {
        let key = format!("fill-{i}");
        let answer = limiter.check(key.as_str(), now, 1);
        if i < room {
            assert!(
                answer.is_ok(),
                "the cap refused {key} with room left: {answer:?}"
            );
        } else {
            assert_eq!(
                answer,
                Err(Denial::LimiterFull { max_buckets }),
                "the cap let {key} past {max_buckets} buckets"
            );
        }
    }
}

/// Two new keys, one in each of two shards (when the model's store has
/// two), race for the last place under a cap of one bucket. Keys in one
/// shard take turns on its lock, under which a place is reserved; in two
/// shards, only the reservation's `fetch_add` keeps them apart.
fn two_new_keys_race_for_the_last_place() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2).with_max_buckets(1));
    let threads: Vec<_> = [key_in("a", 0, 2), key_in("b", 1, 2)]
        .into_iter()
        .map(|key| {
            let limiter = Arc::clone(&limiter);
            loom::thread::spawn(move || limiter.check(key.as_str(), 0.0, 1))
        })
        .collect();
    let answers: Vec<_> = threads
        .into_iter()
        .map(|thread| thread.join().expect("a caller panicked"))
        .collect();
    let admitted = answers.iter().filter(|answer| answer.is_ok()).count();
    let full = answers
        .iter()
        .filter(|answer| **answer == Err(Denial::LimiterFull { max_buckets: 1 }))
        .count();
    assert_eq!(
        (admitted, full),
        (1, 1),
        "one place, two new keys: {answers:?}"
    );
    assert_eq!(limiter.len(), 1);
    assert_exact_room(&limiter, 1, 0.0);
}

#[test]
fn two_new_keys_race_for_the_last_place_in_one_shard() {
    model(
        "5 cap: 2 threads, new keys a / b, max 1 bucket",
        two_new_keys_race_for_the_last_place,
    );
}

#[test]
fn two_new_keys_in_two_shards_race_for_the_last_place() {
    loom_api::with_shards(2, || {
        model(
            "5 cap: 2 threads, new keys in 2 shards, max 1 bucket",
            two_new_keys_race_for_the_last_place,
        );
    });
}

#[test]
fn creations_and_a_sweep_keep_the_count_exact() {
    model("5 cap: same new key twice + sweep, max 3 buckets", || {
        // "old" is full again at 1 s, so a sweep at 1 s always removes it:
        // the explicit one here, or the automatic step that a creation of
        // "a" takes (under loom every creation takes one). The two calls
        // on "a" race to create one bucket, and the loser must give its
        // reservation back; both sweeps give back the places they free.
        let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1).with_max_buckets(3));
        assert!(limiter.allow("old", 0.0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.allow("a", 1.0))
            })
            .collect();
        let removed = limiter.sweep(1.0);
        let admitted = threads
            .into_iter()
            .map(|thread| thread.join().expect("a caller panicked"))
            .filter(|&admitted| admitted)
            .count();
        assert_eq!(admitted, 1, "capacity 1");
        assert!(removed <= 1, "removed {removed}");
        assert_eq!(
            limiter.len(),
            1,
            "the full bucket of \"old\" is always swept"
        );
        assert_exact_room(&limiter, 3, 1.0);
    });
}

#[test]
fn the_same_new_key_twice_under_a_cap_of_one() {
    model("5 cap: 2 threads, same new key, max 1 bucket", || {
        // Both calls fit in every sequential order, and concurrently too:
        // the place under the cap is reserved under the shard's write lock,
        // only when the key is absent, so the second creator of the same
        // key finds the first one's bucket instead of a full limiter.
        let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2).with_max_buckets(1));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.check("k", 0.0, 1))
            })
            .collect();
        let answers: Vec<_> = threads
            .into_iter()
            .map(|thread| thread.join().expect("a caller panicked"))
            .collect();
        let admitted = answers.iter().filter(|answer| answer.is_ok()).count() as u64;
        assert_eq!(
            admitted, 2,
            "a call on the one key was refused: {answers:?}"
        );
        assert_eq!(limiter.len(), 1);
        assert_eq!(limiter.remaining("k", 0.0), Ok(2 - admitted));
        assert_exact_room(&limiter, 1, 0.0);
    });
}

/// `two_new_keys_race_for_the_last_place` on the real limiter with its
/// reservation broken (`Flaw::ReserveCheckThenAdd`): a load, a comparison
/// with the cap, then an add.
#[test]
#[should_panic(expected = "one place, two new keys")]
fn broken_real_reservation_exceeds_the_cap() {
    loom_api::with_shards(2, || {
        loom_api::with_flaw(Flaw::ReserveCheckThenAdd, || {
            model(
                "5 broken: real limiter, check-then-add reservation, 2 shards",
                two_new_keys_race_for_the_last_place,
            );
        });
    });
}

//! Model 4: eviction racing spends.
//!
//! `TokenBucketLimiter::sweep` retires every full bucket that no live
//! `BucketHandle` shares, with a compare-and-swap of its word to `RETIRED`
//! under the map's write lock, and removes it. The automatic sweep runs the
//! same retirement over one shard at a time, a step taken by a call that
//! creates a bucket; under loom the store is one shard and every creation
//! takes a step, so every model that creates a bucket races the automatic
//! sweep too (`automatic_sweep_step_races_keyed_spends` does so on
//! purpose). Its pacing counters decide when a step runs and nothing
//! else. A step retires only the buckets full at the start of the previous
//! pass (under loom, the previous step): state that only the thread
//! holding the sweep's flag reads or writes, as it does the cursor. The
//! models check that an
//! admitted spend is never swallowed: after the race, the tokens left
//! reflect every admitted spend, whether the spend landed before the
//! retirement (the bucket is then not full and is kept) or after it (on a
//! fresh bucket).

use crate::support::{model, quota, SEC};
use keyrate::loom_api::{self, Bucket, SpendError};
use keyrate::TokenBucketLimiter;
use loom::sync::Arc;

/// The bucket-level protocol on its own, with no lock around it (as
/// eviction that ran without the shard's write lock would see it): a spend
/// and a retirement race on one full bucket.
#[test]
fn retire_races_a_spend_on_the_bucket() {
    model("4 bucket: try_retire vs spend, capacity 2", || {
        check_retire_race(Arc::new(Bucket::with_word(SEC)));
    });
}

/// A spend and a retirement, both at 1 s, on a bucket full at 1 s. Either
/// the spend lands (and the retirement, finding the bucket no longer full,
/// is refused) or the retirement lands (and the spend is sent back with
/// `Retired`, to be retried on a fresh bucket). Never both.
fn check_retire_race(bucket: Arc<Bucket>) {
    let quota = quota(1.0, 2);
    let now = SEC;
    let spender = {
        let bucket = Arc::clone(&bucket);
        loom::thread::spawn(move || bucket.spend(now, 1, &quota))
    };
    let retired = bucket.try_retire(now);
    let spent = spender.join().expect("the spender panicked");
    let word = bucket.word();
    match (spent, retired) {
        (Ok(installed), false) => {
            assert_eq!(word, installed, "the admitted spend's word was overwritten");
            assert_eq!(loom_api::tokens_at(word, now, &quota), 1);
        }
        (Err(SpendError::Retired), true) => assert_eq!(word, loom_api::RETIRED),
        (spent, retired) => panic!(
            "an admitted spend was swallowed: spend {spent:?}, retired {retired}, word {word}"
        ),
    }
}

/// The broken twin of the bucket-level model, on the real bucket with its
/// retirement broken (`Flaw::RetireByBlindStore`): it reads the word,
/// decides the bucket is full, and stores `RETIRED` with no
/// compare-and-swap, over whatever a spend installed in between.
#[test]
#[should_panic(expected = "an admitted spend was swallowed")]
fn broken_retire_by_store_swallows_a_spend() {
    loom_api::with_flaw(loom_api::Flaw::RetireByBlindStore, || {
        model(
            "4 broken: real bucket, retire by a blind store vs spend",
            || {
                check_retire_race(Arc::new(Bucket::with_word(SEC)));
            },
        );
    });
}

/// A limiter whose key "k" spent one token at 0 s: its bucket (capacity 2,
/// 1 token/s) is full again at 1 s, so a sweep at 1 s may evict it.
fn limiter_with_used_key() -> Arc<TokenBucketLimiter> {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2));
    assert!(limiter.allow("k", 0.0));
    limiter
}

/// A creation of another key at 1 s takes an automatic sweep step (under
/// loom, a whole pass over the one shard) that may evict "k", while two
/// keyed spends on "k" race it. The step retires only buckets that were
/// full when the previous pass started, so a first creation at 1 s
/// ("old", before the race) starts that pass: "k", full at 1 s and not
/// spent since, is then the step's to evict, unless a spend lands first.
#[test]
fn automatic_sweep_step_races_keyed_spends() {
    model(
        "4 limiter: a creation's sweep step vs 2 keyed spends, capacity 2",
        || {
            let limiter = limiter_with_used_key();
            assert!(limiter.allow("old", 1.0));
            let spenders: Vec<_> = (0..2)
                .map(|_| {
                    let limiter = Arc::clone(&limiter);
                    loom::thread::spawn(move || limiter.allow("k", 1.0))
                })
                .collect();
            assert!(limiter.allow("new", 1.0), "a new key starts full");
            let admitted = spenders
                .into_iter()
                .map(|thread| thread.join().expect("a spender panicked"))
                .filter(|&admitted| admitted)
                .count();
            assert_eq!(admitted, 2, "both spends fit");
            assert_eq!(
                limiter.len(),
                3,
                "\"k\", \"old\" and \"new\", one bucket each"
            );
            assert_eq!(
                limiter.remaining("k", 1.0),
                Ok(0),
                "an admitted spend was swallowed"
            );
            // "k" was made again exactly when the step evicted it.
            let stats = limiter.stats();
            assert!(stats.buckets_evicted <= 1);
            assert_eq!(stats.buckets_created, 3 + stats.buckets_evicted);
        },
    );
}

#[test]
fn sweep_races_keyed_spends() {
    model("4 limiter: sweep vs 2 keyed spends, capacity 2", || {
        let limiter = limiter_with_used_key();
        let spenders: Vec<_> = (0..2)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.allow("k", 1.0))
            })
            .collect();
        let removed = limiter.sweep(1.0);
        let admitted = spenders
            .into_iter()
            .map(|thread| thread.join().expect("a spender panicked"))
            .filter(|&admitted| admitted)
            .count();
        // The bucket holds 2 at 1 s whether or not it was evicted first.
        assert_eq!(admitted, 2, "both spends fit");
        assert!(removed <= 1);
        assert_eq!(limiter.len(), 1, "the spent key has exactly one bucket");
        assert_eq!(
            limiter.remaining("k", 1.0),
            Ok(0),
            "an admitted spend was swallowed (removed {removed})"
        );
    });
}

#[test]
fn sweep_races_a_live_handle() {
    model(
        "4 limiter: sweep + keyed spend vs live handle, capacity 2",
        || {
            // The handle is made and spends while a sweep runs and a keyed call
            // follows it. The live handle must keep its bucket in the map: were
            // it evicted, the keyed call would spend from a fresh bucket and
            // the map and the handle would disagree.
            let limiter = limiter_with_used_key();
            let handle_thread = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || {
                    let handle = limiter.bucket("k");
                    let admitted = handle.allow(1.0);
                    (handle, admitted)
                })
            };
            let _ = limiter.sweep(1.0);
            let keyed = limiter.allow("k", 1.0);
            let (handle, by_handle) = handle_thread.join().expect("the handle thread panicked");
            assert!(keyed && by_handle, "both spends fit");
            assert_eq!(limiter.len(), 1);
            assert_eq!(
                limiter.remaining("k", 1.0),
                Ok(0),
                "an admitted spend was swallowed"
            );
            assert_eq!(handle.remaining(1.0), Ok(0), "the handle lost its bucket");
        },
    );
}

#[test]
fn sweep_races_a_handle_being_dropped() {
    model(
        "4 limiter: sweep + keyed spend vs dropped handle, capacity 2",
        || {
            // The handle spends and is dropped; the sweep may then see no live
            // handle, but the spend left the bucket not full at 1 s.
            let limiter = limiter_with_used_key();
            let handle_thread = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.bucket("k").allow(1.0))
            };
            let _ = limiter.sweep(1.0);
            let keyed = limiter.allow("k", 1.0);
            let by_handle = handle_thread.join().expect("the handle thread panicked");
            assert!(keyed && by_handle, "both spends fit");
            assert_eq!(limiter.len(), 1);
            assert_eq!(
                limiter.remaining("k", 1.0),
                Ok(0),
                "an admitted spend was swallowed"
            );
        },
    );
}

#[test]
fn sweep_keyed_spend_and_handle_all_race() {
    model(
        "4 limiter: sweep vs keyed spend vs handle made and dropped",
        || {
            // Three threads at once: a handle is made (moving the bucket to a
            // shared one), spends and is dropped; a keyed call follows the key
            // to wherever its bucket is; a sweep may evict the bucket before,
            // between or after. Both spends always fit and both must show.
            let limiter = limiter_with_used_key();
            let handle_thread = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.bucket("k").allow(1.0))
            };
            let keyed_thread = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.allow("k", 1.0))
            };
            let _ = limiter.sweep(1.0);
            let by_handle = handle_thread.join().expect("the handle thread panicked");
            let keyed = keyed_thread.join().expect("the keyed thread panicked");
            assert!(keyed && by_handle, "both spends fit");
            assert_eq!(limiter.len(), 1);
            assert_eq!(
                limiter.remaining("k", 1.0),
                Ok(0),
                "an admitted spend was swallowed"
            );
        },
    );
}

/// A sweep stamped later than a call on the key it removes: the call (on
/// another thread, whose clock read came first) is stamped 1 s, the sweep
/// 3 s. "k", emptied at 0 s (full again at 2 s), holds one token at 1 s
/// whether the sweep removed it or not: the call that lands after the
/// removal starts the key from the removed bucket's word, not from a
/// bucket full at every instant. Exactly one of two such calls is
/// admitted, and the key then holds nothing at 1 s.
#[test]
fn a_sweep_ahead_of_a_call_gives_its_key_no_tokens() {
    model(
        "4 limiter: sweep at 3 s vs a keyed spend stamped 1 s",
        || {
            let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2));
            assert!(limiter.allow_n("k", 0.0, 2));
            let lagging = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.allow("k", 1.0))
            };
            let removed = limiter.sweep(3.0);
            let admitted = lagging.join().expect("the spender panicked");
            assert!(admitted, "the token held at 1 s");
            assert!(removed <= 1);
            assert!(
                !limiter.allow("k", 1.0),
                "a second token at 1 s (removed {removed})"
            );
            assert_eq!(limiter.remaining("k", 1.0), Ok(0));
            // At and after the removed word, the key is as a new key is: full
            // (2 s after the admitted spend at 1 s, whatever the order).
            assert_eq!(limiter.remaining("k", 3.0), Ok(2));
        },
    );
}

/// `a_sweep_ahead_of_a_call_gives_its_key_no_tokens` with a sweep that
/// keeps no mark of the words it removes
/// (`Flaw::RemovedWordForgotten`): the call that lands after the removal
/// finds the key full at 1 s.
#[test]
#[should_panic(expected = "a second token at 1 s")]
fn broken_sweep_forgetting_removed_words_refills_a_key() {
    keyrate::loom_api::with_flaw(keyrate::loom_api::Flaw::RemovedWordForgotten, || {
        a_sweep_ahead_of_a_call_gives_its_key_no_tokens();
    });
}

/// `sweep_races_a_live_handle` on the real limiter with eviction that does
/// not ask whether a handle pins the bucket
/// (`Flaw::EvictIgnoringHandles`): a sweep between the handle's making and
/// its spend retires the bucket under the live handle.
#[test]
#[should_panic(expected = "both spends fit")]
fn broken_eviction_ignoring_handles_loses_a_handle() {
    keyrate::loom_api::with_flaw(keyrate::loom_api::Flaw::EvictIgnoringHandles, || {
        sweep_races_a_live_handle();
    });
}

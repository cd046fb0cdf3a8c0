//! Model 8: concurrency permits (`ConcurrencyLimiter`).
//!
//! A key's permits are one atomic word: takes move it up with a
//! compare-and-swap only while it is below the limit, a dropped `Permit`
//! moves it down once, and the sweep retires an idle slot (0 -> RETIRED,
//! by compare-and-swap) before removing its entry, so a caller that found
//! the slot before the removal and takes a permit on it (the waiting path
//! uses the slot outside the shard lock) either wins, and the slot stays,
//! or finds it retired and looks the key up again. The models count the
//! holders in a separate counter that must never exceed the limit.
//!
//! Broken twins: a check-then-add take, a release by load-then-store, and
//! a removal without retiring: each passes only if loom finds its bug.

use crate::support::model;
use keyrate::loom_api::{self, Entered};
use keyrate::{ConcurrencyLimiter, Permit};
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Arc, RwLock};
use std::collections::HashMap;

/// Holds `permit` while counting it among `holders`, checking the limit.
fn hold(holders: &AtomicUsize, max: usize, permit: Permit) {
    // SeqCst: the counter is the models' own observer, not the protocol.
    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(now <= max, "{now} holders of a key limited to {max}");
    holders.fetch_sub(1, Ordering::SeqCst);
    drop(permit);
}

/// Two threads and the main one race for a key limited to 2: never more
/// than 2 holders at once, at least 2 permits given, none left held.
#[test]
fn racing_acquires_never_exceed_max() {
    model("8 concurrency: 3 racing acquires, max 2", || {
        let limiter = Arc::new(ConcurrencyLimiter::new(2));
        let holders = Arc::new(AtomicUsize::new(0));
        let given = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (limiter, holders, given) = (
                    Arc::clone(&limiter),
                    Arc::clone(&holders),
                    Arc::clone(&given),
                );
                loom::thread::spawn(move || {
                    if let Ok(permit) = limiter.try_acquire("k") {
                        given.fetch_add(1, Ordering::SeqCst);
                        hold(&holders, 2, permit);
                    }
                })
            })
            .collect();
        let mine = limiter.try_acquire("k");
        if let Ok(permit) = mine {
            given.fetch_add(1, Ordering::SeqCst);
            hold(&holders, 2, permit);
        }
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(given.load(Ordering::SeqCst) >= 2);
        assert_eq!(limiter.held("k"), 0);
    });
}

/// The broken twin: read the count, check it, then add. Two takers both
/// see 0 under a limit of 1.
#[test]
#[should_panic(expected = "holders of a key limited to")]
fn broken_check_then_add_exceeds_max() {
    model("8 broken: check-then-add, max 1", || {
        let word = Arc::new(AtomicU64::new(0));
        let holders = Arc::new(AtomicUsize::new(0));
        let take = |word: &AtomicU64, holders: &AtomicUsize| {
            // BROKEN: check, then a separate add.
            if word.load(Ordering::SeqCst) < 1 {
                word.fetch_add(1, Ordering::SeqCst);
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= 1, "{now} holders of a key limited to 1");
                holders.fetch_sub(1, Ordering::SeqCst);
                word.fetch_sub(1, Ordering::SeqCst);
            }
        };
        let other = {
            let (word, holders) = (Arc::clone(&word), Arc::clone(&holders));
            loom::thread::spawn(move || take(&word, &holders))
        };
        take(&word, &holders);
        other.join().unwrap();
    });
}

/// Two permits dropped on two threads while a third caller takes one:
/// each release lands exactly once, so the key ends holding only what is
/// still held, and takes up to the limit again.
#[test]
fn release_exactly_once() {
    model("8 concurrency: 2 racing releases and a take, max 2", || {
        let limiter = Arc::new(ConcurrencyLimiter::new(2));
        let a = limiter.try_acquire("k").unwrap();
        let b = limiter.try_acquire("k").unwrap();
        let releases: Vec<_> = [a, b]
            .into_iter()
            .map(|permit| loom::thread::spawn(move || drop(permit)))
            .collect();
        let taken = limiter.try_acquire("k");
        for release in releases {
            release.join().unwrap();
        }
        assert_eq!(limiter.held("k"), u32::from(taken.is_ok()));
        drop(taken);
        assert_eq!(limiter.held("k"), 0);
        let again = (limiter.try_acquire("k"), limiter.try_acquire("k"));
        assert!(again.0.is_ok() && again.1.is_ok(), "a release was lost");
    });
}

/// The broken twin: a release by load-then-store, racing another
/// release, loses one: the word ends above the permits held.
#[test]
#[should_panic(expected = "a release was lost")]
fn broken_release_by_store_loses_a_release() {
    model("8 broken: release by load-then-store", || {
        let word = Arc::new(AtomicU64::new(2));
        let release = |word: &AtomicU64| {
            // BROKEN: not one read-modify-write.
            let held = word.load(Ordering::SeqCst);
            word.store(held - 1, Ordering::SeqCst);
        };
        let other = {
            let word = Arc::clone(&word);
            loom::thread::spawn(move || release(&word))
        };
        release(&word);
        other.join().unwrap();
        assert_eq!(word.load(Ordering::SeqCst), 0, "a release was lost");
    });
}

/// A sweep removes the idle key "k" while a waiting caller, which found
/// the key's slot before (outside the shard lock), takes a permit on it,
/// and the main thread takes one through the map: never two holders under
/// a limit of 1; nothing held or tracked at the end.
#[test]
fn sweep_racing_acquire_loses_nothing() {
    model(
        "8 concurrency: sweep vs a waiter's take vs try_acquire, max 1",
        || {
            let limiter = Arc::new(ConcurrencyLimiter::new(1));
            drop(limiter.try_acquire("k").unwrap()); // "k" idle: the sweep's to remove
            let holders = Arc::new(AtomicUsize::new(0));
            let waiter = {
                let (limiter, holders) = (Arc::clone(&limiter), Arc::clone(&holders));
                loom::thread::spawn(move || match loom_api::enter(&limiter, "k", 1) {
                    Ok(Entered::Taken(permit)) => hold(&holders, 1, permit),
                    Ok(Entered::Queued(queued)) => {
                        if let Some(permit) = queued.cancel() {
                            hold(&holders, 1, permit);
                        }
                    }
                    Err(denial) => panic!("unexpected {denial:?}"),
                })
            };
            let sweeper = {
                let limiter = Arc::clone(&limiter);
                loom::thread::spawn(move || limiter.sweep())
            };
            if let Ok(permit) = limiter.try_acquire("k") {
                hold(&holders, 1, permit);
            }
            waiter.join().unwrap();
            sweeper.join().unwrap();
            assert_eq!(limiter.held("k"), 0);
            limiter.sweep();
            assert!(limiter.is_empty(), "an idle key was left behind");
            assert!(limiter.try_acquire("k").is_ok(), "a permit was lost");
        },
    );
}

/// The broken twin: the same protocol over a loom lock standing in for
/// the shard, but the sweep removes an entry whose count reads 0 without
/// retiring it. The waiter, holding the removed slot, takes a permit the
/// map no longer counts while the main thread takes one on a fresh slot.
#[test]
#[should_panic(expected = "holders of a key limited to")]
fn broken_remove_without_retiring_lets_two_in() {
    model("8 broken: removal without retiring, max 1", || {
        type Shard = RwLock<HashMap<&'static str, Arc<AtomicU64>>>;
        let shard: Arc<Shard> = Arc::new(RwLock::new(HashMap::new()));
        shard
            .write()
            .unwrap()
            .insert("k", Arc::new(AtomicU64::new(0)));
        let holders = Arc::new(AtomicUsize::new(0));
        // The real take: compare-and-swap below the limit of 1.
        let take = |slot: &AtomicU64| {
            slot.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        };
        let held = |holders: &AtomicUsize| {
            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(now <= 1, "{now} holders of a key limited to 1");
            holders.fetch_sub(1, Ordering::SeqCst);
        };
        let waiter = {
            let (shard, holders) = (Arc::clone(&shard), Arc::clone(&holders));
            loom::thread::spawn(move || {
                let slot = shard.read().unwrap().get("k").cloned();
                if let Some(slot) = slot {
                    if take(&slot) {
                        held(&holders);
                        // Its release (not needed to show the bug).
                    }
                }
            })
        };
        let sweeper = {
            let shard = Arc::clone(&shard);
            loom::thread::spawn(move || {
                // BROKEN: removes an entry that reads idle, with no retire.
                shard
                    .write()
                    .unwrap()
                    .retain(|_, slot| slot.load(Ordering::SeqCst) != 0);
            })
        };
        let slot = Arc::clone(
            shard
                .write()
                .unwrap()
                .entry("k")
                .or_insert_with(|| Arc::new(AtomicU64::new(0))),
        );
        if take(&slot) {
            held(&holders);
        }
        waiter.join().unwrap();
        sweeper.join().unwrap();
    });
}

/// A waiter queued behind a held permit gives up while the permit is
/// released: whichever comes first, the permit is neither lost nor left
/// with the waiter, and the queue empties (a take succeeds again).
#[test]
fn cancelled_waiter_passes_the_permit_on() {
    model(
        "8 concurrency: a queued waiter cancels vs the release, max 1",
        || {
            let limiter = Arc::new(ConcurrencyLimiter::new(1));
            let held = limiter.try_acquire("k").unwrap();
            let queued = match loom_api::enter(&limiter, "k", 1) {
                Ok(Entered::Queued(queued)) => queued,
                other => panic!("expected a place in the queue, got {other:?}"),
            };
            let release = loom::thread::spawn(move || drop(held));
            // The waiter gives up, keeping a permit handed over first.
            let kept = queued.cancel();
            release.join().unwrap();
            assert_eq!(limiter.held("k"), u32::from(kept.is_some()));
            drop(kept);
            assert_eq!(limiter.held("k"), 0);
            assert!(
                limiter.try_acquire("k").is_ok(),
                "the permit or the queue flag was left behind"
            );
        },
    );
}

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
//! Broken twins, each the real limiter with one step switched
//! (`loom_api::Flaw`): a check-then-add take, a release by
//! load-then-store, and a removal without retiring; each passes only if
//! loom finds its bug.

use crate::support::model;
use keyrate::loom_api::{self, Entered, Flaw};
use keyrate::{ConcurrencyLimiter, Permit};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;

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
fn three_racing_acquires_under_two() {
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
}

#[test]
fn racing_acquires_never_exceed_max() {
    model(
        "8 concurrency: 3 racing acquires, max 2",
        three_racing_acquires_under_two,
    );
}

/// The broken twin, on the real limiter with its take broken
/// (`Flaw::PermitTakeCheckThenAdd`): two takers on the fast path both
/// see room for one more, and both add.
#[test]
#[should_panic(expected = "holders of a key limited to")]
fn broken_check_then_add_exceeds_max() {
    loom_api::with_flaw(Flaw::PermitTakeCheckThenAdd, || {
        model(
            "8 broken: real limiter, take by check-then-add, max 2",
            three_racing_acquires_under_two,
        );
    });
}

/// Two permits dropped on two threads while a third caller takes one:
/// each release lands exactly once, so the key ends holding only what is
/// still held, and takes up to the limit again.
fn two_releases_and_a_take() {
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
    assert_eq!(
        limiter.held("k"),
        u32::from(taken.is_ok()),
        "a release was lost or doubled"
    );
    drop(taken);
    assert_eq!(limiter.held("k"), 0);
    let again = (limiter.try_acquire("k"), limiter.try_acquire("k"));
    assert!(again.0.is_ok() && again.1.is_ok(), "a release was lost");
}

#[test]
fn release_exactly_once() {
    model(
        "8 concurrency: 2 racing releases and a take, max 2",
        two_releases_and_a_take,
    );
}

/// The broken twin, on the real limiter with its release broken
/// (`Flaw::PermitReleaseByLoadThenStore`): two releases that load the same
/// count store the same count, and one of them is lost.
#[test]
#[should_panic(expected = "a release was lost")]
fn broken_release_by_store_loses_a_release() {
    loom_api::with_flaw(Flaw::PermitReleaseByLoadThenStore, || {
        model(
            "8 broken: real limiter, release by load-then-store",
            two_releases_and_a_take,
        );
    });
}

/// A sweep removes the idle key "k" while a waiting caller, which found
/// the key's slot before (outside the shard lock), takes a permit on it,
/// and the main thread takes one through the map: never two holders under
/// a limit of 1; nothing held or tracked at the end.
fn sweep_racing_a_waiter_and_a_take() {
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
}

#[test]
fn sweep_racing_acquire_loses_nothing() {
    model(
        "8 concurrency: sweep vs a waiter's take vs try_acquire, max 1",
        sweep_racing_a_waiter_and_a_take,
    );
}

/// The broken twin, on the real limiter with its sweep broken
/// (`Flaw::PermitSlotRemovedWithoutRetiring`): the sweep removes the idle
/// slot without retiring it; the waiter, holding the removed slot, takes
/// a permit the map no longer counts while the main thread takes one on a
/// fresh slot.
#[test]
#[should_panic(expected = "holders of a key limited to")]
fn broken_remove_without_retiring_lets_two_in() {
    loom_api::with_flaw(Flaw::PermitSlotRemovedWithoutRetiring, || {
        model(
            "8 broken: real limiter, removal without retiring, max 1",
            sweep_racing_a_waiter_and_a_take,
        );
    });
}

/// A waiter queued behind a held permit gives up while the permit is
/// released: whichever comes first, the permit is neither lost nor left
/// with the waiter, and the queue empties (a take succeeds again).
#[test]
fn cancelled_waiter_passes_the_permit_on() {
    model(
        "8 concurrency: a queued waiter cancels vs the release, max 1",
        cancel_racing_the_release,
    );
}

/// The broken twin, on the real limiter with its cancel broken
/// (`Flaw::CancelDroppingAGrant`): when the release serves the waiter
/// first, the cancel reports no permit, and the granted one is lost.
#[test]
#[should_panic(expected = "a granted permit was lost")]
fn broken_cancel_dropping_a_grant_loses_a_permit() {
    loom_api::with_flaw(Flaw::CancelDroppingAGrant, || {
        model(
            "8 broken: real limiter, a cancel that drops a grant, max 1",
            cancel_racing_the_release,
        );
    });
}

/// The model of the two tests above.
fn cancel_racing_the_release() {
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
    assert_eq!(
        limiter.held("k"),
        u32::from(kept.is_some()),
        "a granted permit was lost"
    );
    drop(kept);
    assert_eq!(limiter.held("k"), 0);
    assert!(
        limiter.try_acquire("k").is_ok(),
        "the permit or the queue flag was left behind"
    );
}

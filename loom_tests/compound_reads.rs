//! Model 15: a compound denial decided on a lock-free read of a cached
//! cell, or on the thread's memo of its last denial there, racing an
//! admission that spends on the same key: the denial is that of some
//! sequential order, wait and binding quota included (a torn read, some
//! words before the admission and some after, would report a wait that
//! neither order gives), and the admission's order if it had returned
//! before the call began (a memo trusted after the admission reports the
//! read-first order's wait, which only that real-time check tells from a
//! good one).
//! Model 16: a spend from a thread's cache of hot cells racing a sweep
//! that retires the cell: the spend never lands on a retired cell, so it
//! is never lost.
//! Model 19: a call of two scopes, one cell from the thread's cache and
//! one from the map, racing a sweep that retires the cached cell: the
//! spend lands on live cells, or the call goes back through the map.
//! Model 20: a call stamped earlier than a sweep that removes its key's
//! cell: the key restarts from the removed cell's word, so the call finds
//! what the cell held at its instant, whichever comes first.
//!
//! Under loom the caches are per model thread, off unless a limiter turns
//! them on, and a key is promoted on its second lookup through the map.

use crate::support::{model, quota, SEC};
use keyrate::loom_api::{self, Flaw};
use keyrate::{CompoundDenial, CompoundLimiter, Policy, Quota};
use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::sync::Arc;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

const NOW: Duration = Duration::from_secs(10);

/// Quota 0: 1 token/s, capacity 2. Quota 1: one token every 3 s,
/// capacity 3.
fn two_quotas() -> Policy {
    let slow = Quota::with_interval(Duration::from_nanos(3 * SEC), 3).unwrap();
    Policy::new([quota(1.0, 2), slow]).unwrap()
}

/// A limiter whose key "k" has spent 1 (quota 0 holds 1, quota 1 holds
/// 2), and is cached in the calling thread when `cache` is on (its second
/// lookup, a denied call of cost 2, promotes it), with the memo of a
/// third call's denial (cost 2, served by the cache: by quota 0, in 1 s).
fn spent_once(policy: &Policy, cache: bool) -> CompoundLimiter {
    let limiter = CompoundLimiter::new().with_hot_key_cache(cache);
    assert!(limiter.check("k", policy, NOW, 1).is_ok());
    for _ in 0..if cache { 2 } else { 1 } {
        assert!(limiter.check("k", policy, NOW, 2).is_err());
    }
    limiter
}

/// What a run comes to: the admission's outcome, the denial, the words.
type Outcome = (bool, Result<(), CompoundDenial>, [u64; 8]);

/// The outcome of the admission (cost 1) and the read (cost 2) one after
/// the other, `read_first` or not, on a limiter without caches.
fn sequential(policy: &Policy, read_first: bool) -> Outcome {
    let limiter = spent_once(policy, false);
    let read = |l: &CompoundLimiter| l.check("k", policy, NOW, 2).map(drop);
    let mut denial = Ok(());
    if read_first {
        denial = read(&limiter);
    }
    let admitted = limiter.check("k", policy, NOW, 1).is_ok();
    if !read_first {
        denial = read(&limiter);
    }
    let words = loom_api::compound_words(&limiter, "k").unwrap();
    (admitted, denial, words)
}

/// The main thread's cached call of cost 2 (decided by its memo of the
/// same call's denial if no write landed since, else by a lock-free read;
/// a denial in either order) races another thread's admission of cost 1
/// through the map. With the read first, the call is denied by quota 0
/// in 1 s; after the admission, by quota 1 in 3 s; a torn read (quota
/// 0's word after the admission, quota 1's before) would say quota 0 in
/// 2 s.
fn a_read_races_an_admission() {
    let policy = Arc::new(two_quotas());
    let limiter = Arc::new(spent_once(&policy, true));
    // Set once the admission has returned: a call that starts after it
    // must see it (a memo trusted after it would not).
    let done = Arc::new(AtomicBool::new(false));
    let admitter = {
        let (limiter, policy, done) =
            (Arc::clone(&limiter), Arc::clone(&policy), Arc::clone(&done));
        loom::thread::spawn(move || {
            let admitted = limiter.check("k", &policy, NOW, 1).is_ok();
            done.store(true, SeqCst);
            admitted
        })
    };
    // A step before the read at which loom may start the admitter: the
    // read itself writes nothing, and without a step of the main thread's
    // own here loom only ever ran the admitter after it (a torn read then
    // went unseen by the broken twin).
    loom::thread::yield_now();
    let after = done.load(SeqCst);
    let denial = limiter.check("k", &policy, NOW, 2).map(drop);
    let admitted = admitter.join().expect("the admitter panicked");
    let words = loom_api::compound_words(&limiter, "k").unwrap();
    let outcome = (admitted, denial, words);
    // The oracle runs after the race, so that its own calls add no
    // steps to the interleavings explored. A call that started after the
    // admission returned comes after it in every order.
    let allowed = if after {
        vec![sequential(&policy, false)]
    } else {
        vec![sequential(&policy, true), sequential(&policy, false)]
    };
    assert!(
        allowed.contains(&outcome),
        "a torn or stale read: {outcome:?} is no sequential order's: {allowed:?} \
         (the admission had returned: {after})"
    );
}

#[test]
fn compound_reads_are_consistent() {
    model(
        "15 compound: a cached lock-free denial vs an admission",
        a_read_races_an_admission,
    );
}

#[test]
#[should_panic(expected = "a torn or stale read")]
fn broken_compound_memo_ignoring_state() {
    loom_api::with_flaw(Flaw::CompoundMemoIgnoringState, || {
        model(
            "15 broken: the memo of the last denial is trusted after an admission",
            a_read_races_an_admission,
        )
    });
}

#[test]
#[should_panic(expected = "a torn or stale read")]
fn broken_compound_read_without_recheck() {
    loom_api::with_flaw(Flaw::CompoundReadWithoutRecheck, || {
        model(
            "15 broken: the read keeps its words without loading the state again",
            a_read_races_an_admission,
        )
    });
}

/// "k" (quotas of capacity 2 and 4, 1 token/s each) is promoted into the
/// main thread's cache by two spends at 0 s, so its cell is full again at
/// 2 s: a sweep at 2 s races a third spend at 2 s that the cache serves.
fn a_sweep_races_a_cached_spend() {
    let policy = Arc::new(Policy::new([quota(1.0, 2), quota(1.0, 4)]).unwrap());
    let limiter = Arc::new(CompoundLimiter::new().with_hot_key_cache(true));
    assert!(limiter.check("k", &policy, 0.0, 1).is_ok());
    assert!(limiter.check("k", &policy, 0.0, 1).is_ok());
    let sweeper = {
        let limiter = Arc::clone(&limiter);
        loom::thread::spawn(move || limiter.sweep(2.0))
    };
    let admitted = limiter.check("k", &policy, 2.0, 1).is_ok();
    let removed = sweeper.join().expect("the sweeper panicked");
    assert!(admitted, "a full bucket admits");
    assert!(removed <= 1);
    assert_eq!(
        limiter.remaining("k", &policy, 2.0),
        Ok(1),
        "an admitted spend was swallowed (removed {removed})"
    );
    assert_eq!(limiter.len(), 1);
}

#[test]
fn compound_cached_spends_never_land_on_retired_cells() {
    model(
        "16 compound: a sweep vs a cached spend",
        a_sweep_races_a_cached_spend,
    );
}

#[test]
#[should_panic(expected = "an admitted spend was swallowed")]
fn broken_compound_spend_ignoring_retired() {
    loom_api::with_flaw(Flaw::CompoundSpendIgnoringRetired, || {
        model(
            "16 broken: a cached spend locks a retired cell",
            a_sweep_races_a_cached_spend,
        )
    });
}

/// "g" (quotas of capacity 2 and 4, 1 token/s each) is promoted into the
/// main thread's cache by two spends at 0 s, so its cell is full again at
/// 2 s; "k" spends once at 1.5 s, through the map only (not cached, not
/// full at 2 s). A call of both at 2 s takes "g"'s cell from the cache and
/// "k"'s from the map, racing a sweep at 2 s that may retire "g"'s cell:
/// the call's spend lands on live cells, or the call goes back through
/// the map, where "g" is made again.
fn a_sweep_races_a_partly_cached_call() {
    let policy = Arc::new(Policy::new([quota(1.0, 2), quota(1.0, 4)]).unwrap());
    // A fixed hasher: the sweep then visits the two cells in the same
    // order in every execution, as loom requires.
    let limiter = CompoundLimiter::with_hasher(BuildHasherDefault::<DefaultHasher>::default());
    let limiter = Arc::new(limiter.with_hot_key_cache(true));
    assert!(limiter.check("g", &policy, 0.0, 1).is_ok());
    assert!(limiter.check("g", &policy, 0.0, 1).is_ok());
    assert!(limiter.check("k", &policy, 1.5, 1).is_ok());
    assert!(loom_api::compound_cached(&limiter, "g"), "g is cached");
    assert!(!loom_api::compound_cached(&limiter, "k"), "k is not");
    let sweeper = {
        let limiter = Arc::clone(&limiter);
        loom::thread::spawn(move || limiter.sweep(2.0))
    };
    let decided = limiter.check_scopes(&[("k", &*policy), ("g", &*policy)], 2.0, 1);
    let removed = sweeper.join().expect("the sweeper panicked");
    assert!(decided.is_ok(), "full buckets admit: {decided:?}");
    // "k" held 1.5 and 3.5 tokens, "g" 2 and 4.
    for (key, left) in [("k", 0), ("g", 1)] {
        assert_eq!(
            limiter.remaining(key, &policy, 2.0),
            Ok(left),
            "an admitted spend was swallowed on {key} (removed {removed})"
        );
    }
    assert_eq!(limiter.len(), 2);
}

#[test]
fn compound_partly_cached_spends_never_land_on_retired_cells() {
    model(
        "19 compound: a sweep vs a call of a cached key and a new one",
        a_sweep_races_a_partly_cached_call,
    );
}

#[test]
#[should_panic(expected = "an admitted spend was swallowed on g")]
fn broken_compound_partly_cached_spend_ignoring_retired() {
    loom_api::with_flaw(Flaw::CompoundSpendIgnoringRetired, || {
        model(
            "19 broken: a partly cached call locks a retired cell",
            a_sweep_races_a_partly_cached_call,
        )
    });
}

/// "k" (capacity 2, 1 token/s) is emptied at 0 s, so its cell is full
/// again from 2 s. A call stamped 1 s (its thread read the clock before
/// the sweep's) races a sweep stamped 3 s that removes the cell: the call
/// finds the one token the cell held at 1 s whichever comes first (after
/// the removal, the key starts from the removed cell's word, not full),
/// and a second call at 1 s is denied.
fn a_sweep_stamped_later_races_a_call() {
    let policy = Arc::new(Policy::from(quota(1.0, 2)));
    let limiter = Arc::new(CompoundLimiter::with_hasher(BuildHasherDefault::<
        DefaultHasher,
    >::default()));
    assert!(limiter.check("k", &policy, 0.0, 2).is_ok());
    let lagging = {
        let (limiter, policy) = (Arc::clone(&limiter), Arc::clone(&policy));
        loom::thread::spawn(move || limiter.check("k", &policy, 1.0, 1).is_ok())
    };
    let removed = limiter.sweep(3.0);
    let admitted = lagging.join().expect("the caller panicked");
    assert!(admitted, "the token held at 1 s");
    assert!(
        limiter.check("k", &policy, 1.0, 1).is_err(),
        "a second token at 1 s (removed {removed})"
    );
    assert_eq!(limiter.remaining("k", &policy, 1.0), Ok(0));
    assert_eq!(limiter.remaining("k", &policy, 3.0), Ok(2));
}

#[test]
fn compound_sweeps_give_removed_keys_no_tokens() {
    model(
        "20 compound: a sweep at 3 s vs a call stamped 1 s",
        a_sweep_stamped_later_races_a_call,
    );
}

#[test]
#[should_panic(expected = "a second token at 1 s")]
fn broken_compound_sweep_forgetting_removed_words() {
    loom_api::with_flaw(Flaw::RemovedWordForgotten, || {
        model(
            "20 broken: the sweep keeps no removed word",
            a_sweep_stamped_later_races_a_call,
        )
    });
}

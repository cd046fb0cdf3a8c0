//! Model 2: spends at different timestamps, including a thread whose
//! timestamp is older than another's.
//!
//! In every interleaving: no more than `capacity + rate * span` tokens are
//! admitted (`span` from the earliest to the latest timestamp, the bucket
//! full at the start), the outcome is one some sequential order produces,
//! and the bucket's word (its clock, `full_at`) never moves backwards: an
//! observer thread reading it twice never sees it decrease, and it ends at
//! or after every word a spend installed.

use crate::support::{admitted_tokens, assert_sequential, model, quota, spend_programs, Op, SEC};
use keyrate::loom_api::{self, Bucket, Flaw};

/// Rate 1 token/s, so `rate * span` is the span in whole seconds.
fn check_timestamps(capacity: u64, programs: &[Vec<Op>]) {
    let quota = quota(1.0, capacity);
    let cell = loom::sync::Arc::new(Bucket::new());
    // The observer: two reads of the word, in order, must not go backwards.
    let observer = {
        let cell = loom::sync::Arc::clone(&cell);
        loom::thread::spawn(move || {
            let first = cell.word();
            let second = cell.word();
            (first, second)
        })
    };
    let answers = spend_programs(&cell, programs, quota);
    let (first, second) = observer.join().expect("the observer panicked");
    let word = cell.word();
    assert!(
        first <= second && second <= word,
        "the bucket's clock moved backwards: read {first}, then {second}, finally {word}"
    );
    for installed in answers.iter().flatten().flatten() {
        assert!(
            *installed <= word,
            "the bucket's clock moved backwards: a spend installed {installed}, final {word}"
        );
    }
    let times = programs.iter().flatten().map(|op| op.now);
    let span_secs = (times.clone().max().unwrap() - times.min().unwrap()) / SEC;
    let spent = admitted_tokens(programs, &answers);
    assert!(
        spent <= capacity + span_secs,
        "admitted {spent} tokens, more than capacity {capacity} + rate * span {span_secs}"
    );
    assert_sequential(&(answers, word), 0, programs, &quota);
}

fn at(secs: u64, cost: u64) -> Op {
    Op {
        now: secs * SEC,
        cost,
    }
}

#[test]
fn older_timestamp_races_newer() {
    model("2 timestamps 1s / 0s, capacity 2, + observer", || {
        // At 1 s the full bucket admits cost 2; the call stamped 0 s then
        // sees it as it was at 0 s with that spend charged, and is denied.
        // In the other order both are admitted: 3 = capacity + rate * span.
        check_timestamps(2, &[vec![at(1, 2)], vec![at(0, 1)]]);
    });
}

#[test]
fn a_thread_goes_back_in_time() {
    model("2 timestamps 2s,0s / 1s, capacity 2, + observer", || {
        // One thread's own timestamps run backwards; the other sits between.
        check_timestamps(2, &[vec![at(2, 1), at(0, 1)], vec![at(1, 2)]]);
    });
}

/// The real bucket with its spend broken (`Flaw::SpendByLoadThenStore`):
/// the call stamped 0 s decides on the word it loaded before the 1 s call
/// stored its own, then stores a word from the past over it.
#[test]
#[should_panic(expected = "the bucket's clock moved backwards")]
fn broken_load_then_store_moves_the_clock_backwards() {
    loom_api::with_flaw(Flaw::SpendByLoadThenStore, || {
        model("2 broken: real bucket, load-then-store, 1s / 0s", || {
            check_timestamps(2, &[vec![at(1, 2)], vec![at(0, 1)]]);
        });
    });
}

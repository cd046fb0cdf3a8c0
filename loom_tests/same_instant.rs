//! Model 1: threads spend concurrently from one bucket at the same instant.
//!
//! In every interleaving the real compare-and-swap loop (`Bucket::spend`)
//! admits exactly `min(capacity, attempts)` unit calls, and the bucket ends
//! holding exactly `capacity - sum(admitted costs)`: no debit is lost and
//! none is counted twice. Each outcome must also be one that some
//! sequential order of the same calls produces.

use crate::support::{admitted_tokens, assert_sequential, model, quota, run_programs, Op};
use keyrate::loom_api::{self, Flaw};

/// Runs `programs` at t = 0 on a full bucket of `capacity` tokens refilled
/// at 1 token/s (a whole-nanosecond interval, so token counts are exact),
/// and checks the counts. Returns the number of admitted calls.
fn check_same_instant(capacity: u64, programs: &[Vec<Op>]) -> usize {
    let quota = quota(1.0, capacity);
    let outcome = run_programs(0, programs, quota);
    let (answers, word) = &outcome;
    let admitted = answers.iter().flatten().filter(|a| a.is_ok()).count();
    let spent = admitted_tokens(programs, answers);
    assert!(
        spent <= capacity,
        "admitted {spent} tokens from a bucket of {capacity}"
    );
    assert_eq!(
        loom_api::tokens_at(*word, 0, &quota),
        capacity - spent,
        "final content is not capacity - admitted: a debit was lost or doubled ({answers:?})"
    );
    assert_sequential(&outcome, 0, programs, &quota);
    admitted
}

fn unit(n: usize) -> Vec<Op> {
    vec![Op { now: 0, cost: 1 }; n]
}

fn costs(costs: &[u64]) -> Vec<Op> {
    costs.iter().map(|&cost| Op { now: 0, cost }).collect()
}

#[test]
fn three_threads_unit_costs() {
    model("1 same instant, 3 threads x 1 call, capacity 2", || {
        let programs = vec![unit(1), unit(1), unit(1)];
        let admitted = check_same_instant(2, &programs);
        assert_eq!(admitted, 2, "min(capacity, attempts) = 2");
    });
}

#[test]
fn two_threads_two_calls_each() {
    model("1 same instant, 2 threads x 2 calls, capacity 3", || {
        let programs = vec![unit(2), unit(2)];
        let admitted = check_same_instant(3, &programs);
        assert_eq!(admitted, 3, "min(capacity, attempts) = 3");
    });
}

#[test]
fn three_threads_mixed_costs() {
    model("1 same instant, 3 threads costs 2/1/1, capacity 3", || {
        // Depending on the order, 2 + 1 or 1 + 1 is admitted; either way the
        // content left must match exactly.
        let programs = vec![costs(&[2]), costs(&[1]), costs(&[1])];
        let admitted = check_same_instant(3, &programs);
        assert_eq!(admitted, 2, "always exactly two of the three calls fit");
    });
}

#[test]
fn two_threads_mixed_costs_two_calls_each() {
    model(
        "1 same instant, 2 threads costs 2,1 / 1,2, capacity 4",
        || {
            let programs = vec![costs(&[2, 1]), costs(&[1, 2])];
            check_same_instant(4, &programs);
        },
    );
}

/// The real bucket with its spend broken (`Flaw::SpendByLoadThenStore`):
/// both calls decide on the full bucket and both are admitted.
#[test]
#[should_panic(expected = "min(capacity, attempts) = 1")]
fn broken_load_then_store_admits_too_many() {
    loom_api::with_flaw(Flaw::SpendByLoadThenStore, || {
        model("1 broken: real bucket, load-then-store, capacity 1", || {
            let programs = vec![unit(1), unit(1)];
            let admitted = check_counts_only(1, &programs);
            assert_eq!(admitted, 1, "min(capacity, attempts) = 1");
        });
    });
}

/// The same flaw when both calls fit: both are admitted in every order,
/// and the later store erases the other's debit, so the bucket ends with
/// 2 or 1 tokens instead of 0.
#[test]
#[should_panic(expected = "a debit was lost or doubled")]
fn broken_load_then_store_loses_a_debit() {
    loom_api::with_flaw(Flaw::SpendByLoadThenStore, || {
        model(
            "1 broken: real bucket, load-then-store, costs 2 / 1",
            || {
                let programs = vec![costs(&[2]), costs(&[1])];
                check_same_instant(3, &programs);
            },
        );
    });
}

/// The admitted count alone, without the content and sequential checks,
/// so that the over-admission is what the broken model trips on.
fn check_counts_only(capacity: u64, programs: &[Vec<Op>]) -> usize {
    let (answers, _) = run_programs(0, programs, quota(1.0, capacity));
    answers.iter().flatten().filter(|a| a.is_ok()).count()
}

//! Model 12: an operator's reset (the word set back to 0, full) racing
//! spends and the sweep's retirement on one bucket.
//!
//! A reset is the one write that makes a live word smaller, so it is the
//! one write that could break a reader relying on words only growing. In
//! every interleaving the outcome (each call's answer, and the final word)
//! must be one that some sequential order of the calls produces: a spend
//! is never lost half-way nor applied twice across a reset, a reset never
//! revives a retired bucket, and a retirement only takes a full one.

use crate::support::{model, quota, SEC};
use keyrate::loom_api::{self, Bucket, Flaw, SpendError, RETIRED};
use keyrate::{Denial, Quota};
use loom::sync::Arc;

/// One call on the bucket.
#[derive(Debug, Clone, Copy)]
enum Call {
    Spend { now: u64, cost: u64 },
    Reset,
    Retire { now: u64 },
}

/// What a call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Spent(Result<u64, Denial>),
    Retired,
    Reset(bool),
    Took(bool),
}

/// Makes `call` on the real bucket.
fn call(bucket: &Bucket, call: Call, quota: &Quota) -> Answer {
    match call {
        Call::Spend { now, cost } => match bucket.spend(now, cost, quota) {
            Ok(word) => Answer::Spent(Ok(word)),
            Err(SpendError::Denied(denial)) => Answer::Spent(Err(denial)),
            Err(SpendError::Retired) => Answer::Retired,
            Err(SpendError::Moved) => panic!("nobody moves this bucket"),
        },
        Call::Reset => Answer::Reset(bucket.reset().is_ok()),
        Call::Retire { now } => Answer::Took(bucket.try_retire(now)),
    }
}

/// The sequential effect of `call` on `word`.
fn apply(word: u64, call: Call, quota: &Quota) -> (u64, Answer) {
    match (word, call) {
        (RETIRED, Call::Spend { .. }) => (word, Answer::Retired),
        (_, Call::Spend { now, cost }) => {
            let answer = loom_api::decide(word, now, cost, quota);
            (*answer.as_ref().unwrap_or(&word), Answer::Spent(answer))
        }
        (RETIRED, Call::Reset) => (word, Answer::Reset(false)),
        (_, Call::Reset) => (0, Answer::Reset(true)),
        (_, Call::Retire { now }) if loom_api::is_full(word, now) => (RETIRED, Answer::Took(true)),
        (_, Call::Retire { .. }) => (word, Answer::Took(false)),
    }
}

type Outcome = (Vec<Vec<Answer>>, u64);

fn explore(
    word: u64,
    programs: &[Vec<Call>],
    quota: &Quota,
    answers: &mut Vec<Vec<Answer>>,
    outcomes: &mut Vec<Outcome>,
) {
    let mut any = false;
    for thread in 0..programs.len() {
        let Some(&call) = programs[thread].get(answers[thread].len()) else {
            continue;
        };
        any = true;
        let (next, answer) = apply(word, call, quota);
        answers[thread].push(answer);
        explore(next, programs, quota, answers, outcomes);
        answers[thread].pop();
    }
    if !any {
        outcomes.push((answers.clone(), word));
    }
}

fn check(initial: u64, programs: Vec<Vec<Call>>) {
    let quota = quota(1.0, 2);
    let cell = Arc::new(Bucket::with_word(initial));
    let threads: Vec<_> = programs
        .iter()
        .cloned()
        .map(|program| {
            let cell = Arc::clone(&cell);
            loom::thread::spawn(move || {
                program
                    .into_iter()
                    .map(|next| call(&cell, next, &quota))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let answers: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let outcome = (answers, cell.word());
    let mut allowed = Vec::new();
    let mut scratch = programs.iter().map(|_| Vec::new()).collect();
    explore(initial, &programs, &quota, &mut scratch, &mut allowed);
    assert!(
        allowed.contains(&outcome),
        "not linearizable: {outcome:?} is none of {allowed:?}"
    );
}

const SPEND: Call = Call::Spend { now: SEC, cost: 1 };

#[test]
fn reset_races_spends() {
    model("12 reset: a reset racing two spenders, capacity 2", || {
        // The bucket starts empty at 1 s (full at 3 s).
        check(
            3 * SEC,
            vec![vec![SPEND, SPEND], vec![Call::Reset], vec![SPEND]],
        );
    });
}

#[test]
fn reset_races_retirement() {
    model("12 reset: a reset racing a spend and a retirement", || {
        // Full at 1 s: the sweep may retire it; a spend makes it not full.
        check(
            SEC,
            vec![
                vec![SPEND],
                vec![Call::Reset],
                vec![Call::Retire { now: SEC }],
            ],
        );
    });
}

/// The real bucket with its reset broken (`Flaw::ResetByPlainStore`): a
/// reset after the retirement stores 0 over `RETIRED`, reviving a bucket
/// the sweep has removed from its map.
#[test]
#[should_panic(expected = "not linearizable")]
fn broken_blind_reset_revives_a_retired_bucket() {
    loom_api::with_flaw(Flaw::ResetByPlainStore, || {
        model(
            "12 broken: real bucket, reset by a plain store of 0",
            || {
                check(
                    SEC,
                    vec![vec![Call::Reset], vec![Call::Retire { now: SEC }]],
                );
            },
        );
    });
}

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
use keyrate::loom_api::{self, Bucket, SpendError, RETIRED};
use keyrate::{Denial, Quota};
use loom::sync::atomic::{AtomicU64, Ordering};
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

/// A bucket the model runs on: the real one, or a broken reset.
trait Cell: Send + Sync + 'static {
    fn with_word(word: u64) -> Self;
    fn call(&self, call: Call, quota: &Quota) -> Answer;
    fn word(&self) -> u64;
}

impl Cell for Bucket {
    fn with_word(word: u64) -> Self {
        Bucket::with_word(word)
    }

    fn call(&self, call: Call, quota: &Quota) -> Answer {
        match call {
            Call::Spend { now, cost } => match self.spend(now, cost, quota) {
                Ok(word) => Answer::Spent(Ok(word)),
                Err(SpendError::Denied(denial)) => Answer::Spent(Err(denial)),
                Err(SpendError::Retired) => Answer::Retired,
                Err(SpendError::Moved) => panic!("nobody moves this bucket"),
            },
            Call::Reset => Answer::Reset(self.reset().is_ok()),
            Call::Retire { now } => Answer::Took(self.try_retire(now)),
        }
    }

    fn word(&self) -> u64 {
        Bucket::word(self)
    }
}

/// A broken reset: a plain store of 0, markers or not, over a bucket
/// whose spends and retirement are the real protocol's compare-and-swap
/// loops. It revives a bucket the sweep has retired (and removed from its
/// map): later spends land on a bucket nobody can find any more.
struct BlindReset {
    full_at: AtomicU64,
}

impl Cell for BlindReset {
    fn with_word(word: u64) -> Self {
        BlindReset {
            full_at: AtomicU64::new(word),
        }
    }

    fn call(&self, call: Call, quota: &Quota) -> Answer {
        // SeqCst: the bug is the blind store, not an ordering.
        let mut current = self.full_at.load(Ordering::SeqCst);
        loop {
            let next = match call {
                Call::Reset => {
                    self.full_at.store(0, Ordering::SeqCst);
                    return Answer::Reset(true);
                }
                Call::Spend { .. } if current == RETIRED => return Answer::Retired,
                Call::Spend { now, cost } => match loom_api::decide(current, now, cost, quota) {
                    Ok(next) => next,
                    Err(denial) => return Answer::Spent(Err(denial)),
                },
                Call::Retire { now } if loom_api::is_full(current, now) => RETIRED,
                Call::Retire { .. } => return Answer::Took(false),
            };
            match self
                .full_at
                .compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) if next == RETIRED => return Answer::Took(true),
                Ok(_) => return Answer::Spent(Ok(next)),
                Err(actual) => current = actual,
            }
        }
    }

    fn word(&self) -> u64 {
        self.full_at.load(Ordering::SeqCst)
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

fn check<C: Cell>(initial: u64, programs: Vec<Vec<Call>>) {
    let quota = quota(1.0, 2);
    let cell = Arc::new(C::with_word(initial));
    let threads: Vec<_> = programs
        .iter()
        .cloned()
        .map(|program| {
            let cell = Arc::clone(&cell);
            loom::thread::spawn(move || {
                program
                    .into_iter()
                    .map(|call| cell.call(call, &quota))
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
    model("8: a reset racing two spenders, capacity 2", || {
        // The bucket starts empty at 1 s (full at 3 s).
        check::<Bucket>(
            3 * SEC,
            vec![vec![SPEND, SPEND], vec![Call::Reset], vec![SPEND]],
        );
    });
}

#[test]
fn reset_races_retirement() {
    model("8: a reset racing a spend and a retirement", || {
        // Full at 1 s: the sweep may retire it; a spend makes it not full.
        check::<Bucket>(
            SEC,
            vec![
                vec![SPEND],
                vec![Call::Reset],
                vec![Call::Retire { now: SEC }],
            ],
        );
    });
}

#[test]
#[should_panic(expected = "not linearizable")]
fn broken_blind_reset_revives_a_retired_bucket() {
    model(
        "12 broken: a reset that stores 0 over a retired bucket",
        || {
            check::<BlindReset>(
                SEC,
                vec![vec![Call::Reset], vec![Call::Retire { now: SEC }]],
            );
        },
    );
}

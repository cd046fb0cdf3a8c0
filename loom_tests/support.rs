//! Shared pieces of the models: the model runner and the sequential oracle.

use keyrate::loom_api::{self, Bucket, SpendError};
use keyrate::{Denial, Quota};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// One second in nanoseconds.
pub const SEC: u64 = 1_000_000_000;

/// The preemption bound used when `LOOM_MAX_PREEMPTIONS` is unset (loom's
/// own default is unbounded).
const DEFAULT_PREEMPTIONS: usize = 3;

/// Runs `f` under loom at `LOOM_MAX_PREEMPTIONS` (3 if unset), and reports on
/// stderr how many interleavings were explored and how long it took.
pub fn model<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    let bound = builder.preemption_bound;
    // Counts executions; a std atomic outside the model, read after it.
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    let start = Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom model {name}: {} interleavings, preemption bound {:?}, {:.2?}",
        runs.load(Ordering::Relaxed),
        bound,
        start.elapsed()
    );
}

/// The first key `{prefix}{i}` that lives in `shard` of a map of
/// `shards` shards (see `loom_api::with_shards`).
pub fn key_in(prefix: &str, shard: usize, shards: usize) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|key| loom_api::shard_of(key.as_str(), shards) == shard)
        .expect("some key lands in every shard")
}

/// A quota that the tests construct from known-good values.
pub fn quota(rate: f64, capacity: u64) -> Quota {
    Quota::new(rate, capacity).expect("a valid test quota")
}

/// One call on a bucket: spend `cost` tokens at `now` nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub now: u64,
    pub cost: u64,
}

/// What one call returned: the new word, or the denial.
pub type Answer = Result<u64, Denial>;

/// Everything a run returns: each thread's answers, and the final word.
pub type Outcome = (Vec<Vec<Answer>>, u64);

/// Spends `op.cost` tokens at `op.now` from the real bucket.
fn spend(bucket: &Bucket, op: Op, quota: &Quota) -> Answer {
    match bucket.spend(op.now, op.cost, quota) {
        Ok(word) => Ok(word),
        Err(SpendError::Denied(denial)) => Err(denial),
        // Nobody retires or moves the buckets these programs run on.
        Err(other) => panic!("a bucket nobody retires or moves answered {other:?}"),
    }
}

/// Runs each program on its own loom thread against `bucket`, and returns
/// each thread's answers, in program order. Call inside a loom model.
pub fn spend_programs(
    bucket: &loom::sync::Arc<Bucket>,
    programs: &[Vec<Op>],
    quota: Quota,
) -> Vec<Vec<Answer>> {
    let threads: Vec<_> = programs
        .iter()
        .cloned()
        .map(|program| {
            let bucket = loom::sync::Arc::clone(bucket);
            loom::thread::spawn(move || {
                program
                    .iter()
                    .map(|&op| spend(&bucket, op, &quota))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().expect("a model thread panicked"))
        .collect()
}

/// Runs each program on its own loom thread against one real bucket
/// starting at `initial`; returns the outcome. Call inside a loom model.
pub fn run_programs(initial: u64, programs: &[Vec<Op>], quota: Quota) -> Outcome {
    let bucket = loom::sync::Arc::new(Bucket::with_word(initial));
    let answers = spend_programs(&bucket, programs, quota);
    (answers, bucket.word())
}

/// Asserts that `outcome` is one that some sequential order of the
/// programs' calls produces.
pub fn assert_sequential(outcome: &Outcome, initial: u64, programs: &[Vec<Op>], quota: &Quota) {
    let allowed = sequential_outcomes(initial, programs, quota);
    assert!(
        allowed.contains(outcome),
        "not linearizable: {outcome:?} is none of the sequential outcomes {allowed:?}"
    );
}

/// Every outcome a sequential run of `programs` can have: one per
/// interleaving that keeps each thread's calls in program order, each call
/// applied with the pure decision `gcra::decide`.
///
/// A concurrent run is correct (linearizable, for these programs) iff its
/// outcome is one of these.
pub fn sequential_outcomes(initial: u64, programs: &[Vec<Op>], quota: &Quota) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut answers: Vec<Vec<Answer>> = programs.iter().map(|_| Vec::new()).collect();
    explore(initial, programs, quota, &mut answers, &mut outcomes);
    outcomes
}

fn explore(
    word: u64,
    programs: &[Vec<Op>],
    quota: &Quota,
    answers: &mut Vec<Vec<Answer>>,
    outcomes: &mut Vec<Outcome>,
) {
    let mut any = false;
    for thread in 0..programs.len() {
        let done = answers[thread].len();
        let Some(op) = programs[thread].get(done) else {
            continue;
        };
        any = true;
        let answer = loom_api::decide(word, op.now, op.cost, quota);
        let next = *answer.as_ref().unwrap_or(&word);
        answers[thread].push(answer);
        explore(next, programs, quota, answers, outcomes);
        answers[thread].pop();
    }
    if !any {
        outcomes.push((answers.clone(), word));
    }
}

/// The tokens admitted by `answers`, weighted by each call's cost.
pub fn admitted_tokens(programs: &[Vec<Op>], answers: &[Vec<Answer>]) -> u64 {
    programs
        .iter()
        .zip(answers)
        .flat_map(|(program, answers)| program.iter().zip(answers))
        .filter(|(_, answer)| answer.is_ok())
        .map(|(op, _)| op.cost)
        .sum()
}

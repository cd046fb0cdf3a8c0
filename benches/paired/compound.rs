//! The paired harness's compound scenarios (issue 22): governor doing one
//! quota beside keyrate's single-quota call, compound calls of one and
//! two quotas, three sequential calls and one three-scope call.

use super::{median, Pick, Slice, SLICE, STEP_NS};
use crate::common::compound::{KeyrateCompound, KeyrateScopes, SequentialScopes};
use crate::common::{api_key, Governor, Keyrate, Spec};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// The compound scenarios' competitors, governor first.
fn build_compound(spec: Spec, table: &Arc<[String]>) -> Vec<Box<dyn Slice>> {
    vec![
        Box::new(Governor::new(spec, table.clone())),
        Box::new(Keyrate::new(spec, table.clone())),
        Box::new(KeyrateCompound::new(spec, table.clone(), 1)),
        Box::new(KeyrateCompound::new(spec, table.clone(), 2)),
        Box::new(SequentialScopes::new(spec, table.clone())),
        Box::new(KeyrateScopes::new(spec, table.clone())),
    ]
}

/// The compound scenarios, by name: spec, keys and pick.
const SCENARIOS: [(&str, Spec, usize, Pick); 2] = [
    (
        "compound: spread 100000 keys",
        Spec::ADMIT,
        100_000,
        Pick::Spread(100_000),
    ),
    (
        "compound: 1 hammered key, denied",
        Spec::DENY,
        1,
        Pick::Rotate(1),
    ),
];

/// The compound scenarios asked for by `KEYRATE_PAIRED_ONLY` (all without).
fn chosen() -> impl Iterator<Item = (&'static str, Spec, usize, Pick)> {
    let only = std::env::var("KEYRATE_PAIRED_ONLY").ok();
    SCENARIOS.into_iter().filter(move |(name, ..)| {
        only.as_ref()
            .map_or(true, |only| name.contains(only.as_str()))
    })
}

/// `KEYRATE_PAIRED_PROFILE=N` for the compound scenarios: competitor `N`
/// of [`build_compound`] alone, one thread, `rounds` slices, timing
/// nothing (see the main harness's `profile`).
pub(crate) fn profile_compound(rounds: usize, which: usize) {
    let sim = AtomicU64::new(1_000_000_000);
    for (_, spec, keys, pick) in chosen() {
        let table: Arc<[String]> = (0..keys as u64).map(api_key).collect();
        let competitor = build_compound(spec, &table).swap_remove(which);
        competitor.warm(
            keys,
            sim.fetch_add(keys as u64 * STEP_NS + 1_000_000_000, Relaxed),
        );
        for _ in 0..rounds {
            let base = sim.fetch_add(SLICE * STEP_NS + 1_000_000_000, Relaxed);
            competitor.slice(1, pick, base, keys);
        }
    }
}

/// The compound scenarios: every competitor warmed on the keys, then
/// paired rounds at 1 and 2 threads.
pub(crate) fn compound(rounds: usize, sim: &AtomicU64) {
    let competitor: Option<usize> = std::env::var("KEYRATE_PAIRED_COMPETITOR")
        .ok()
        .and_then(|i| i.parse().ok());
    let runs = |which: usize| competitor.map_or(true, |only| only == which);
    println!();
    println!(
        "| scenario | threads | keyrate, 1 quota | compound, 1 quota | compound, 2 quotas | \
         3 sequential calls | compound, 3 scopes | time 2 quotas / 1 quota (single) | \
         time 3 scopes / 3 sequential |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, spec, keys, pick) in chosen() {
        let table: Arc<[String]> = (0..keys as u64).map(api_key).collect();
        for threads in [1, 2] {
            // New limiters for each thread count, as in the main table.
            let competitors = build_compound(spec, &table);
            let base = sim.fetch_add(keys as u64 * STEP_NS + 1_000_000_000, Relaxed);
            for (which, competitor) in competitors.iter().enumerate() {
                if runs(which) {
                    competitor.warm(keys, base);
                }
            }
            let mut ratios = vec![Vec::new(); competitors.len()];
            let (mut two_to_one, mut scopes_to_sequential) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let mut times = vec![Duration::ZERO; competitors.len()];
                for turn in 0..competitors.len() {
                    let which = (round + turn) % competitors.len();
                    let base = sim.fetch_add(SLICE * STEP_NS + 1_000_000_000, Relaxed);
                    if runs(which) {
                        times[which] = competitors[which].slice(threads, pick, base, keys);
                    }
                }
                for (which, time) in times.iter().enumerate() {
                    ratios[which].push(times[0].as_secs_f64() / time.as_secs_f64());
                }
                two_to_one.push(times[3].as_secs_f64() / times[1].as_secs_f64());
                scopes_to_sequential.push(times[5].as_secs_f64() / times[4].as_secs_f64());
            }
            print!("| {name} | {threads} |");
            for ratio in ratios.into_iter().skip(1) {
                let (mid, low, high) = median(ratio);
                print!(" {mid:.2}x [{low:.2}-{high:.2}] |");
            }
            for ratio in [two_to_one, scopes_to_sequential] {
                let (mid, low, high) = median(ratio);
                print!(" {mid:.2} [{low:.2}-{high:.2}] |");
            }
            println!();
        }
    }
}

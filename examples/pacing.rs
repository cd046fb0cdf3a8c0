//! How many buckets the automatic sweep makes again: the everyday workload
//! of `benches/paired.rs` (one of `keys` active keys at random, and one
//! call in `new_one_in` a key never seen before; 200,000 calls a slice,
//! caller time 1 µs a call and about 10 s between slices, as the paired
//! bench's interleaving leaves it), on one thread, counting every call's
//! key to know the floor: the buckets no limiter can avoid making (first
//! sightings). What keyrate makes above it are keys it evicted and that
//! came back. No timing: counts only.
//!
//! Each run is a new limiter, whose hasher (and so which evictions the
//! sweep's ghosts sample) is seeded anew: runs of one build differ, and
//! the run-to-run spread is part of the answer.
//!
//! ```text
//! cargo run --release --example pacing -- [keys] [slices] [new_one_in] [runs]
//! cargo run --release --example pacing                      # 10^6 keys, 15 slices, 1 in 100, 8 runs
//! cargo run --release --example pacing -- 100000 40 2 4     # returning keys and as many one-shot
//! ```

use keyrate::TokenBucketLimiter;

/// Calls in a slice (the paired bench's, per thread).
const SLICE: u64 = 200_000;
/// Caller time a call takes, and between two of keyrate's slices (the
/// paired bench runs eight competitors' slices in turn, each 0.2 s of
/// caller time and 1 s apart).
const CALL_NS: u64 = 1_000;
const BETWEEN_SLICES_NS: u64 = 8 * (SLICE * CALL_NS + 1_000_000_000);

/// The benches' key shape and picks (`api_key`, `mix`, `one_of`).
#[path = "../benches/common/keys.rs"]
mod keys;

use keys::{api_key, mix, one_of};

/// One run's counts.
struct Run {
    created: u64,
    floor: u64,
    most_held: usize,
}

fn run(keys: &[String], active: usize, slices: u64, new_one_in: u64, seed: u64) -> Run {
    let limiter = TokenBucketLimiter::new(1e9, u64::from(u32::MAX));
    let mut seen = vec![false; keys.len()];
    let (mut floor, mut most_held) = (0, 0);
    let mut fresh = active;
    let mut base = 1_000_000_000;
    for _ in 0..slices {
        let mut state = mix(base ^ seed);
        for i in 0..SLICE {
            let key = if i % new_one_in == new_one_in - 1 {
                fresh += 1;
                fresh - 1
            } else {
                one_of(&mut state, active)
            };
            if !seen[key] {
                seen[key] = true;
                floor += 1;
            }
            let at = (base + i * CALL_NS) as f64 / 1e9;
            assert!(limiter.allow(keys[key].as_str(), at), "every call admitted");
        }
        most_held = most_held.max(limiter.len());
        base += BETWEEN_SLICES_NS;
    }
    Run {
        created: limiter.stats().buckets_created,
        floor,
        most_held,
    }
}

fn main() {
    let arg = |n: usize, default: u64| {
        std::env::args()
            .nth(n)
            .map_or(default, |arg| arg.parse().expect("a whole number"))
    };
    let active = arg(1, 1_000_000) as usize;
    let slices = arg(2, 15);
    let new_one_in = arg(3, 100).max(1);
    let runs = arg(4, 8);
    let calls = slices * SLICE;
    let keys: Vec<String> = (0..(active as u64 + calls / new_one_in))
        .map(api_key)
        .collect();
    println!(
        "{active} active keys, 1 call in {new_one_in} a new key, {slices} slices of {SLICE} calls, \
         {runs} runs (a new limiter each)"
    );
    println!();
    println!("| run | created per 10^6 calls | floor per 10^6 | over the floor, % of calls | most buckets held |");
    println!("|---:|---:|---:|---:|---:|");
    let mut over = Vec::new();
    for seed in 0..runs {
        let counts = run(&keys, active, slices, new_one_in, seed);
        let per_million = |n: u64| n as f64 * 1e6 / calls as f64;
        let excess = (counts.created - counts.floor) as f64 * 100.0 / calls as f64;
        println!(
            "| {seed} | {:.0} | {:.0} | {excess:.2} | {} |",
            per_million(counts.created),
            per_million(counts.floor),
            counts.most_held
        );
        over.push(excess);
    }
    over.sort_by(f64::total_cmp);
    if let (Some(low), Some(high)) = (over.first(), over.last()) {
        println!();
        println!(
            "over the floor: median {:.2}% of calls [{low:.2}-{high:.2}]",
            over[over.len() / 2]
        );
    }
}

//! Paired ratios: competitors run in short alternating slices within one
//! process, so that a slow or a fast phase of the machine (the shared
//! 2-core box drifts by 2x between runs) falls on all of them alike.
//!
//! For each scenario and thread count, every round runs each competitor for
//! one slice of `SLICE` calls per thread, in an order that rotates from
//! round to round; the ratio of a round is governor's time divided by the
//! competitor's time in that round. Prints the median of the rounds' ratios
//! with the lowest and highest round, as a markdown table.
//!
//! ```text
//! cargo bench --bench paired                    # 15 rounds
//! KEYRATE_PAIRED_ROUNDS=31 cargo bench --bench paired
//! KEYRATE_PAIRED_ONLY=hammered cargo bench --bench paired  # scenarios whose name holds it
//! KEYRATE_PAIRED_ONLY=churn cargo bench --bench paired     # new keys only
//! ```

#[allow(dead_code)]
mod common;

use common::{api_key, mix, Competitor, DashWord, Governor, Keyrate, KeyrateUnder, Spec};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls per thread in one slice.
const SLICE: u64 = 200_000;
/// Keys per slice in the churn scenario (the criterion bench's round).
const CHURN: usize = 100_000;
/// Caller time between two calls of one thread.
const STEP_NS: u64 = 1_000;

/// Which key a thread calls on its `i`th call.
#[derive(Clone, Copy)]
enum Pick {
    /// One of `n` keys at random.
    Spread(usize),
    /// Keys `0..k` in turn.
    Rotate(usize),
    /// Every call a key the limiter has never seen: `n` keys per slice,
    /// split between the threads, on a limiter made for the slice.
    Fresh(usize),
}

impl Pick {
    /// Calls per thread in one slice.
    fn calls(self, threads: usize) -> u64 {
        match self {
            Pick::Fresh(n) => (n / threads) as u64,
            _ => SLICE,
        }
    }
}

/// Runs a slice's calls (see [`Pick::calls`]) on each of `threads`
/// threads from caller time `base`;
/// returns the wall time from the first start to the last end.
fn slice<C: Competitor>(limiter: &C, threads: usize, pick: Pick, base: u64) -> Duration {
    let arrived = AtomicUsize::new(0);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let arrived = &arrived;
                scope.spawn(move || {
                    let local = limiter.local();
                    let mut state = mix(thread as u64 + base);
                    arrived.fetch_add(1, Relaxed);
                    while arrived.load(Relaxed) < threads {
                        std::thread::yield_now();
                    }
                    let start = Instant::now();
                    let mut ns = base;
                    for i in 0..pick.calls(threads) {
                        let key = match pick {
                            Pick::Spread(n) => {
                                state = mix(state);
                                (((state >> 32) * n as u64) >> 32) as usize
                            }
                            Pick::Rotate(k) => (thread + i as usize) % k,
                            Pick::Fresh(n) => thread * (n / threads) + i as usize,
                        };
                        std::hint::black_box(limiter.call(&local, key, ns, ns as f64 * 1e-9, 1));
                        ns += STEP_NS;
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap();
    let end = spans.iter().map(|s| s.1).max().unwrap();
    end - start
}

/// A competitor behind one object-safe face.
trait Slice: Sync {
    fn warm(&self, keys: usize);
    fn slice(&self, threads: usize, pick: Pick, base: u64) -> Duration;
    fn promotions(&self) -> Option<u64>;
}

impl<C: Competitor> Slice for C {
    fn warm(&self, keys: usize) {
        let local = self.local();
        for key in 0..keys {
            let _ = self.call(&local, key, 0, 0.0, 1);
        }
    }
    fn slice(&self, threads: usize, pick: Pick, base: u64) -> Duration {
        slice(self, threads, pick, base)
    }
    fn promotions(&self) -> Option<u64> {
        Competitor::promotions(self)
    }
}

/// The competitors, governor first (the ratios' denominator) and keyrate
/// as users get it second.
fn build(spec: Spec, table: &Arc<[String]>) -> Vec<Box<dyn Slice>> {
    vec![
        Box::new(Governor::new(spec, table.clone())),
        Box::new(Keyrate::new(spec, table.clone())),
        Box::new(Keyrate::without_hot_key_cache(spec, table.clone())),
        Box::new(Keyrate::without_stats(spec, table.clone())),
        Box::new(KeyrateUnder::new(spec, table.clone())),
        Box::new(DashWord::new(spec, table.clone())),
        Box::new(Keyrate::over_dashmap(spec, table.clone())),
    ]
}

fn median(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn main() {
    let rounds: usize = std::env::var("KEYRATE_PAIRED_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let scenarios: Vec<(String, Spec, usize, Pick)> = [10_000, 100_000, 1_000_000]
        .into_iter()
        .map(|n| (format!("spread {n} keys"), Spec::ADMIT, n, Pick::Spread(n)))
        .chain([1, 2, 3, 4, 8, 64].into_iter().map(|k| {
            (
                format!("{k} hammered keys, denied"),
                Spec::DENY,
                k,
                Pick::Rotate(k),
            )
        }))
        .chain([(
            format!("churn, {CHURN} new keys a slice"),
            Spec::ADMIT,
            CHURN,
            Pick::Fresh(CHURN),
        )])
        .filter(|(name, ..)| {
            std::env::var("KEYRATE_PAIRED_ONLY").map_or(true, |only| name.contains(&only))
        })
        .collect();
    println!(
        "median ratio to governor over {rounds} paired rounds [lowest-highest round], \
         {SLICE} calls per thread per slice"
    );
    println!();
    println!(
        "| scenario | threads | keyrate | keyrate, no cache | keyrate, no stats | \
         keyrate, quota per call | dashmap_word | keyrate over DashMap |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    // Caller time handed out so far: every slice takes a fresh stretch.
    let sim = AtomicU64::new(1_000_000_000);
    // keyrate's hot-key promotions per million timed calls, by scenario.
    let mut promotions = Vec::new();
    for (name, spec, keys, pick) in scenarios {
        let table: Arc<[String]> = (0..keys as u64).map(api_key).collect();
        let competitors = build(spec, &table);
        if !matches!(pick, Pick::Fresh(_)) {
            for competitor in &competitors {
                competitor.warm(keys);
            }
        }
        let promoted_before = competitors[1].promotions().unwrap_or(0);
        let mut timed_calls = 0;
        for threads in [1, 2] {
            let mut ratios = vec![Vec::new(); competitors.len()];
            for round in 0..rounds {
                let mut times = vec![Duration::ZERO; competitors.len()];
                for turn in 0..competitors.len() {
                    let which = (round + turn) % competitors.len();
                    let base = sim.fetch_add(SLICE * STEP_NS + 1_000_000_000, Relaxed);
                    times[which] = match pick {
                        // A new limiter, made and dropped outside the timing.
                        Pick::Fresh(_) => build(spec, &table)[which].slice(threads, pick, base),
                        _ => competitors[which].slice(threads, pick, base),
                    };
                }
                timed_calls += pick.calls(threads) * threads as u64;
                for (which, time) in times.iter().enumerate() {
                    ratios[which].push(times[0].as_secs_f64() / time.as_secs_f64());
                }
            }
            print!("| {name} | {threads} |");
            for ratio in ratios.into_iter().skip(1) {
                let (mid, low, high) = median(ratio);
                print!(" {mid:.2}x [{low:.2}-{high:.2}] |");
            }
            println!();
        }
        let promoted = competitors[1].promotions().unwrap_or(0) - promoted_before;
        promotions.push((name, promoted as f64 * 1e6 / timed_calls as f64));
    }
    // Every slice runs on fresh threads, whose caches start empty: each
    // thread takes each hammered key in once per slice of SLICE calls, so
    // 5 promotions per key per million calls is no churn at all; more
    // means keys go in and out of the caches.
    println!();
    println!("keyrate (first column): hot-key promotions per million calls");
    println!();
    for (name, per_million) in promotions {
        println!("- {name}: {per_million:.1}");
    }
}

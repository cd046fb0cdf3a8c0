//! The concurrency limiter's numbers (issue 23), each beside its yardstick
//! in the same run:
//!
//! - `concurrency_random_keys`: acquire plus release of one permit of a
//!   key picked pseudo-randomly from 10,000 (`keyrate_acquire_release`),
//!   against the token bucket's `allow` on the same keys
//!   (`token_bucket_allow`); one thread. The goal: within 2x.
//! - `concurrency_hammered_2_threads`: two threads take and give back a
//!   permit of one key (limit 2: always admitted), keyrate against a
//!   `DashMap<String, Arc<tokio::sync::Semaphore>>` doing the same
//!   (`try_acquire` and drop: the bare baseline). The goal: at least the
//!   baseline's throughput.
//!
//! Criterion measures each competitor in turn; then the paired part runs
//! the competitors of each scenario in alternating slices, rotating their
//! order every round, and prints the median ratio of the rounds (so that a
//! slow phase of a shared machine falls on both alike):
//!
//! ```text
//! cargo bench --bench concurrency                  # criterion, then 15 paired rounds
//! cargo bench --bench concurrency -- --quick       # a smoke run
//! KEYRATE_CONC_ROUNDS=31 cargo bench --bench concurrency
//! KEYRATE_CONC_KEYS=1000 cargo bench --bench concurrency   # fewer random keys
//! ```

#[allow(dead_code)]
mod common;

use common::{api_key, mix};
use criterion::{black_box, Criterion, Throughput};
use dashmap::DashMap;
use keyrate::{ConcurrencyLimiter, TokenBucketLimiter};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Keys in the random-keys scenario: `KEYRATE_CONC_KEYS`, default 10,000.
fn key_count() -> u64 {
    std::env::var("KEYRATE_CONC_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(10_000)
}
/// Calls per thread in one paired slice.
const SLICE: u64 = 200_000;

/// One competitor: `calls` operations on thread `thread` of `threads`.
trait Competitor: Sync {
    fn name(&self) -> &'static str;
    fn run(&self, thread: u64, calls: u64);
}

/// The keys, made once.
fn keys() -> Arc<[String]> {
    (0..key_count()).map(api_key).collect()
}

/// Which key the `i`th call of `thread` names.
fn pick(keys: &[String], thread: u64, i: u64) -> &str {
    &keys[(mix(thread << 40 ^ i) % keys.len() as u64) as usize]
}

struct Acquire {
    limiter: ConcurrencyLimiter,
    keys: Arc<[String]>,
}

impl Competitor for Acquire {
    fn name(&self) -> &'static str {
        "keyrate_acquire_release"
    }
    fn run(&self, thread: u64, calls: u64) {
        for i in 0..calls {
            // Taken and given back at once.
            let permit = self.limiter.try_acquire(pick(&self.keys, thread, i));
            black_box(permit.is_ok());
        }
    }
}

struct Allow {
    limiter: TokenBucketLimiter,
    keys: Arc<[String]>,
}

impl Competitor for Allow {
    fn name(&self) -> &'static str {
        "token_bucket_allow"
    }
    fn run(&self, thread: u64, calls: u64) {
        for i in 0..calls {
            // 1 µs of caller time per call; everything admitted.
            let at = Duration::from_nanos(i * 1_000);
            black_box(self.limiter.allow(pick(&self.keys, thread, i), at));
        }
    }
}

struct Hammer {
    limiter: ConcurrencyLimiter,
}

impl Competitor for Hammer {
    fn name(&self) -> &'static str {
        "keyrate_one_key"
    }
    fn run(&self, _: u64, calls: u64) {
        for _ in 0..calls {
            let permit = self.limiter.try_acquire("hot");
            assert!(permit.is_ok(), "2 threads, limit 2: always admitted");
        }
    }
}

struct Semaphores {
    map: DashMap<String, Arc<Semaphore>>,
}

impl Competitor for Semaphores {
    fn name(&self) -> &'static str {
        "dashmap_semaphore_one_key"
    }
    fn run(&self, _: u64, calls: u64) {
        for _ in 0..calls {
            let taken = match self.map.get("hot") {
                Some(semaphore) => semaphore.try_acquire().is_ok(),
                None => {
                    let semaphore = Arc::clone(
                        self.map
                            .entry("hot".to_owned())
                            .or_insert_with(|| Arc::new(Semaphore::new(2)))
                            .value(),
                    );
                    let taken = semaphore.try_acquire().is_ok();
                    taken
                }
            };
            assert!(taken, "2 threads, 2 permits: always admitted");
        }
    }
}

/// Runs `calls` operations on each of `threads` threads, lined up on a
/// barrier; the time from the release of the barrier to the last end.
fn timed(competitor: &dyn Competitor, threads: u64, calls: u64) -> Duration {
    let barrier = Barrier::new(threads as usize + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    competitor.run(thread, calls);
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for handle in handles {
            handle.join().expect("a benchmark thread panicked");
        }
        start.elapsed()
    })
}

/// A scenario: its name, its threads, and its competitors (keyrate
/// first, the yardstick last).
type Scenario = (&'static str, u64, Vec<Box<dyn Competitor>>);

/// The scenarios.
fn scenarios() -> Vec<Scenario> {
    let keys = keys();
    vec![
        (
            "concurrency_random_keys",
            1,
            vec![
                Box::new(Acquire {
                    limiter: ConcurrencyLimiter::new(1),
                    keys: Arc::clone(&keys),
                }) as Box<dyn Competitor>,
                Box::new(Allow {
                    limiter: TokenBucketLimiter::new(1e9, u64::from(u32::MAX)),
                    keys,
                }),
            ],
        ),
        (
            "concurrency_hammered_2_threads",
            2,
            vec![
                Box::new(Hammer {
                    limiter: ConcurrencyLimiter::new(2),
                }) as Box<dyn Competitor>,
                Box::new(Semaphores {
                    map: DashMap::new(),
                }),
            ],
        ),
    ]
}

fn criterion_part(c: &mut Criterion) {
    for (name, threads, competitors) in scenarios() {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(threads));
        for competitor in &competitors {
            // One iteration: one call on every thread (batched by
            // `iter_custom`, so that thread start-up is amortised).
            group.bench_function(competitor.name(), |b| {
                b.iter_custom(|iters| timed(competitor.as_ref(), threads, iters))
            });
        }
        group.finish();
    }
}

/// The paired part: per scenario, rounds of one slice per competitor in
/// rotating order; the median over rounds of yardstick time / keyrate time
/// (above 1: keyrate is faster).
fn paired_part() {
    let rounds: usize = std::env::var("KEYRATE_CONC_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(15);
    println!("\npaired, {rounds} rounds of {SLICE} calls per thread per competitor:");
    println!("| scenario | keyrate ns/call | yardstick ns/call | yardstick / keyrate: median (min..max) |");
    println!("|---|---|---|---|");
    for (name, threads, competitors) in scenarios() {
        // Warm up: the keys' entries exist before the first round.
        for competitor in &competitors {
            timed(competitor.as_ref(), threads, SLICE);
        }
        let mut ratios = Vec::with_capacity(rounds);
        let mut ns = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            let mut times = [Duration::ZERO; 2];
            for j in 0..2 {
                let which = (round + j) % 2;
                times[which] = timed(competitors[which].as_ref(), threads, SLICE);
            }
            for (which, time) in times.iter().enumerate() {
                ns[which].push(time.as_nanos() as f64 / (SLICE * threads) as f64);
            }
            ratios.push(times[1].as_secs_f64() / times[0].as_secs_f64());
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (lo, hi) = (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "| {name} ({} vs {}) | {:.1} | {:.1} | {:.2} ({lo:.2}..{hi:.2}) |",
            competitors[0].name(),
            competitors[1].name(),
            median(&mut ns[0]),
            median(&mut ns[1]),
            median(&mut ratios),
        );
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    criterion_part(&mut criterion);
    criterion.final_summary();
    let quick = std::env::args().any(|arg| arg == "--quick");
    if quick && std::env::var("KEYRATE_CONC_ROUNDS").is_err() {
        std::env::set_var("KEYRATE_CONC_ROUNDS", "3");
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // only checks that the benchmark runs.
    if std::env::args().any(|arg| arg == "--bench") {
        paired_part();
    }
}

//! Contention benchmarks: keyrate beside governor and three reference
//! designs, on the same workloads in the same run.
//!
//! Scenarios (each at 1, 2 and 4 threads; 4 oversubscribes a 2-core box):
//!
//! - `hot_admit`: every thread calls one key; everything is admitted.
//! - `hot_deny`: every thread calls one empty key; everything is denied.
//! - `spread`: 10,000 keys picked pseudo-randomly; everything admitted.
//! - `spread_n{n}` for n in 10^4, 10^5, 10^6 (1 and 2 threads, keyrate,
//!   governor and the bare-DashMap floor `dashmap_word` only).
//! - `churn`: every call is a key the limiter has never seen (a fresh
//!   limiter per round of 100,000 keys, made outside the timed region).
//! - `mixed`: one hot key, costs cycling through 1, 4, 2, 8, 1, 16, 3, 1.
//! - `hammer_k{k}` for k in 1, 2, 3, 4, 8, 64 (1 and 2 threads, keyrate
//!   and governor only): every thread rotates over the same k empty keys;
//!   everything is denied. An abuser with a few API keys. After the
//!   criterion runs, keyrate's hot-key promotions per million calls are
//!   counted for each k (see `promotions`).
//!
//! Timestamps are supplied by the caller: each thread advances its own
//! timestamp 1 µs per call, and nothing reads a clock inside the timed
//! loop. Threads are spawned and lined up on a spinning barrier before the
//! clock starts; the time reported is from the first thread's start to the
//! last thread's end. One criterion "iteration" is `BATCH` calls on every
//! thread (so that thread wake-up skew is small against the work measured),
//! and criterion's throughput is calls per second summed over threads.
//!
//! keyrate runs four times: as users get it, with its per-thread hot-key
//! cache off (`keyrate_nocache`: every call looks its key up in the map),
//! with its counters off (`keyrate_nostats`: the cost of observing the
//! calls), and with the quota passed on every call (`keyrate_under`: a
//! per-key plan, against reading the default quota).
//!
//! `scripts/bench.sh` runs this and prints the ratios to governor.

#[allow(dead_code)]
mod common;

use common::{
    api_key, mix, one_of, AtomicFloor, Competitor, DashTuple, DashWord, Governor, Keyrate,
    KeyrateHandle, KeyrateUnder, MutexMap, SccBoxWord, Spec,
};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const THREADS: [usize; 3] = [1, 2, 4];
/// Calls per thread in one criterion iteration.
const BATCH: u64 = 256;
/// Caller time that passes between two calls of one thread.
const STEP_NS: u64 = 1_000;
const SPREAD_KEYS: usize = 10_000;
/// Keys per churn round, split between the threads.
const CHURN_ROUND: usize = 100_000;
const ONE: &[u32] = &[1];
/// Mixed costs; the length is a power of two.
const MIXED: &[u32] = &[1, 4, 2, 8, 1, 16, 3, 1];

/// Which key a thread calls on its `i`th call.
#[derive(Clone, Copy)]
enum Pick {
    Hot,
    /// One of `n` keys, picked pseudo-randomly.
    Spread {
        n: usize,
    },
    /// Key `thread * per_thread + i`: never seen by this round's limiter.
    Churn {
        per_thread: usize,
    },
    /// Keys `0..k` in turn, each thread starting at its own offset.
    Rotate {
        k: usize,
    },
}

impl Pick {
    #[inline]
    fn key(self, thread: usize, i: u64, state: &mut u64) -> usize {
        match self {
            Pick::Hot => 0,
            Pick::Spread { n } => one_of(state, n),
            Pick::Churn { per_thread } => thread * per_thread + i as usize,
            Pick::Rotate { k } => (thread + i as usize) % k,
        }
    }
}

/// What a run must have decided, checked after the timed region so that a
/// misconfigured scenario cannot pass unnoticed.
#[derive(Clone, Copy, PartialEq)]
enum Expect {
    AllAdmitted,
    AllDenied,
}

/// One workload: which keys, which costs, and what must be decided.
struct Scenario {
    pick: Pick,
    costs: &'static [u32],
    expect: Expect,
    /// Caller time handed out so far; each run takes a fresh stretch, so
    /// that time never goes backwards between runs.
    sim: AtomicU64,
}

impl Scenario {
    fn new(pick: Pick, costs: &'static [u32], expect: Expect) -> Self {
        Scenario {
            pick,
            costs,
            expect,
            sim: AtomicU64::new(1_000_000_000),
        }
    }
}

/// Runs `calls` calls on each of `threads` threads; returns the wall time
/// from the first thread's start to the last thread's end.
fn run<C: Competitor>(
    limiter: &C,
    name: &str,
    threads: usize,
    calls: u64,
    scenario: &Scenario,
) -> Duration {
    let Scenario {
        pick,
        costs,
        expect,
        ref sim,
    } = *scenario;
    // A fresh stretch of caller time for every run, so that runs never see
    // time go backwards between them.
    let base = sim.fetch_add(calls * STEP_NS + 1_000_000_000, Relaxed);
    let arrived = AtomicUsize::new(0);
    let spans: Vec<(Instant, Instant, u64)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let arrived = &arrived;
                scope.spawn(move || {
                    let local = limiter.local();
                    let mut state = mix(thread as u64 + 1);
                    let mut ns = base;
                    let mut secs = base as f64 * 1e-9;
                    let step_secs = STEP_NS as f64 * 1e-9;
                    let mask = costs.len() - 1;
                    let mut admitted = 0u64;
                    // Spin (yielding) rather than park: a parked thread can
                    // take a scheduler tick to wake, and that skew would be
                    // timed as if it were work.
                    arrived.fetch_add(1, Relaxed);
                    while arrived.load(Relaxed) < threads {
                        thread::yield_now();
                    }
                    let start = Instant::now();
                    for i in 0..calls {
                        let key = pick.key(thread, i, &mut state);
                        let cost = costs[i as usize & mask];
                        admitted += u64::from(limiter.call(&local, key, ns, secs, cost));
                        ns += STEP_NS;
                        secs += step_secs;
                    }
                    let end = Instant::now();
                    drop(black_box(local));
                    (start, end, admitted)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap();
    let end = spans.iter().map(|s| s.1).max().unwrap();
    let admitted: u64 = spans.iter().map(|s| s.2).sum();
    let total = calls * threads as u64;
    match expect {
        Expect::AllDenied => assert_eq!(admitted, 0, "{name}: a hot-deny call was admitted"),
        Expect::AllAdmitted => assert!(
            admitted * 100 >= total * 99,
            "{name}: only {admitted} of {total} calls admitted"
        ),
    }
    end - start
}

fn keys(n: usize) -> Arc<[String]> {
    (0..n as u64).map(api_key).collect()
}

/// Object-safe face of a competitor, so one loop can drive every type; the
/// timed loop itself (`run`) is compiled for each type.
trait DynRun {
    fn warm(&self, key_count: usize);
    fn run(&self, name: &str, threads: usize, calls: u64, scenario: &Scenario) -> Duration;
}

impl<C: Competitor> DynRun for C {
    fn warm(&self, key_count: usize) {
        let local = self.local();
        for key in 0..key_count {
            let _ = self.call(&local, key, 0, 0.0, 1);
        }
    }

    fn run(&self, name: &str, threads: usize, calls: u64, scenario: &Scenario) -> Duration {
        run(self, name, threads, calls, scenario)
    }
}

type Make = Box<dyn Fn() -> Box<dyn DynRun>>;

/// Every competitor's name and constructor for `spec` and `keys`.
fn competitors(spec: Spec, keys: &Arc<[String]>, handles: bool) -> Vec<(&'static str, Make)> {
    fn make<C: Competitor + 'static>(
        keys: &Arc<[String]>,
        new: impl Fn(Arc<[String]>) -> C + 'static,
    ) -> Make {
        let keys = keys.clone();
        Box::new(move || Box::new(new(keys.clone())) as Box<dyn DynRun>)
    }
    let mut all: Vec<(&'static str, Make)> = vec![
        ("keyrate", make(keys, move |k| Keyrate::new(spec, k))),
        (
            "keyrate_nocache",
            make(keys, move |k| Keyrate::without_hot_key_cache(spec, k)),
        ),
        (
            "keyrate_nostats",
            make(keys, move |k| Keyrate::without_stats(spec, k)),
        ),
        (
            "keyrate_under",
            make(keys, move |k| KeyrateUnder::new(spec, k)),
        ),
    ];
    if handles {
        all.push((
            "keyrate_handle",
            make(keys, move |k| KeyrateHandle(Keyrate::new(spec, k))),
        ));
    }
    all.push(("governor", make(keys, move |k| Governor::new(spec, k))));
    all.push(("mutex_hashmap", make(keys, move |k| MutexMap::new(spec, k))));
    all.push((
        "dashmap_tuple",
        make(keys, move |k| DashTuple::new(spec, k)),
    ));
    all.push(("dashmap_word", make(keys, move |k| DashWord::new(spec, k))));
    all.push((
        "scc_box_word",
        make(keys, move |k| SccBoxWord::new(spec, k)),
    ));
    all.push((
        "atomic_floor",
        make(keys, move |k| AtomicFloor::new(spec, k)),
    ));
    all
}

/// A scenario on one long-lived limiter per competitor (hot keys, spread).
fn steady(c: &mut Criterion, group_name: &str, spec: Spec, key_count: usize, scenario: Scenario) {
    steady_among(c, group_name, spec, key_count, scenario, &[], &THREADS);
}

/// [`steady`] for the competitors named in `only` (all if empty), at
/// `thread_counts`.
fn steady_among(
    c: &mut Criterion,
    group_name: &str,
    spec: Spec,
    key_count: usize,
    scenario: Scenario,
    only: &[&str],
    thread_counts: &[usize],
) {
    let keys = keys(key_count);
    let mut group = c.benchmark_group(group_name);
    for (name, make) in competitors(spec, &keys, only.is_empty()) {
        if !only.is_empty() && !only.contains(&name) {
            continue;
        }
        let limiter = make();
        // Outside the measurement: every key gets its bucket, and the
        // hot-deny key spends its only token.
        limiter.warm(key_count);
        for &threads in thread_counts {
            group.throughput(Throughput::Elements(threads as u64 * BATCH));
            group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
                b.iter_custom(|iters| limiter.run(name, threads, iters * BATCH, &scenario));
            });
        }
    }
    group.finish();
}

/// Every call a new key: rounds of `CHURN_ROUND` keys, each round on a
/// fresh limiter made and dropped outside the timed region.
fn churn(c: &mut Criterion) {
    let keys = keys(CHURN_ROUND);
    let mut group = c.benchmark_group("churn");
    for (name, make) in competitors(Spec::ADMIT, &keys, false) {
        for threads in THREADS {
            let per_thread = CHURN_ROUND / threads;
            let scenario = Scenario::new(Pick::Churn { per_thread }, ONE, Expect::AllAdmitted);
            group.throughput(Throughput::Elements(threads as u64 * BATCH));
            group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
                b.iter_custom(|iters| {
                    let mut left = iters * BATCH;
                    let mut total = Duration::ZERO;
                    while left > 0 {
                        let calls = left.min(per_thread as u64);
                        let limiter = make();
                        total += limiter.run(name, threads, calls, &scenario);
                        drop(limiter);
                        left -= calls;
                    }
                    total
                });
            });
        }
    }
    group.finish();
}

/// The hasher alone on one 40-byte key: keyrate's default (foldhash) and
/// std's SipHash-1-3 (governor's DashMap default).
fn hasher(c: &mut Criterion) {
    let key = api_key(7);
    let fold = foldhash::fast::RandomState::default();
    let sip = std::collections::hash_map::RandomState::new();
    let mut group = c.benchmark_group("hasher");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("foldhash", "40B"), |b| {
        b.iter(|| black_box(&fold).hash_one(black_box(key.as_str())));
    });
    group.bench_function(BenchmarkId::new("siphash", "40B"), |b| {
        b.iter(|| black_box(&sip).hash_one(black_box(key.as_str())));
    });
    group.finish();
}

fn scenarios(c: &mut Criterion) {
    let hot = |costs, expect| Scenario::new(Pick::Hot, costs, expect);
    steady(
        c,
        "hot_admit",
        Spec::ADMIT,
        1,
        hot(ONE, Expect::AllAdmitted),
    );
    steady(c, "hot_deny", Spec::DENY, 1, hot(ONE, Expect::AllDenied));
    steady(c, "mixed", Spec::ADMIT, 1, hot(MIXED, Expect::AllAdmitted));
    let spread = Scenario::new(Pick::Spread { n: SPREAD_KEYS }, ONE, Expect::AllAdmitted);
    steady(c, "spread", Spec::ADMIT, SPREAD_KEYS, spread);
    // The spread at server scale, against governor and the bare-DashMap
    // floor only.
    for n in [10_000, 100_000, 1_000_000] {
        let spread = Scenario::new(Pick::Spread { n }, ONE, Expect::AllAdmitted);
        let only = ["keyrate", "governor", "dashmap_word"];
        steady_among(
            c,
            &format!("spread_n{n}"),
            Spec::ADMIT,
            n,
            spread,
            &only,
            &[1, 2],
        );
    }
    churn(c);
    for k in HAMMERED {
        let hammer = Scenario::new(Pick::Rotate { k }, ONE, Expect::AllDenied);
        let only = ["keyrate", "governor"];
        steady_among(
            c,
            &format!("hammer_k{k}"),
            Spec::DENY,
            k,
            hammer,
            &only,
            &[1, 2],
        );
    }
    hasher(c);
    promotions();
}

/// Key counts of the `hammer_k` scenarios.
const HAMMERED: [usize; 6] = [1, 2, 3, 4, 8, 64];

/// keyrate's hot-key promotions in the `hammer_k` workload (1 thread,
/// denied calls), seen through allocations: a denied call allocates
/// nothing, and a promotion allocates the cache's copy of the key (its
/// `String` and the box around it) and, the first time a key is promoted,
/// the bucket's two `Arc`s and its entry in the side map: about 6
/// allocations. `6 * k` per million calls means each key was promoted once
/// and never churned out.
fn promotions() {
    println!("hot-key cache allocations per million calls (1 thread, all denied):");
    for k in HAMMERED {
        let keys = keys(k);
        let limiter = Keyrate::new(Spec::DENY, keys);
        limiter.warm(k);
        let scenario = Scenario::new(Pick::Rotate { k }, ONE, Expect::AllDenied);
        // The harness's own allocations (threads), measured on a run of
        // no calls, are taken off.
        let count = |calls| {
            let before = ALLOCATIONS.load(Relaxed);
            let _ = limiter.run("keyrate", 1, calls, &scenario);
            ALLOCATIONS.load(Relaxed) - before
        };
        let harness = count(0);
        let allocations = count(1_000_000).saturating_sub(harness);
        println!("  k={k}: {allocations} allocations per million calls");
    }
}

/// The system allocator, counting allocations (for [`promotions`]).
struct Counting;

/// Allocations made so far. Relaxed: a plain counter, read after the
/// threads that allocate have been joined.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: both methods forward to `System` with the caller's own arguments,
// so `System`'s guarantees carry over; the counter never affects them.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: forwarded as is; `ptr` came from `alloc` above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn config() -> Criterion {
    // Short runs: the whole suite (about 100 benchmarks) takes a few
    // minutes on two cores. Ratios between competitors are steadier than
    // the absolute numbers; see BENCHMARKS.md.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200))
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = scenarios
}
criterion_main!(benches);

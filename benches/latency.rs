//! The latency of single calls in a server-like workload: every call is
//! timed and recorded in a histogram, so the rare slow call (a sweep, a
//! map resize) shows up instead of vanishing in an average.
//!
//! Workload, per competitor: 1,000,000 live keys (40-byte `sk_live_` keys,
//! each called once first, which spends its whole burst of 1 token; a
//! token comes back after 1 s), then 2 threads (`KEYRATE_LATENCY_THREADS`)
//! call for a few seconds: 10%
//! of calls on one hot key, 30% on never-seen keys (new buckets, so the map
//! grows and old buckets go idle and get evicted), 60% on random live keys.
//! keyrate runs with its defaults (automatic sweep and hot-key cache on);
//! governor's keyed limiter (DashMap) is swept with `retain_recent` once a
//! second from a timer thread, as its documentation suggests. Both read a
//! real clock.
//!
//! ```text
//! cargo bench --bench latency           # 3 rounds of 3 s per competitor
//! KEYRATE_LATENCY_SECS=10 KEYRATE_LATENCY_ROUNDS=5 cargo bench --bench latency
//! KEYRATE_LATENCY_THREADS=1 cargo bench --bench latency  # no lock waits
//! ```
//!
//! The competitors run in turn, each round starting one later (a fixed
//! order would charge the process's first run, whose memory comes fresh
//! from the kernel, to the same competitor every time), each run on a new
//! limiter. Prints one markdown row per competitor: calls timed, p50, p99,
//! p99.9 and p99.99 (medians of the rounds, with their range) and the
//! worst call, in microseconds; then, by kind of call (the hot key, a
//! new key, a live key), p99 and p99.9, the worst call and the calls over
//! 1 ms, which tell what the tail is. The timer itself (two
//! `Instant::now` readings) adds a few tens of nanoseconds to every
//! figure; the last row, with no limiter, shows what the machine alone
//! adds. With one thread no call waits for a lock the other holds (a
//! thread preempted while it holds one makes the other's call last until
//! it runs again: milliseconds on a busy 2-core machine).

use hdrhistogram::Histogram;
use keyrate::{CompoundLimiter, Policy, Quota, TokenBucketLimiter};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const LIVE: u64 = 1_000_000;

/// A 40-byte API key; distinct `n` give distinct keys.
fn api_key(n: u64) -> String {
    format!("sk_live_{:016x}{:016x}", mix(n), n)
}

/// splitmix64's finaliser: a bijective mixer, used as a cheap random step.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One competitor: a call on a key at a time (seconds since the run began),
/// and what a user runs beside it for housekeeping.
trait Limiter: Send + Sync + 'static {
    fn call(&self, key: &str, now: f64) -> bool;
    /// Run once a second from a timer thread, if the limiter needs it.
    fn housekeeping(&self) {}
    fn len(&self) -> usize;
    /// What the limiter says of its own housekeeping, if anything.
    fn report(&self) -> Option<String> {
        None
    }
}

impl Limiter for TokenBucketLimiter {
    #[inline]
    fn call(&self, key: &str, now: f64) -> bool {
        self.allow(key, now)
    }
    fn len(&self) -> usize {
        TokenBucketLimiter::len(self)
    }
    fn report(&self) -> Option<String> {
        let stats = self.stats();
        let steps = stats.sweeps.max(1);
        Some(format!(
            "keyrate ({:?} store): {} sweep steps, {:.1} µs each on average, {} buckets evicted",
            self.store(),
            stats.sweeps,
            stats.sweep_time.as_secs_f64() * 1e6 / steps as f64,
            stats.buckets_evicted,
        ))
    }
}

/// A compound limiter charging each key a policy of two quotas: the
/// others' 1 token/s burst 1, and a daily 50,000 that never binds here.
struct Compound(CompoundLimiter, Policy);

impl Compound {
    fn new() -> Self {
        let quotas = [
            Quota::new(1.0, 1).expect("a valid quota"),
            Quota::new(50_000.0 / 86_400.0, 50_000).expect("a valid quota"),
        ];
        Compound(
            CompoundLimiter::new(),
            Policy::new(quotas).expect("two quotas"),
        )
    }
}

impl Limiter for Compound {
    #[inline]
    fn call(&self, key: &str, now: f64) -> bool {
        self.0.check(key, &self.1, now, 1).is_ok()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

type Governor = governor::DefaultKeyedRateLimiter<String>;

struct GovernorKeyed(Governor);

impl Limiter for GovernorKeyed {
    #[inline]
    fn call(&self, key: &str, _now: f64) -> bool {
        // governor takes `&K`: a `String` key needs an owned `String`, as
        // in a server that holds the key it parsed.
        self.0.check_key(&key.to_owned()).is_ok()
    }
    fn housekeeping(&self) {
        self.0.retain_recent();
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// No limiter at all: what the machine alone adds to a timed call (a
/// thread preempted between the two clock readings, an interrupt), the
/// floor under every other row's tail.
struct Nothing;

impl Limiter for Nothing {
    #[inline]
    fn call(&self, key: &str, now: f64) -> bool {
        std::hint::black_box((key, now));
        true
    }
    fn len(&self) -> usize {
        0
    }
}

/// The kinds of call, in the order of [`run`]'s histograms by kind.
const KINDS: [&str; 3] = ["hot key", "new key", "live key"];

/// Latencies in nanoseconds, up to a minute.
fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

/// Runs the workload on `limiter`; returns the merged histogram (ns), one
/// per kind of call ([`KINDS`]), and the buckets held at the end.
fn run(
    limiter: &Arc<dyn Limiter>,
    seconds: u64,
    threads: u64,
) -> (Histogram<u64>, [Histogram<u64>; 3], usize) {
    let live: Arc<Vec<String>> = Arc::new((0..LIVE).map(api_key).collect());
    let epoch = Instant::now();
    for key in live.iter() {
        let _ = limiter.call(key, epoch.elapsed().as_secs_f64());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let timer = {
        let (limiter, stop) = (Arc::clone(limiter), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                limiter.housekeeping();
            }
        })
    };
    let barrier = Arc::new(Barrier::new(threads as usize));
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let (limiter, live, barrier) =
                (Arc::clone(limiter), Arc::clone(&live), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut kinds: [Histogram<u64>; 3] = std::array::from_fn(|_| histogram());
                let mut fresh = (thread + 1) << 40;
                let mut state = thread;
                barrier.wait();
                let end = Instant::now() + Duration::from_secs(seconds);
                loop {
                    state = mix(state);
                    let new_key;
                    let (kind, key): (usize, &str) = match state % 10 {
                        0 => (0, "sk_live_hot_key_0000000000000000000000000"),
                        1..=3 => {
                            fresh += 1;
                            new_key = api_key(fresh);
                            (1, &new_key)
                        }
                        _ => (2, &live[((state >> 8) % LIVE) as usize]),
                    };
                    let started = Instant::now();
                    let now = started.duration_since(epoch).as_secs_f64();
                    std::hint::black_box(limiter.call(key, now));
                    let took = started.elapsed();
                    kinds[kind].saturating_record(took.as_nanos() as u64);
                    if started >= end {
                        return kinds;
                    }
                }
            })
        })
        .collect();
    let mut merged = histogram();
    let mut by_kind: [Histogram<u64>; 3] = std::array::from_fn(|_| histogram());
    for worker in workers {
        for (kind, part) in by_kind.iter_mut().zip(worker.join().unwrap()) {
            merged.add(&part).unwrap();
            kind.add(part).unwrap();
        }
    }
    stop.store(true, Relaxed);
    timer.join().unwrap();
    (merged, by_kind, limiter.len())
}

fn micros(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e3)
}

/// The lowest, median and highest of one figure over the rounds.
fn low_mid_high(values: &[u64]) -> (u64, u64, u64) {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    (
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
    )
}

/// One figure over the rounds: its median, with its range when the
/// rounds differ.
fn spread(values: &[u64]) -> String {
    let (low, mid, high) = low_mid_high(values);
    if low == high {
        micros(mid)
    } else {
        format!("{} [{}-{}]", micros(mid), micros(low), micros(high))
    }
}

/// One competitor's figures from each round.
#[derive(Default)]
struct Rounds {
    calls: Vec<u64>,
    held: Vec<u64>,
    /// p50, p99, p99.9, p99.99 of each round's calls.
    quantiles: [Vec<u64>; 4],
    max: u64,
    /// Per kind of call: p99 and p99.9 of each round, the worst call of
    /// all rounds, and the calls over 1 ms in all rounds.
    kinds: [(Vec<u64>, Vec<u64>, u64, u64); 3],
}

impl Rounds {
    fn add(&mut self, all: &Histogram<u64>, by_kind: &[Histogram<u64>; 3], held: usize) {
        self.calls.push(all.len());
        self.held.push(held as u64);
        for (values, q) in self.quantiles.iter_mut().zip([0.5, 0.99, 0.999, 0.9999]) {
            values.push(all.value_at_quantile(q));
        }
        self.max = self.max.max(all.max());
        for (kind, h) in self.kinds.iter_mut().zip(by_kind) {
            kind.0.push(h.value_at_quantile(0.99));
            kind.1.push(h.value_at_quantile(0.999));
            kind.2 = kind.2.max(h.max());
            kind.3 += h.len() - h.count_between(0, 1_000_000);
        }
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

type Make = fn() -> Arc<dyn Limiter>;

fn main() {
    let seconds = env("KEYRATE_LATENCY_SECS", 3);
    let threads = env("KEYRATE_LATENCY_THREADS", 2);
    let rounds = env("KEYRATE_LATENCY_ROUNDS", 3).max(1) as usize;
    let competitors: [(&str, Make); 5] = [
        ("keyrate `allow`", || {
            Arc::new(TokenBucketLimiter::new(1.0, 1))
        }),
        ("keyrate `allow` over DashMap", || {
            Arc::new(TokenBucketLimiter::new(1.0, 1).with_store(keyrate::Store::DashMap))
        }),
        ("governor keyed + `retain_recent` each second", || {
            let quota = governor::Quota::per_second(NonZeroU32::new(1).unwrap());
            Arc::new(GovernorKeyed(governor::RateLimiter::keyed(quota)))
        }),
        ("keyrate compound `check`, two quotas", || {
            Arc::new(Compound::new())
        }),
        ("no limiter (the machine alone)", || Arc::new(Nothing)),
    ];
    let mut results: Vec<Rounds> = competitors.iter().map(|_| Rounds::default()).collect();
    let mut reports = Vec::new();
    for round in 0..rounds {
        // Each round starts one competitor later: the first run in a
        // process is the one whose memory the kernel hands out fresh (a
        // page fault on each first touch), which a fixed order would
        // charge to the same competitor every time.
        for turn in 0..competitors.len() {
            let index = (round + turn) % competitors.len();
            let (name, make) = competitors[index];
            let limiter = make();
            let (all, by_kind, held) = run(&limiter, seconds, threads);
            if let Some(report) = limiter.report() {
                reports.push(format!("round {round}, {name}: {report}"));
            }
            results[index].add(&all, &by_kind, held);
        }
    }
    println!(
        "{LIVE} live keys, {threads} threads, {seconds} s each, {rounds} rounds in turn: 10% hot \
         key, 30% new keys, 60% live keys; latency in µs, median of the rounds [range]"
    );
    println!();
    println!("| limiter | calls | p50 | p99 | p99.9 | p99.99 | max | buckets at end |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for ((name, _), r) in competitors.iter().zip(&results) {
        let [p50, p99, p999, p9999] = &r.quantiles;
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            low_mid_high(&r.calls).1,
            spread(p50),
            spread(p99),
            spread(p999),
            spread(p9999),
            micros(r.max),
            low_mid_high(&r.held).1,
        );
    }
    println!();
    println!(
        "By kind of call: p99 / p99.9 (medians of the rounds), the worst call and the calls \
         over 1 ms of all rounds, µs:"
    );
    println!();
    let kinds: Vec<String> = KINDS
        .iter()
        .map(|k| format!("{k} | {k}: max / over 1 ms"))
        .collect();
    println!("| limiter | {} |", kinds.join(" | "));
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for ((name, _), r) in competitors.iter().zip(&results) {
        let cells: Vec<String> = r
            .kinds
            .iter()
            .map(|(p99, p999, max, over)| {
                format!(
                    "{} / {} | {} / {over}",
                    spread(p99),
                    spread(p999),
                    micros(*max)
                )
            })
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!();
    for report in reports {
        println!("{report}");
    }
}

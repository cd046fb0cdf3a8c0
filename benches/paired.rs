//! Paired ratios: competitors run in short alternating slices within one
//! process, so that a slow or a fast phase of the machine (the shared
//! 2-core box drifts by 2x between runs) falls on all of them alike.
//!
//! For each scenario and thread count, on limiters made (and warmed) for
//! that thread count alone, every round runs each competitor for
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
//! KEYRATE_PAIRED_ONLY=everyday cargo bench --bench paired  # active keys + new ones
//! KEYRATE_PAIRED_ONLY=compound cargo bench --bench paired  # compound calls (issue 22)
//! ```
//!
//! The compound scenarios (a table of their own) pair governor doing one
//! quota with keyrate's single-quota call, a `CompoundLimiter` call of one
//! and of two quotas on one key, three sequential single-quota calls (key,
//! org, global) and one three-scope compound call; their last columns are
//! the medians of the rounds' time ratios the issue asks about. For a
//! stable count of instructions, `KEYRATE_PAIRED_COMPETITOR=i` runs only
//! the compound table's competitor `i` (0 governor, 1 keyrate, 2 and 3
//! compound of 1 and 2 quotas, 4 sequential, 5 three scopes), under
//! `valgrind --tool=callgrind --toggle-collect='*call_once{{vtable.shim}}*'`
//! (the slices' threads): docs/compound.md, "Measured", has the recipe.
//!
//! Beside the ratios, the last column gives the buckets keyrate (the first
//! column) created per million timed calls: a key's first call creates one,
//! and so does every call that finds its key's bucket evicted.

#[allow(dead_code)]
mod common;
/// The compound scenarios' table (issue 22).
#[path = "paired/compound.rs"]
mod compound;

use compound::compound;

use common::{
    api_key, mix, one_of, Competitor, DashWord, Governor, Keyrate, KeyrateNanos, KeyrateUnder, Spec,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls per thread in one slice.
const SLICE: u64 = 200_000;
/// Keys per slice in the churn scenario (the criterion bench's round).
const CHURN: usize = 100_000;
/// Caller time between two calls of one thread.
const STEP_NS: u64 = 1_000;
/// In the everyday scenario, one call in this many names a key never seen
/// before.
const NEW_ONE_IN: u64 = 100;

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
    /// The everyday workload: one of `n` active keys at random (not warmed:
    /// each is first seen inside a timed slice), and every
    /// [`NEW_ONE_IN`]th call a key never seen before, from the table past
    /// the active keys.
    Everyday(usize),
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

/// The keys one thread of an everyday slice names, call by call: one of
/// `active` keys at random, and every [`NEW_ONE_IN`]th call the thread's
/// next never-seen key (the table's from `fresh` on, [`SLICE`] /
/// [`NEW_ONE_IN`] per thread). The timed slices and the count of first
/// sightings (`FirstSightings`) draw the same keys from it.
struct EverydayKeys {
    state: u64,
    active: usize,
    new_from: usize,
}

impl EverydayKeys {
    fn new(thread: usize, base: u64, active: usize, fresh: usize) -> Self {
        EverydayKeys {
            state: mix(thread as u64 + base),
            active,
            new_from: fresh + thread * (SLICE / NEW_ONE_IN) as usize,
        }
    }

    /// The key of call `i`.
    #[inline(always)]
    fn key(&mut self, i: u64) -> usize {
        if i % NEW_ONE_IN == NEW_ONE_IN - 1 {
            self.new_from + (i / NEW_ONE_IN) as usize
        } else {
            one_of(&mut self.state, self.active)
        }
    }
}

/// The keys keyrate's everyday slices named so far, to count the buckets
/// no limiter can avoid creating (each key's first call): replayed from
/// the same picks after each round, outside the timing.
struct FirstSightings {
    seen: Vec<bool>,
    count: u64,
}

impl FirstSightings {
    fn new(keys: usize) -> Self {
        FirstSightings {
            seen: vec![false; keys],
            count: 0,
        }
    }

    /// Counts the keys of a slice run with these arguments (see `slice`).
    fn slice(&mut self, threads: usize, active: usize, base: u64, fresh: usize) {
        for thread in 0..threads {
            let mut keys = EverydayKeys::new(thread, base, active, fresh);
            for i in 0..SLICE {
                let key = keys.key(i);
                if !std::mem::replace(&mut self.seen[key], true) {
                    self.count += 1;
                }
            }
        }
    }
}

/// Runs a slice's calls (see [`Pick::calls`]) on each of `threads`
/// threads from caller time `base`; `Everyday`'s never-seen keys are the
/// table's from `fresh` on, [`SLICE`] / [`NEW_ONE_IN`] per thread.
/// Returns the wall time from the first start to the last end.
fn slice<C: Competitor>(
    limiter: &C,
    threads: usize,
    pick: Pick,
    base: u64,
    fresh: usize,
) -> Duration {
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
                    let calls = pick.calls(threads);
                    let start = Instant::now();
                    // One loop per kind of pick, so that choosing a key
                    // costs the harness no jump table and no division.
                    match pick {
                        Pick::Spread(n) => {
                            run(limiter, &local, base, calls, |_| one_of(&mut state, n))
                        }
                        Pick::Rotate(k) => {
                            let mut next = thread % k;
                            run(limiter, &local, base, calls, |_| {
                                let key = next;
                                next = if next + 1 == k { 0 } else { next + 1 };
                                key
                            })
                        }
                        Pick::Fresh(n) => run(limiter, &local, base, calls, |i| {
                            thread * (n / threads) + i as usize
                        }),
                        Pick::Everyday(n) => {
                            let mut keys = EverydayKeys::new(thread, base, n, fresh);
                            run(limiter, &local, base, calls, |i| keys.key(i))
                        }
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

/// A thread's `calls` calls of a slice, from caller time `base`, on the
/// keys `key(i)` names.
#[inline(always)]
fn run<C: Competitor>(
    limiter: &C,
    local: &C::Local,
    base: u64,
    calls: u64,
    mut key: impl FnMut(u64) -> usize,
) {
    let mut ns = base;
    for i in 0..calls {
        std::hint::black_box(limiter.call(local, key(i), ns, ns as f64 * 1e-9, 1));
        ns += STEP_NS;
    }
}

/// A competitor behind one object-safe face.
trait Slice: Sync {
    fn warm(&self, keys: usize, base: u64);
    fn slice(&self, threads: usize, pick: Pick, base: u64, fresh: usize) -> Duration;
    fn promotions(&self) -> Option<u64>;
    fn created(&self) -> Option<u64>;
}

impl<C: Competitor> Slice for C {
    /// Calls every key once, in order, from caller time `base` on, a call
    /// every [`STEP_NS`] as in the timed slices: the automatic sweep runs
    /// as it would in service (with every key created at one instant, no
    /// bucket was ever full when a sweep step ran, and none ran after).
    fn warm(&self, keys: usize, base: u64) {
        let local = self.local();
        for key in 0..keys {
            let ns = base + key as u64 * STEP_NS;
            let _ = self.call(&local, key, ns, ns as f64 * 1e-9, 1);
        }
    }
    fn slice(&self, threads: usize, pick: Pick, base: u64, fresh: usize) -> Duration {
        slice(self, threads, pick, base, fresh)
    }
    fn promotions(&self) -> Option<u64> {
        Competitor::promotions(self)
    }
    fn created(&self) -> Option<u64> {
        Competitor::created(self)
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
        Box::new(KeyrateNanos::new(spec, table.clone())),
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

/// `KEYRATE_PAIRED_PROFILE=N`: runs only competitor `N` (0 governor, 1
/// keyrate as users get it, then the table's columns in order), one
/// thread, `rounds` slices per scenario, timing nothing: a run to count
/// under callgrind, where the thread handshake of two-thread slices would
/// add a scheduler-dependent spin. The binary is the benchmark's own, so
/// the compiler's inlining is the one the ratios measure.
///
/// ```text
/// KEYRATE_PAIRED_PROFILE=1 KEYRATE_PAIRED_ONLY="1 hammered" KEYRATE_PAIRED_ROUNDS=1 \
///     valgrind --tool=callgrind target/release/deps/paired-* --bench
/// ```
fn profile(scenarios: &[(String, Spec, usize, Pick)], rounds: usize, which: usize) {
    let sim = AtomicU64::new(1_000_000_000);
    for &(_, spec, keys, pick) in scenarios {
        let new_keys = match pick {
            Pick::Everyday(_) => rounds * (SLICE / NEW_ONE_IN) as usize,
            _ => 0,
        };
        let table: Arc<[String]> = (0..(keys + new_keys) as u64).map(api_key).collect();
        let competitor = build(spec, &table).swap_remove(which);
        if !matches!(pick, Pick::Fresh(_) | Pick::Everyday(_)) {
            let base = sim.fetch_add(keys as u64 * STEP_NS + 1_000_000_000, Relaxed);
            competitor.warm(keys, base);
        }
        for round in 0..rounds {
            let base = sim.fetch_add(SLICE * STEP_NS + 1_000_000_000, Relaxed);
            let fresh = keys + round * (SLICE / NEW_ONE_IN) as usize;
            match pick {
                // As in the timed rounds: every key new, on a new limiter.
                Pick::Fresh(_) => build(spec, &table)
                    .swap_remove(which)
                    .slice(1, pick, base, fresh),
                _ => competitor.slice(1, pick, base, fresh),
            };
        }
    }
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
        .chain([10_000, 100_000, 1_000_000].into_iter().map(|n| {
            (
                format!("everyday, {n} active keys + 1 call in {NEW_ONE_IN} new"),
                Spec::ADMIT,
                n,
                Pick::Everyday(n),
            )
        }))
        .filter(|(name, ..)| {
            std::env::var("KEYRATE_PAIRED_ONLY").map_or(true, |only| name.contains(&only))
        })
        .collect();
    if let Ok(which) = std::env::var("KEYRATE_PAIRED_PROFILE") {
        let which = which.parse().expect("a competitor's column");
        // Only compound scenarios asked for: their own columns.
        match scenarios.is_empty() {
            true => compound::profile_compound(rounds, which),
            false => profile(&scenarios, rounds, which),
        }
        return;
    }
    // Caller time handed out so far: every slice takes a fresh stretch.
    let sim = AtomicU64::new(1_000_000_000);
    if scenarios.is_empty() {
        // Only compound scenarios asked for.
        compound(rounds, &sim);
        return;
    }
    println!(
        "median ratio to governor over {rounds} paired rounds [lowest-highest round], \
         {SLICE} calls per thread per slice; last columns: buckets keyrate created \
         per million timed calls, and (everyday) those above the keys' first \
         sightings, which no limiter avoids: keys its sweep evicted that came back"
    );
    println!();
    println!(
        "| scenario | threads | keyrate | keyrate, no cache | keyrate, no stats | \
         keyrate, quota per call | dashmap_word | keyrate over DashMap | \
         keyrate, Duration | keyrate: created per 10^6 calls | \
         created over first sightings, % of calls |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // keyrate's hot-key promotions per million timed calls, by scenario.
    let mut promotions = Vec::new();
    for (name, spec, keys, pick) in scenarios {
        // Everyday's never-seen keys follow the active ones in the table:
        // as many as the slices of every round at 1 and 2 threads name.
        let new_keys = match pick {
            Pick::Everyday(_) => rounds * 3 * (SLICE / NEW_ONE_IN) as usize,
            _ => 0,
        };
        let table: Arc<[String]> = (0..(keys + new_keys) as u64).map(api_key).collect();
        let mut promoted = 0;
        let mut timed_calls = 0;
        let mut fresh = keys;
        for threads in [1, 2] {
            // New limiters for each thread count, so that both rows start
            // alike: the everyday keys first seen in the timed rounds (not
            // left over from the 1-thread rounds), the warmed keys evicted
            // by the warm-up's sweep as in a server that has just met them.
            let competitors = build(spec, &table);
            if !matches!(pick, Pick::Fresh(_) | Pick::Everyday(_)) {
                let base = sim.fetch_add(keys as u64 * STEP_NS + 1_000_000_000, Relaxed);
                for competitor in &competitors {
                    competitor.warm(keys, base);
                }
            }
            let promoted_before = competitors[1].promotions().unwrap_or(0);
            let mut ratios = vec![Vec::new(); competitors.len()];
            let created_before = competitors[1].created().unwrap_or(0);
            let mut created_fresh = 0;
            // Only the everyday rows count first sightings.
            let mut first =
                matches!(pick, Pick::Everyday(_)).then(|| FirstSightings::new(table.len()));
            for round in 0..rounds {
                let mut times = vec![Duration::ZERO; competitors.len()];
                let mut keyrate_base = 0;
                for turn in 0..competitors.len() {
                    let which = (round + turn) % competitors.len();
                    let base = sim.fetch_add(SLICE * STEP_NS + 1_000_000_000, Relaxed);
                    times[which] = match pick {
                        // A new limiter, made and dropped outside the timing.
                        Pick::Fresh(_) => {
                            let made = build(spec, &table);
                            let time = made[which].slice(threads, pick, base, fresh);
                            if which == 1 {
                                created_fresh += made[which].created().unwrap_or(0);
                            }
                            time
                        }
                        _ => competitors[which].slice(threads, pick, base, fresh),
                    };
                    if which == 1 {
                        keyrate_base = base;
                    }
                }
                // Outside the timing, after the round (whose first
                // competitor turns with the rounds): keyrate's slice's keys.
                if let (Pick::Everyday(active), Some(first)) = (pick, first.as_mut()) {
                    first.slice(threads, active, keyrate_base, fresh);
                }
                fresh += threads * (SLICE / NEW_ONE_IN) as usize;
                timed_calls += pick.calls(threads) * threads as u64;
                for (which, time) in times.iter().enumerate() {
                    ratios[which].push(times[0].as_secs_f64() / time.as_secs_f64());
                }
            }
            let calls = (pick.calls(threads) * threads as u64 * rounds as u64) as f64;
            let created = competitors[1].created().unwrap_or(0) - created_before + created_fresh;
            print!("| {name} | {threads} |");
            for ratio in ratios.into_iter().skip(1) {
                let (mid, low, high) = median(ratio);
                print!(" {mid:.2}x [{low:.2}-{high:.2}] |");
            }
            print!(" {:.0} |", created as f64 * 1e6 / calls);
            match first {
                Some(first) => {
                    let over = created as f64 - first.count as f64;
                    println!(" {:.2} |", over * 100.0 / calls);
                }
                None => println!(" |"),
            }
            promoted += competitors[1].promotions().unwrap_or(0) - promoted_before;
        }
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
    compound(rounds, &sim);
}

//! The main job: hammer one shared limiter from several threads with many
//! realistic API keys and a few hot keys, print the throughput, and verify
//! that every key was admitted exactly what the semantics allow.
//!
//! Time is virtual and advances in rounds: within a round every call uses the
//! same timestamp, so for each key the exact number admitted is
//! `min(tokens available, calls made)`, whatever the interleaving. After each
//! round the program checks every key against that model.
//!
//! ```text
//! cargo run --release --example stress [-- THREADS]
//! ```

use keyrate::TokenBucketLimiter;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const KEYS: usize = 10_000;
const HOT_KEYS: usize = 4;
const ROUNDS: u64 = 40;
const ROUND_NS: u64 = 100_000_000; // 100 ms of virtual time per round
const RATE: f64 = 10.0; // tokens/s: one token per round
const CAPACITY: u64 = 20;
const HOT_CALLS_PER_ROUND: u64 = 50_000; // per thread, times HOT_KEYS
const COLD_CALLS_PER_ROUND: u64 = 40_000; // per thread, spread over all keys

fn api_key(i: usize) -> String {
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    format!("sk_live_{:016x}{:016x}", x, x.rotate_left(17) ^ i as u64)
}

fn main() -> ExitCode {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| {
            thread::available_parallelism()
                .map_or(2, |n| n.get())
                .max(2)
        });
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS + HOT_KEYS).map(api_key).collect());
    let limiter = Arc::new(TokenBucketLimiter::new(RATE, CAPACITY));
    // Per key: calls and admissions in the current round.
    let calls: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let admitted: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let barrier = Arc::new(Barrier::new(threads + 1));

    println!(
        "keyrate stress: {threads} threads, {KEYS} keys + {HOT_KEYS} hot keys, \
         rate {RATE}/s, capacity {CAPACITY}, {ROUNDS} rounds of {} ms",
        ROUND_NS / 1_000_000
    );

    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (keys, limiter, calls, admitted, barrier) = (
                Arc::clone(&keys),
                Arc::clone(&limiter),
                Arc::clone(&calls),
                Arc::clone(&admitted),
                Arc::clone(&barrier),
            );
            thread::spawn(move || {
                let mut x = 0x9e37_79b9_u64 * (t as u64 + 1);
                let mut busy = Duration::ZERO;
                for round in 0..ROUNDS {
                    barrier.wait();
                    let now = (round * ROUND_NS) as f64 / 1e9;
                    let started = Instant::now();
                    let mut local_calls = [0u64; HOT_KEYS];
                    let mut local_admitted = [0u64; HOT_KEYS];
                    for i in 0..HOT_CALLS_PER_ROUND * HOT_KEYS as u64 {
                        // Hot key 0 (the attacker) takes two calls in three,
                        // so each thread caches it; keys 1..3 share the rest
                        // and stay in the map.
                        let h = match i % 3 {
                            2 => 1 + (i / 3) as usize % (HOT_KEYS - 1),
                            _ => 0,
                        };
                        local_calls[h] += 1;
                        local_admitted[h] += u64::from(limiter.allow(keys[KEYS + h].as_str(), now));
                    }
                    for _ in 0..COLD_CALLS_PER_ROUND {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = (x % KEYS as u64) as usize;
                        let ok = limiter.allow(keys[k].as_str(), now);
                        // Relaxed: counters are read after the round's barrier,
                        // which orders them.
                        calls[k].fetch_add(1, Ordering::Relaxed);
                        admitted[k].fetch_add(u64::from(ok), Ordering::Relaxed);
                    }
                    busy += started.elapsed();
                    for h in 0..HOT_KEYS {
                        calls[KEYS + h].fetch_add(local_calls[h], Ordering::Relaxed);
                        admitted[KEYS + h].fetch_add(local_admitted[h], Ordering::Relaxed);
                    }
                    barrier.wait();
                }
                busy
            })
        })
        .collect();

    // The exact model: per key, refill credit in ns (one token = 1e8 ns).
    let token_ns = (1e9 / RATE) as u64;
    let full = CAPACITY * token_ns;
    let mut credit = vec![full; keys.len()];
    let mut last = vec![0u64; keys.len()];
    let mut mismatches = 0u64;
    let (mut total_calls, mut total_admitted) = (0u64, 0u64);
    let wall = Instant::now();
    for round in 0..ROUNDS {
        barrier.wait(); // start the round
        barrier.wait(); // wait for its end
        let now = round * ROUND_NS;
        for k in 0..keys.len() {
            let c = calls[k].swap(0, Ordering::Relaxed);
            let a = admitted[k].swap(0, Ordering::Relaxed);
            total_calls += c;
            total_admitted += a;
            if c == 0 {
                continue;
            }
            let available = (credit[k] + (now - last[k])).min(full);
            let expected = (available / token_ns).min(c);
            if a != expected {
                mismatches += 1;
                if mismatches <= 10 {
                    eprintln!(
                        "MISMATCH round {round} key {}: admitted {a}, expected {expected}",
                        keys[k]
                    );
                }
            }
            credit[k] = available - expected * token_ns;
            last[k] = now;
        }
    }
    let wall = wall.elapsed();
    let busy: Duration = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let per_thread_busy = busy / threads as u32;

    println!(
        "calls: {total_calls}, admitted: {total_admitted}, denied: {}",
        total_calls - total_admitted
    );
    println!(
        "throughput: {:.1} M calls/s across {threads} threads ({:.1} ns per call per thread); wall {:.2?}",
        total_calls as f64 / per_thread_busy.as_secs_f64() / 1e6,
        per_thread_busy.as_nanos() as f64 * threads as f64 / total_calls as f64,
        wall
    );
    println!("buckets held: {}", limiter.len());
    if mismatches == 0 {
        println!(
            "verified: all {} keys admitted exactly min(tokens available, calls) in each of {ROUNDS} rounds",
            keys.len()
        );
        ExitCode::SUCCESS
    } else {
        println!("FAILED: {mismatches} key-rounds admitted the wrong count");
        ExitCode::FAILURE
    }
}

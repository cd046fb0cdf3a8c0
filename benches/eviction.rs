//! The cost of bounded memory: a full sweep of 1,000,000 idle buckets, and
//! the automatic sweep's share of the insert path (churn: every call a
//! never-seen key, timestamps advancing so that old buckets go idle).
//!
//! ```text
//! cargo bench --bench eviction
//! ```

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use keyrate::TokenBucketLimiter;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn api_key(i: u64) -> String {
    format!(
        "sk_live_{:032x}",
        u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
    )
}

fn full_sweep(c: &mut Criterion) {
    const KEYS: u64 = 1_000_000;
    let keys: Vec<String> = (0..KEYS).map(api_key).collect();
    let mut group = c.benchmark_group("sweep");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(KEYS));
    group.bench_function("1M idle buckets", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let limiter = TokenBucketLimiter::new(10.0, 5).with_auto_sweep(false);
                for key in &keys {
                    assert!(limiter.allow(key.as_str(), 0.0));
                }
                let started = Instant::now();
                let removed = limiter.sweep(10.0);
                total += started.elapsed();
                assert_eq!(removed as u64, KEYS);
            }
            total
        });
    });
    group.finish();
}

fn churn_with_and_without_auto_sweep(c: &mut Criterion) {
    const KEYS: u64 = 200_000;
    let keys: Vec<String> = (0..KEYS).map(api_key).collect();
    let mut group = c.benchmark_group("churn insert");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(KEYS));
    for auto in [false, true] {
        let name = if auto {
            "auto sweep on"
        } else {
            "auto sweep off"
        };
        group.bench_with_input(BenchmarkId::from_parameter(name), &auto, |b, &auto| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // 1 token per 10 ms, so a key is idle 10 ms after its
                    // call; a new key every 10 us keeps ~1,000 active.
                    let limiter = TokenBucketLimiter::new(100.0, 1).with_auto_sweep(auto);
                    let started = Instant::now();
                    for (i, key) in keys.iter().enumerate() {
                        black_box(limiter.allow(key.as_str(), i as f64 * 1e-5));
                    }
                    total += started.elapsed();
                    black_box(limiter.len());
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group!(benches, full_sweep, churn_with_and_without_auto_sweep);
criterion_main!(benches);

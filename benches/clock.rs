//! What one clock reading costs, and what it adds to a limiter call.
//!
//! Compares `std::time::Instant` (keyrate's `MonotonicClock`) with quanta,
//! the TSC-based clock governor uses by default. quanta is cheaper per
//! reading, but its TSC source was not monotonic across cores on some
//! machines (governor's issue tracker has the reports), and a limiter
//! whose clock steps back only gets stricter; `Instant` is monotonic by
//! contract. Run with:
//!
//! ```text
//! cargo bench --bench clock
//! ```

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use keyrate::{Clock, ManualClock, MonotonicClock, Now, TokenBucketLimiter};
use std::time::Instant;

fn readings(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock_read");
    group.bench_function("std_instant_now", |b| b.iter(|| black_box(Instant::now())));
    let monotonic = MonotonicClock::new();
    group.bench_function("monotonic_clock_now", |b| {
        b.iter(|| black_box(monotonic.now()))
    });
    let quanta_clock = quanta::Clock::new();
    group.bench_function("quanta_clock_now", |b| {
        b.iter(|| black_box(quanta_clock.now()))
    });
    group.bench_function("quanta_clock_raw", |b| {
        b.iter(|| black_box(quanta_clock.raw()))
    });
    let manual = ManualClock::new();
    group.bench_function("manual_clock_now", |b| b.iter(|| black_box(manual.now())));
    group.finish();
}

fn limiter_calls(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter_call");
    // A bucket that never runs dry: every call is admitted.
    let limiter = TokenBucketLimiter::new(1e9, 1 << 40);
    let handle = limiter.bucket("key");
    group.bench_function("keyed_allow_fixed_timestamp", |b| {
        b.iter(|| black_box(limiter.allow(black_box("key"), 1.0)))
    });
    group.bench_function("keyed_allow_now", |b| {
        b.iter(|| black_box(limiter.allow(black_box("key"), Now)))
    });
    group.bench_function("handle_allow_now", |b| {
        b.iter(|| black_box(handle.allow(Now)))
    });
    group.finish();
}

criterion_group!(benches, readings, limiter_calls);
criterion_main!(benches);

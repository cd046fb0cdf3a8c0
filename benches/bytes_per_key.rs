//! Bytes of heap each limiter holds per key, counted by a global allocator
//! that tracks live requested bytes (allocator rounding and fragmentation
//! are not included, for any competitor).
//!
//! For each competitor and each key count, the limiter is made and every
//! key called once (40-byte `sk_live_` keys, made beforehand); the live
//! bytes the limiter added, divided by the key count, is its cost per key,
//! including its own copy of each key. Printed as a markdown table with the
//! ratio to governor; `scripts/bench.sh` runs it.

#[allow(dead_code)]
mod common;

use common::compound::KeyrateCompound;
use common::{
    api_key, AtomicFloor, Competitor, DashTuple, Governor, Keyrate, MutexMap, SccBoxWord, Spec,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// The system allocator, counting live requested bytes.
struct Counting;

/// Live bytes requested from [`Counting`]. Relaxed: a plain counter, read
/// only on the one thread that made the allocations being measured.
static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's own arguments,
// so `System`'s guarantees carry over unchanged; the counter is bookkeeping
// only and never affects the pointers returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `realloc`'s contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(new_size, Relaxed);
            LIVE.fetch_sub(layout.size(), Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Live bytes `make` adds once every key has been called once.
fn bytes_per_key<C: Competitor>(keys: &Arc<[String]>, make: impl Fn(Arc<[String]>) -> C) -> f64 {
    let before = LIVE.load(Relaxed);
    let limiter = make(keys.clone());
    let local = limiter.local();
    for key in 0..keys.len() {
        assert!(
            limiter.call(&local, key, 0, 0.0, 1),
            "a new key is admitted"
        );
    }
    let after = LIVE.load(Relaxed);
    drop(local);
    drop(limiter);
    (after - before) as f64 / keys.len() as f64
}

/// Live bytes per `u64` id: keyrate's `TokenBucketLimiter<u64>` beside
/// governor keyed by `u64` (both over DashMap; governor's default clock, which
/// only matters for timing, not for memory).
fn bytes_per_u64_id(n: u64) -> (f64, f64) {
    let before = LIVE.load(Relaxed);
    let keyrate = keyrate::TokenBucketLimiter::<u64>::with_quota(
        keyrate::Quota::new(1.0, 10).expect("valid quota"),
    );
    for id in 0..n {
        assert!(keyrate.allow(&id, 0.0), "a new key is admitted");
    }
    let keyrate_bytes = (LIVE.load(Relaxed) - before) as f64 / n as f64;
    drop(keyrate);

    let before = LIVE.load(Relaxed);
    let quota = governor::Quota::per_second(std::num::NonZeroU32::new(1).expect("nonzero"))
        .allow_burst(std::num::NonZeroU32::new(10).expect("nonzero"));
    let governor = governor::RateLimiter::<u64, _, _>::dashmap(quota);
    for id in 0..n {
        assert!(governor.check_key(&id).is_ok(), "a new key is admitted");
    }
    let governor_bytes = (LIVE.load(Relaxed) - before) as f64 / n as f64;
    drop(governor);
    (keyrate_bytes, governor_bytes)
}

fn main() {
    let counts = [10_000usize, 100_000, 1_000_000];
    let spec = Spec::ADMIT;
    let mut rows: Vec<(&str, Vec<f64>)> = Vec::new();
    let all_keys: Vec<Arc<[String]>> = counts
        .iter()
        .map(|&n| (0..n as u64).map(api_key).collect())
        .collect();
    let mut measure = |name, f: &dyn Fn(&Arc<[String]>) -> f64| {
        rows.push((name, all_keys.iter().map(f).collect()));
    };
    measure("keyrate", &|k| bytes_per_key(k, |k| Keyrate::new(spec, k)));
    measure("keyrate compound, 1 quota", &|k| {
        bytes_per_key(k, |k| KeyrateCompound::new(spec, k, 1))
    });
    measure("keyrate compound, 2 quotas", &|k| {
        bytes_per_key(k, |k| KeyrateCompound::new(spec, k, 2))
    });
    measure("governor", &|k| {
        bytes_per_key(k, |k| Governor::new(spec, k))
    });
    measure("mutex_hashmap", &|k| {
        bytes_per_key(k, |k| MutexMap::new(spec, k))
    });
    measure("dashmap_tuple", &|k| {
        bytes_per_key(k, |k| DashTuple::new(spec, k))
    });
    measure("scc_box_word", &|k| {
        bytes_per_key(k, |k| SccBoxWord::new(spec, k))
    });
    measure("atomic_floor", &|k| {
        bytes_per_key(k, |k| AtomicFloor::new(spec, k))
    });

    let governor = rows
        .iter()
        .find(|(name, _)| *name == "governor")
        .map(|(_, bytes)| bytes.clone())
        .expect("governor measured");
    println!("bytes per key (live requested heap bytes / keys, 40-byte keys, key copy included)");
    print!("| competitor |");
    for n in counts {
        print!(" {n} keys | vs governor |");
    }
    println!();
    println!("|---|{}", "---:|---:|".repeat(counts.len()));
    for (name, bytes) in &rows {
        print!("| {name} |");
        for (b, g) in bytes.iter().zip(&governor) {
            print!(" {b:.1} | {:.2}x |", b / g);
        }
        println!();
    }

    println!();
    println!("bytes per key for u64 ids (live requested heap bytes / keys)");
    println!("| keys | keyrate | governor | keyrate vs governor |");
    println!("|---:|---:|---:|---:|");
    for n in counts {
        let (keyrate, governor) = bytes_per_u64_id(n as u64);
        println!(
            "| {n} | {keyrate:.1} | {governor:.1} | {:.2}x |",
            keyrate / governor
        );
    }
}

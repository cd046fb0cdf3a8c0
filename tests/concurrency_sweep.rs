//! The automatic sweep of idle keys in `ConcurrencyLimiter`, by the
//! second-chance rule: a flood of one-shot keys stays bounded, and a key
//! taken at least once a pass is never removed (so never created again).
//! Counts only (entries tracked, entries created), never timings; one
//! thread per limiter, so every count is exact.
#![cfg(not(loom))]

use keyrate::ConcurrencyLimiter;

/// The documented bound on idle entries under a flood of keys that each
/// take and give back one permit: three passes of 4,096 creations.
const FLOOD_BOUND: usize = 3 * 4_096;

/// A pass of the automatic sweep spans 4,096 creations while the map is
/// small (a step of 256 table buckets every 16 creations, 256 shards).
const PASS: u32 = 4_096;

/// A million keys, each taking and giving back one permit: the entries
/// tracked never exceed the bound (sampled every 64 keys, and at most 64
/// more between samples), and the sweep removed all but those.
#[test]
fn million_one_shot_keys_stay_bounded() {
    let limiter = ConcurrencyLimiter::new(1);
    let mut most = 0;
    for i in 0..1_000_000u32 {
        drop(limiter.try_acquire(&format!("flood-{i}")).unwrap());
        if i % 64 == 0 {
            most = most.max(limiter.len());
        }
    }
    assert!(most <= FLOOD_BOUND, "{most} keys tracked at once");
    let stats = limiter.stats();
    assert_eq!(stats.keys_created, 1_000_000);
    assert_eq!(stats.keys_removed, 1_000_000 - stats.keys);
    assert!(stats.keys as usize <= FLOOD_BOUND);
}

/// A key taken every 1,000 new keys (four times a pass) amid a flood is
/// created once: the sweep never removes it, though it is idle at almost
/// every visit. Its permit is held for none of that time.
#[test]
fn key_taken_every_pass_is_never_recreated() {
    let limiter = ConcurrencyLimiter::new(1);
    let flood = 200_000u32;
    for i in 0..flood {
        if i % 1_000 == 0 {
            drop(limiter.try_acquire("steady").unwrap());
        }
        drop(limiter.try_acquire(&format!("flood-{i}")).unwrap());
    }
    let stats = limiter.stats();
    assert_eq!(
        stats.keys_created,
        u64::from(flood) + 1,
        "\"steady\" was recreated"
    );
    assert!(stats.keys_removed >= u64::from(flood) - FLOOD_BOUND as u64);
}

/// The contrast: a key taken only every three passes is idle for whole
/// passes, so the sweep removes it in between and it is created again
/// (the rule does remove idle keys, not only new ones).
#[test]
fn key_idle_for_whole_passes_is_removed() {
    let limiter = ConcurrencyLimiter::new(1);
    let flood = 200_000u32;
    let every = 3 * PASS;
    for i in 0..flood {
        if i % every == 0 {
            drop(limiter.try_acquire("rare").unwrap());
        }
        drop(limiter.try_acquire(&format!("flood-{i}")).unwrap());
    }
    let rare_takes = u64::from(flood.div_ceil(every));
    let rare_created = limiter.stats().keys_created - u64::from(flood);
    assert!(rare_created > 1, "\"rare\" was never removed");
    assert!(rare_created <= rare_takes);
}

/// A key holding a permit is never removed, through many passes, and is
/// removed once idle for a whole pass after its release.
#[test]
fn held_key_is_kept_then_removed_once_idle() {
    let limiter = ConcurrencyLimiter::new(1);
    let held = limiter.try_acquire("held").unwrap();
    let mut i = 0u32;
    let mut flood = |n: u32| {
        for _ in 0..n {
            drop(limiter.try_acquire(&format!("flood-{i}")).unwrap());
            i += 1;
        }
    };
    flood(10 * PASS);
    assert_eq!(limiter.held("held"), 1);
    drop(held);
    flood(3 * PASS);
    let stats = limiter.stats();
    assert_eq!(stats.in_flight, 0);
    // "held" is gone: taking it again creates its entry.
    let before = stats.keys_created;
    drop(limiter.try_acquire("held").unwrap());
    assert_eq!(limiter.stats().keys_created, before + 1);
}

/// Keys in rotation fewer than the bound: once every key has its entry,
/// no call creates one again (10,000 keys picked at random, as in
/// `benches/concurrency.rs`).
#[test]
fn random_rotation_below_the_bound_stops_creating() {
    let limiter = ConcurrencyLimiter::new(1);
    let keys: Vec<String> = (0..10_000).map(|i| format!("rot-{i}")).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut call = |limiter: &ConcurrencyLimiter| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = &keys[(state % keys.len() as u64) as usize];
        drop(limiter.try_acquire(key).unwrap());
    };
    // Every key in turn, then a warm-up at random.
    for key in &keys {
        drop(limiter.try_acquire(key).unwrap());
    }
    for _ in 0..200_000 {
        call(&limiter);
    }
    let warm = limiter.stats().keys_created;
    for _ in 0..500_000 {
        call(&limiter);
    }
    assert_eq!(limiter.stats().keys_created, warm, "entries recreated");
    assert_eq!(limiter.len(), 10_000);
}

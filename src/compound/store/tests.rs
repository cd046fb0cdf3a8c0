//! Unit tests of the compound store: making room at the cap.

use super::*;
use crate::time::Nanos;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;

const SEC: u64 = 1_000_000_000;

fn sweeps<K, S>(store: &Store<K, S>) -> usize {
    store.shard_sweeps.load(Ordering::Relaxed)
}

/// At the cap, a refused call sweeps nothing until the first bucket
/// can be full, then one shard a call: the one whose bound is
/// earliest, found stale (its bucket was spent since) or not.
#[test]
fn making_room_sweeps_one_shard_and_only_once_a_bucket_can_be_full() {
    // A fixed hasher: the same shards every run.
    let mut store = Store::<String, _>::new(BuildHasherDefault::<DefaultHasher>::default());
    store.set_max_keys(100);
    // Key i's one word: full at i + 1 seconds.
    let spend = |key: &str, full_at: u64| {
        let hash = store.hash(key);
        store.with_cell(hash, key, 1, false, |slot| match slot {
            InMap::Inline(words) => words.set([Nanos::new(full_at), Nanos::ZERO]),
            InMap::Shared(_) => panic!("a one-word cell is inline"),
        })
    };
    for i in 0..100 {
        assert!(spend(&format!("k{i}"), (i + 1) * SEC).is_ok());
    }
    assert!(spend("new", SEC).is_err(), "the map is full");

    assert!(!store.make_room(Nanos::new(SEC / 2), NO_CELLS));
    assert_eq!(sweeps(&store), 0, "no bucket can be full before 1 s");

    assert!(
        store.make_room(Nanos::new(SEC), NO_CELLS),
        "k0 is full at 1 s"
    );
    assert_eq!((sweeps(&store), store.len()), (1, 99));
    assert!(!store.make_room(Nanos::new(SEC), NO_CELLS));
    assert_eq!(sweeps(&store), 1, "the next bucket is full at 2 s");

    // k1 spent again: its shard's bound (2 s) is stale.
    assert!(spend("k1", 50 * SEC).is_ok());
    assert!(!store.make_room(Nanos::new(2 * SEC), NO_CELLS));
    assert_eq!(sweeps(&store), 2, "one shard swept, k1's");
    assert!(!store.make_room(Nanos::new(2 * SEC), NO_CELLS));
    assert_eq!(sweeps(&store), 2, "its bound is exact again");
    assert_eq!(store.len(), 99);

    // A new key lowers its shard's bound: room made at its full_at.
    assert!(spend("new", SEC).is_ok());
    assert!(store.make_room(Nanos::new(SEC), NO_CELLS));
    assert_eq!((sweeps(&store), store.len()), (3, 99));
    assert!(
        store.words("new").is_none(),
        "the new key's bucket was the full one"
    );
}

/// The automatic sweep steps one slice of a shard's table at a time, not
/// the shard: with shards several slices long, no step removes more than
/// a slice's table buckets hold, and the steps of one pass, after a pass
/// that saw every cell idle, remove every full one. Once a pass has gone
/// through a shard, the shard's bound for room at the cap is exact again:
/// the least `full_at` of the cells it kept (a slice alone would leave it
/// at the removed cells' 1 s for ever).
#[test]
fn an_automatic_step_sweeps_one_slice_of_a_shard() {
    let store = Store::<String, _>::new(BuildHasherDefault::<DefaultHasher>::default());
    // About 300 cells a shard: more than one slice of table buckets each.
    // One key in ten is spent far ahead (kept); the others are full at 1 s.
    let keys = SHARDS * 300;
    let full_at = |i: usize| match i % 10 {
        0 => 100 * SEC + i as u64,
        _ => SEC,
    };
    for i in 0..keys {
        let key = format!("k{i}");
        let hash = store.hash(key.as_str());
        let made = store.with_cell(hash, key.as_str(), 1, false, |slot| match slot {
            InMap::Inline(words) => words.set([Nanos::new(full_at(i)), Nanos::ZERO]),
            InMap::Shared(_) => panic!("a one-word cell is inline"),
        });
        assert!(made.is_ok());
    }
    let kept = (0..keys).filter(|i| i % 10 == 0).count();
    // Every step due: as if many keys had been made since the last one.
    let step = |now: Nanos| {
        store.pace.force_due();
        store.step(now)
    };
    // The first pass only learns when the pass started: it removes
    // nothing (a cell goes once idle since the previous pass started).
    let mut steps = 0;
    let mut removed = loop {
        steps += 1;
        assert!(steps <= keys, "a pass never ended");
        let removed = step(Nanos::new(10 * SEC));
        if removed > 0 {
            break removed;
        }
    };
    let pass = steps - 1;
    assert!(
        pass > 2 * SHARDS,
        "{pass} steps for a pass of {SHARDS} shards"
    );
    loop {
        assert!(removed <= SWEEP_SLICE, "a step removed {removed} cells");
        if steps == 2 * pass {
            break;
        }
        removed = step(Nanos::new(10 * SEC));
        steps += 1;
    }
    assert_eq!(store.len(), kept, "the second pass removed every full cell");
    for shard in store.shards.iter() {
        let mut least = u64::MAX;
        shard.map.lock().retain(|(_, slot)| {
            least = least.min(decide::full_at(&slot.words_now(Nanos::ZERO)).as_u64());
            true
        });
        assert_eq!(shard.full_from.load(unmodeled::Relaxed), least);
    }
}

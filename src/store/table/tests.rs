//! Unit tests of the shard table: growth a step at a time, and sweeps in
//! slices.

use super::Table;
use std::time::{Duration, Instant};

fn hash(x: &u64) -> u64 {
    x.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A minute of real time for a loop that waits for the table to reach a
/// state (far beyond any honest run): a table that never gets there fails
/// the test, naming what it waited for, instead of spinning it for ever.
struct Deadline {
    what: &'static str,
    at: Instant,
}

impl Deadline {
    fn new(what: &'static str) -> Self {
        Deadline {
            what,
            at: Instant::now() + Duration::from_secs(60),
        }
    }

    fn check(&self) {
        assert!(
            Instant::now() < self.at,
            "never: {}, in a minute",
            self.what
        );
    }
}

#[test]
fn grows_a_step_at_a_time_and_loses_nothing() {
    let mut table = Table::default();
    for x in 0..100_000u64 {
        table.insert(hash(&x), x, hash);
        if x % 997 == 0 {
            for y in (0..=x).step_by(101) {
                assert_eq!(table.find(hash(&y), |v| *v == y), Some(&y));
            }
        }
    }
    assert_eq!(table.len(), 100_000);
    // Every set-aside table was emptied before `main` filled again.
    assert!(table.old.len() < table.main.len() / 2);
    table.retain(|v| *v % 2 == 0);
    assert_eq!(table.len(), 50_000);
    assert!(table.remove_if(hash(&4), |v| *v == 4, |_| true));
    assert!(!table.remove_if(hash(&6), |v| *v == 6, |_| false));
    assert!(!table.remove_if(hash(&5), |v| *v == 5, |_| true));
    assert_eq!(table.find_mut(hash(&6), |v| *v == 6), Some(&mut 6));
    table.shrink_to_fit(hash);
    assert!(table.old.is_empty());
    assert_eq!(table.len(), 49_999);
}

#[test]
fn no_write_moves_more_than_a_step() {
    let mut table = Table::default();
    let (mut set_aside, mut full_updates) = (0, 0);
    for x in 0..50_000u64 {
        let before = table.old.len();
        table.insert(hash(&x), x, hash);
        let after = table.old.len();
        if after > before {
            // A set-aside: it found `old` already empty, so it moved
            // nothing itself.
            assert_eq!(before, 0);
            set_aside += 1;
        } else {
            assert!(before - after <= super::STEP);
        }
        // An update (a write that finds its key) moves fewer.
        if x % 2 == 0 {
            let before = table.old.len();
            table.step(hash);
            let moved = before - table.old.len();
            assert!(moved <= super::UPDATE_STEP);
            full_updates += usize::from(moved == super::UPDATE_STEP);
        }
    }
    assert!(full_updates > 0, "no update moved entries");
    assert!(set_aside >= 5, "{set_aside} set-asides");
    assert_eq!(table.len(), 50_000);
}

/// The growth schedule, step by step: a small table grows the plain
/// way (its layout changes, nothing is set aside); a full table of
/// `SMALL` entries or more is set aside for one with room for twice
/// its entries; each later write moves `STEP` entries over, so `old`
/// is empty after `ceil(len / STEP)` writes and freed by the write
/// that empties it; every other write leaves the layout as it was.
#[test]
fn the_growth_schedule_step_by_step() {
    use super::{SMALL, STEP};
    let mut table = Table::default();
    let mut x = 0u64;
    let mut insert = |table: &mut Table<u64>| {
        table.insert(hash(&x), x, hash);
        x += 1;
    };
    // Small tables: a layout change exactly when a full one grows.
    let deadline = Deadline::new("a set-aside table");
    while table.old.allocation_size() == 0 {
        deadline.check();
        let (layout, len) = (table.layout(), table.main.len());
        let full = len == table.main.capacity();
        insert(&mut table);
        if table.old.allocation_size() == 0 {
            assert!(!full || len < SMALL, "{len} entries grew the plain way");
            assert_eq!(table.layout(), layout + u64::from(full));
        } else {
            assert!(full && len >= SMALL, "set aside at {len} entries");
            assert_eq!(table.layout(), layout + 1, "a set-aside");
        }
    }
    // The set-aside: `old` holds the full table, `main` the new entry
    // and room for twice the set-aside entries.
    let set_aside = table.old.len();
    assert!(set_aside >= SMALL);
    assert_eq!(table.main.len(), 1);
    assert!(table.main.capacity() >= 2 * set_aside);
    let layout = table.layout();
    for write in 1..=set_aside.div_ceil(STEP) {
        insert(&mut table);
        let left = set_aside.saturating_sub(write * STEP);
        assert_eq!(table.old.len(), left, "write {write}");
        assert_eq!(table.len(), set_aside + 1 + write);
        if left > 0 {
            assert_eq!(table.layout(), layout, "write {write}");
            assert!(table.old.allocation_size() > 0);
        }
    }
    // The write that emptied `old` freed it; `main` has not filled up.
    assert_eq!(table.old.allocation_size(), 0);
    assert_eq!(table.layout(), layout + 1);
    assert!(table.main.len() < table.main.capacity());
    let layout = table.layout();
    insert(&mut table);
    assert_eq!(table.layout(), layout, "a plain write");
    // A shrink changes the layout too.
    table.shrink_to_fit(hash);
    assert_eq!(table.layout(), layout + 1);
}

/// While a set-aside table is being emptied, a lookup for writing
/// finds every key, in `main` (the newest) or in `old`.
#[test]
fn find_mut_finds_keys_in_either_table_while_old_is_emptied() {
    let mut table = Table::default();
    let mut x = 0u64;
    let deadline = Deadline::new("a set-aside table");
    while table.old.is_empty() {
        deadline.check();
        table.insert(hash(&x), x, hash);
        x += 1;
    }
    // Just set aside: `main` holds only the newest key.
    assert_eq!(table.main.len(), 1);
    for mut y in 0..x {
        assert_eq!(table.find_mut(hash(&y), |v| *v == y), Some(&mut y));
        assert_eq!(table.find(hash(&y), |v| *v == y), Some(&y));
    }
    assert_eq!(table.find_mut(hash(&x), |v| *v == x), None);
    assert_eq!(table.find(hash(&x), |v| *v == x), None);
}

/// A set-aside table that the sweep thinned out is emptied a bounded
/// slice of buckets per write (`STEP * SCAN_PER_MOVE` at most), not
/// scanned to its end by the first write that finds it sparse.
#[test]
fn a_thinned_out_old_table_is_emptied_a_slice_per_write() {
    use super::{SCAN_PER_MOVE, STEP};
    let slice = STEP * SCAN_PER_MOVE;
    let mut table = Table::default();
    let mut x = 0u64;
    // Until a set-aside table of a few slices.
    let deadline = Deadline::new("a set-aside table of four slices");
    while table.old.allocation_size() == 0 || table.old.num_buckets() < 4 * slice {
        deadline.check();
        table.insert(hash(&x), x, hash);
        x += 1;
    }
    // The sweep removes every entry of `old` but the one in its last
    // occupied bucket.
    let last = (0..table.old.num_buckets())
        .rev()
        .find(|&b| table.old.get_bucket_entry(b).is_ok())
        .expect("old holds entries");
    assert!(last >= 2 * slice, "{last} buckets");
    let survivor = *table.old.get_bucket_entry(last).unwrap().get();
    table.retain_range(0..last, |_| false);
    assert_eq!(table.old.len(), 1);
    let mut writes = 0;
    let deadline = Deadline::new("the set-aside table's memory freed");
    while table.old.allocation_size() > 0 {
        deadline.check();
        let before = table.old_next;
        table.insert(hash(&x), x, hash);
        x += 1;
        writes += 1;
        assert!(
            table.old.allocation_size() == 0 || table.old_next - before <= slice,
            "write {writes} looked at {} buckets",
            table.old_next - before
        );
    }
    assert_eq!(writes, (last + 1).div_ceil(slice), "one slice a write");
    assert_eq!(
        table.find(hash(&survivor), |v| *v == survivor),
        Some(&survivor)
    );
}

/// A set-aside table that the sweep empties is freed by the next write,
/// not kept until the next set-aside.
#[test]
fn a_swept_empty_old_table_is_freed() {
    let mut table = Table::default();
    let mut x = 0u64;
    let deadline = Deadline::new("a set-aside table");
    while table.old.allocation_size() == 0 {
        deadline.check();
        table.insert(hash(&x), x, hash);
        x += 1;
    }
    // The sweep removes everything the set-aside table holds.
    table.retain_range(0..table.old.num_buckets(), |_| false);
    assert!(table.old.is_empty());
    assert!(table.old.allocation_size() > 0);
    table.step(hash);
    assert_eq!(table.old.allocation_size(), 0);
    assert_eq!(table.len(), table.main.len());
    assert!(table.len() > 0);
}

/// A sweep in slices, old's buckets then main's, with insertions (and
/// so moves and set-asides) between slices, visits every entry that
/// was in the table when it started, unless the layout changed (then
/// it starts over, as the limiter's sweep does).
#[test]
fn a_sweep_in_slices_misses_no_entry() {
    let mut table = Table::default();
    let mut next = 0u64;
    for _ in 0..3_000 {
        table.insert(hash(&next), next, hash);
        next += 1;
    }
    for _ in 0..6 {
        let present: Vec<u64> = (0..next)
            .filter(|x| table.find(hash(x), |v| v == x).is_some())
            .collect();
        let mut seen = std::collections::HashSet::new();
        let (mut from, mut layout) = (0, table.layout());
        while from < table.buckets() {
            if table.layout() != layout {
                (from, layout) = (0, table.layout());
            }
            let to = (from + 64).min(table.buckets());
            table.retain_range(from..to, |v| {
                seen.insert(*v);
                true
            });
            from = to;
            for _ in 0..3 {
                table.insert(hash(&next), next, hash);
                next += 1;
            }
        }
        for x in present {
            assert!(seen.contains(&x), "{x} was missed");
        }
    }
}

/// A key's `Hash` that panics while a write moves entries out of `old`
/// loses none of them: each entry leaves `old` only once its hash is
/// known, and the next write moves them.
#[test]
fn a_hash_that_panics_during_a_move_loses_no_entry() {
    let mut table = Table::default();
    let mut x = 0u64;
    // Fill until a table is set aside and still holds entries to move.
    while table.old.len() <= 2 * super::STEP {
        table.insert(hash(&x), x, hash);
        x += 1;
        assert!(x < 1_000_000, "no table was set aside");
    }
    let held = table.len();
    let old_before = table.old.len();
    let next_before = table.old_next;
    let calls = std::cell::Cell::new(0);
    let panics_on_fifth = |v: &u64| {
        calls.set(calls.get() + 1);
        assert!(calls.get() != super::UPDATE_STEP, "a key's hash panics");
        hash(v)
    };
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        table.step(panics_on_fifth);
    }));
    assert!(unwound.is_err(), "the hash panicked");
    assert_eq!(table.len(), held, "an entry was lost");
    assert_eq!(table.old.len(), old_before, "the batch moved in part");
    assert_eq!(table.old_next, next_before, "the moves passed entries by");
    for y in 0..x {
        assert_eq!(table.find(hash(&y), |v| *v == y), Some(&y), "key {y}");
    }
    // The next write moves them, as it would have.
    table.step(hash);
    assert_eq!(table.old.len(), old_before - super::UPDATE_STEP);
    let deadline = Deadline::new("the set-aside table's memory freed");
    while table.old.allocation_size() > 0 {
        deadline.check();
        table.step(hash);
    }
    assert_eq!(table.len(), held);
}

/// A table that a sweep in slices thins out to a few entries shrinks when
/// the sweep finishes it: set aside for a table with room for twice its
/// entries, which writes fill a step at a time (no write moves more than
/// a step), losing nothing; its memory goes once the last entry moved.
/// A table a sweep leaves well used keeps its room.
#[test]
fn a_table_thinned_out_by_the_sweep_shrinks_a_step_at_a_time() {
    use super::{Cursor, STEP};
    let sweep = |table: &mut Table<u64>, keep: &dyn Fn(u64) -> bool| {
        let mut at = Cursor::default();
        loop {
            match table.retain_slice(at, 256, |v| keep(*v)) {
                Ok(next) => at = next,
                Err(left) => return left,
            }
        }
    };
    let mut table = Table::default();
    for x in 0..100_000u64 {
        table.insert(hash(&x), x, hash);
    }
    let deadline = Deadline::new("the set-aside table emptied");
    while !table.old.is_empty() {
        deadline.check();
        table.step(hash);
    }
    let peak = table.main.allocation_size();
    // Half the entries left: no shrink.
    assert_eq!(sweep(&mut table, &|x| x % 2 == 0), 50_000);
    assert!(table.old.is_empty());
    assert_eq!(table.main.allocation_size(), peak);
    // 500 left: a table with room for about twice that takes their place.
    assert_eq!(sweep(&mut table, &|x| x % 200 == 0), 500);
    assert_eq!(table.old.len(), 500, "set aside");
    assert!(
        table.main.capacity() < 2_000,
        "room for {}",
        table.main.capacity()
    );
    let (old_buckets, layout) = (table.old.num_buckets(), table.layout());
    let mut next = 100_000u64;
    let deadline = Deadline::new("the set-aside table emptied");
    while !table.old.is_empty() {
        deadline.check();
        let before = table.old.len();
        table.insert(hash(&next), next, hash);
        assert!(before - table.old.len() <= STEP);
        next += 1;
    }
    // Each insertion looks at 256 of the sparse table's buckets, and the
    // new table had room for those insertions: no set-aside on the way.
    assert!(next - 100_000 <= (old_buckets / 256) as u64);
    assert_eq!(
        table.layout(),
        layout + 1,
        "only the memory's release moved buckets"
    );
    assert_eq!(
        table.old.allocation_size(),
        0,
        "the big table's memory went"
    );
    assert!(table.main.allocation_size() * 16 < peak);
    for x in (0..100_000).step_by(200).chain(100_000..next) {
        assert_eq!(table.find(hash(&x), |v| *v == x), Some(&x));
    }
    assert_eq!(table.len(), 500 + (next - 100_000) as usize);
    // Every entry gone: the memory goes at once.
    assert_eq!(sweep(&mut table, &|_| false), 0);
    assert_eq!(
        table.main.allocation_size() + table.old.allocation_size(),
        0
    );
}

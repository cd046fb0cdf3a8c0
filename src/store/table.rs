//! One shard's table: a hashbrown table that grows a few entries at a
//! time, so that no call pays for a whole-table rehash.
//!
//! A hashbrown table that runs out of room rehashes every entry at once
//! (into a bigger table, or in place to clear tombstones), and hashing a
//! `String` key reads its heap copy: about 100 ns an entry once the map is
//! larger than the caches, so a shard of a few thousand entries stalls the
//! inserting call, and every call waiting on the shard's lock, for
//! hundreds of microseconds. Here the full table is set aside instead
//! (`old`), a table with room for twice its entries takes its place
//! (`main`), and every write to the shard moves a few of `old`'s entries
//! over ([`STEP`]) until none is left. Lookups try `main`, then `old` while
//! it holds anything. A write moves `STEP` entries, so `old` is empty
//! after writes numbering a sixteenth of its entries, long before `main`
//! fills up. Until then both tables hold memory (half as much again as the
//! shard's table alone): a short window of each doubling, where a plain
//! table's rehash holds both for the length of one call.
//!
//! The automatic sweep visits a table a slice of buckets at a time
//! ([`retain_range`](Table::retain_range)), `old`'s buckets first, then
//! `main`'s; entries only ever move from `old` to `main`, so a slice
//! sweep that runs in that order misses none of them. Whatever reorders
//! the buckets otherwise (a set-aside, a small table's plain growth, a
//! shrink) changes the table's [`layout`](Table::layout), and a sweep
//! that sees a new layout starts the table over.

use hashbrown::HashTable;

/// Entries moved from `old` to `main` by each write (an insertion or an
/// update) while `old` is not empty: `old` holds at most half of `main`'s
/// room when it is set aside, so it is empty before `main` fills up. Moves
/// cost a rehash each (tens of ns, a key's cold heap copy included), so a
/// write pays at most about a microsecond for them; two at a time kept
/// both tables' memory for half of each doubling (bytes per key 1.32x
/// governor's at 10^6 keys, `benches/bytes_per_key.rs`).
const STEP: usize = 16;

/// Tables this small grow the plain way: their rehash costs less than a
/// few moves do.
const SMALL: usize = 128;

/// A hash table of `T`, whose hashes the caller computes (`hasher`) and
/// passes in.
pub(crate) struct Table<T> {
    /// Where new entries go, and where all of them are once `old` is empty.
    main: HashTable<T>,
    /// The table `main` replaced when it ran out of room, emptied by
    /// writes (and the sweep); its memory goes with its last entry.
    old: HashTable<T>,
    /// The first bucket of `old` not yet emptied: moves resume there, so
    /// each costs O(1) however far the emptying has got.
    old_next: usize,
    /// Changes whenever bucket indices change meaning (see
    /// [`layout`](Self::layout)).
    layout: u64,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            main: HashTable::new(),
            old: HashTable::new(),
            old_next: 0,
            layout: 0,
        }
    }
}

impl<T> Table<T> {
    pub(crate) fn len(&self) -> usize {
        self.main.len() + self.old.len()
    }

    /// The entry `eq` accepts, among those whose hash is `hash`.
    #[inline]
    pub(crate) fn find(&self, hash: u64, eq: impl Fn(&T) -> bool) -> Option<&T> {
        match self.main.find(hash, &eq) {
            Some(found) => Some(found),
            None if !self.old.is_empty() => self.old.find(hash, eq),
            None => None,
        }
    }

    /// [`find`](Self::find), for writing. Always inlined: the map path's
    /// lookup, which must not leave the front end's one call however many
    /// instances of it a program has.
    #[inline(always)]
    pub(crate) fn find_mut(&mut self, hash: u64, eq: impl Fn(&T) -> bool) -> Option<&mut T> {
        // Two lookups in `main` on a miss in it (a borrow checker limit on
        // returning from a conditional borrow); `old` is empty almost
        // always, and then the second costs nothing.
        if self.old.is_empty() || self.main.find(hash, &eq).is_some() {
            return self.main.find_mut(hash, eq);
        }
        self.old.find_mut(hash, eq)
    }

    /// Inserts `value`, whose hash is `hash` and which is not in the table
    /// yet; returns it in place. Moves up to [`STEP`] entries from `old` to
    /// `main` first.
    pub(crate) fn insert(&mut self, hash: u64, value: T, hasher: impl Fn(&T) -> u64) -> &mut T {
        self.step(&hasher);
        if self.main.len() == self.main.capacity() {
            if self.main.len() >= SMALL {
                self.set_aside(&hasher);
            } else {
                // A small table grows the plain way, and its buckets move.
                self.layout += 1;
            }
        }
        self.main.insert_unique(hash, value, hasher).into_mut()
    }

    /// Moves up to [`STEP`] entries from `old` to `main`, if it holds any:
    /// every write to the shard calls it, so that `old`, and the memory it
    /// holds, lasts as few calls as possible. An `old` that the sweep
    /// emptied is freed here, with no scan.
    #[inline]
    pub(crate) fn step(&mut self, hasher: impl Fn(&T) -> u64) {
        if !self.old.is_empty() {
            self.move_some(STEP, &hasher);
        } else if self.old.allocation_size() > 0 {
            self.drop_old();
        }
    }

    /// Identifies what bucket indices mean; see [`retain_range`](Self::retain_range).
    pub(crate) fn layout(&self) -> u64 {
        self.layout
    }

    /// Buckets a sweep runs over: `old`'s, then `main`'s.
    pub(crate) fn buckets(&self) -> usize {
        self.old.num_buckets() + self.main.num_buckets()
    }

    /// Keeps, among the entries in buckets `range` (of
    /// [`buckets`](Self::buckets)), those for which `keep` returns true.
    /// Indices keep their meaning while
    /// [`layout`](Self::layout) does not change.
    pub(crate) fn retain_range(
        &mut self,
        range: std::ops::Range<usize>,
        mut keep: impl FnMut(&mut T) -> bool,
    ) {
        let split = self.old.num_buckets();
        for index in range {
            let (table, index) = match index.checked_sub(split) {
                None => (&mut self.old, index),
                Some(index) => (&mut self.main, index),
            };
            if let Ok(mut entry) = table.get_bucket_entry(index) {
                if !keep(entry.get_mut()) {
                    entry.remove();
                }
            }
        }
    }

    /// `main` is full: sets it aside as `old` and starts a table with room
    /// for twice the entries. The rare `old` that is not empty yet (only
    /// reads reached the shard since the last time) is emptied first.
    #[cold]
    fn set_aside(&mut self, hasher: &impl Fn(&T) -> u64) {
        self.move_some(usize::MAX, hasher);
        let room = 2 * self.main.len();
        self.old = std::mem::replace(&mut self.main, HashTable::with_capacity(room));
        self.old_next = 0;
        self.layout += 1;
    }

    fn move_some(&mut self, n: usize, hasher: &impl Fn(&T) -> u64) {
        let mut moved = 0;
        while moved < n && self.old_next < self.old.num_buckets() {
            // Removing an entry leaves every other one in its bucket.
            if let Ok(entry) = self.old.get_bucket_entry(self.old_next) {
                let (value, _) = entry.remove();
                self.main.insert_unique(hasher(&value), value, hasher);
                moved += 1;
            }
            self.old_next += 1;
        }
        if self.old.is_empty() && self.old.allocation_size() > 0 {
            self.drop_old();
        }
    }

    /// Frees the emptied `old`; `main`'s bucket indices then start at 0.
    fn drop_old(&mut self) {
        self.old = HashTable::new();
        self.old_next = 0;
        self.layout += 1;
    }

    /// Keeps the entries for which `keep` returns true.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        self.main.retain(&mut keep);
        self.old.retain(keep);
    }

    /// Removes the entry `eq` accepts if `remove` returns true for it;
    /// returns whether it did.
    pub(crate) fn remove_if(
        &mut self,
        hash: u64,
        eq: impl Fn(&T) -> bool,
        remove: impl FnOnce(&T) -> bool,
    ) -> bool {
        for table in [&mut self.main, &mut self.old] {
            if let Ok(entry) = table.find_entry(hash, &eq) {
                if !remove(entry.get()) {
                    return false;
                }
                entry.remove();
                return true;
            }
        }
        false
    }

    pub(crate) fn shrink_to_fit(&mut self, hasher: impl Fn(&T) -> u64) {
        self.move_some(usize::MAX, &hasher);
        self.main.shrink_to_fit(hasher);
        self.layout += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    fn hash(x: &u64) -> u64 {
        x.wrapping_mul(0x9e37_79b9_7f4a_7c15)
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
        let mut set_aside = 0;
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
        }
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
        while table.old.allocation_size() == 0 {
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
        while table.old.is_empty() {
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

    /// A set-aside table that the sweep empties is freed by the next write,
    /// not kept until the next set-aside.
    #[test]
    fn a_swept_empty_old_table_is_freed() {
        let mut table = Table::default();
        let mut x = 0u64;
        while table.old.allocation_size() == 0 {
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
}

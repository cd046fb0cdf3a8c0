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
//! over until none is left: [`STEP`] for an insertion, [`UPDATE_STEP`]
//! for an update. Lookups try `main`, then `old` while it holds anything.
//! Insertions alone empty `old` after a sixteenth of its entries, long
//! before `main` fills up; updates only hasten it. Until then both tables
//! hold memory (half as much again as the shard's table alone): a short
//! window of each doubling, where a plain table's rehash holds both for
//! the length of one call.
//!
//! The automatic sweep visits a table a slice of buckets at a time
//! ([`retain_range`](Table::retain_range)), `old`'s buckets first, then
//! `main`'s; entries only ever move from `old` to `main`, so a slice
//! sweep that runs in that order misses none of them. Whatever reorders
//! the buckets otherwise (a set-aside, a small table's plain growth, a
//! shrink) changes the table's [`layout`](Table::layout), and a sweep
//! that sees a new layout starts the table over.
//!
//! A table a sweep has thinned out (a flood of keys gone by) shrinks the
//! same way, a step at a time: when a sweep finishes it with
//! less than an entry in eight buckets, it is set aside for a table
//! with room for twice its entries, which writes fill from it.

// Under loom only the compound store uses tables, and not all of this.
#![cfg_attr(loom, allow(dead_code))]

use super::Cursor;
use hashbrown::HashTable;

/// Entries moved from `old` to `main` by each insertion while `old` is not
/// empty: `old` holds at most half of `main`'s room when it is set aside,
/// so insertions alone empty it before `main` fills up. Moves
/// cost a rehash each (tens of ns, a key's cold heap copy included), so a
/// write pays at most about a microsecond for them, less as the batch's
/// keys are hashed together (see `move_some`); two at a time kept
/// both tables' memory for half of each doubling (bytes per key 1.32x
/// governor's at 10^6 keys, `benches/bytes_per_key.rs`).
const STEP: usize = 16;

/// Entries moved by an update (a write that finds its key) while `old`
/// is not empty: fewer than an insertion's, so that a call on a live key
/// waits for a few cold moves, not [`STEP`] of them (at 16, such moves
/// set the live keys' p99 in `benches/latency.rs`: 2.7-3.1 µs against
/// 1.7-2.2 at 4, `BENCHMARKS.md`, eleventh round). Insertions alone keep
/// `old`'s emptying ahead of `main`'s filling; updates only hasten it.
const UPDATE_STEP: usize = 4;

/// Buckets of `old` a write looks through for each entry it may move: an
/// `old` the sweep has thinned out is emptied a bounded slice per write
/// (a write moving [`STEP`] entries looks at 256 buckets at most), not
/// scanned to its end by the write that finds its entries sparse.
const SCAN_PER_MOVE: usize = 16;

/// Tables this small grow the plain way: their rehash costs less than a
/// few moves do.
const SMALL: usize = 128;

/// A table whose sweep leaves less than one entry in this many of its
/// buckets shrinks (see [`Table::retain_slice`]).
const SPARSE: usize = 8;

/// Tables of fewer buckets than this never shrink: tens of kilobytes at
/// most.
const SHRINK_FROM: usize = 1024;

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
        self.move_step(STEP, &hasher);
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

    /// An update's share of the growth: moves up to [`UPDATE_STEP`]
    /// entries from `old` to `main`, if it holds any. Every update of the
    /// shard calls it, so that `old`, and the memory it holds, lasts as
    /// few calls as possible. An `old` that the sweep emptied is freed
    /// here, with no scan.
    #[inline]
    pub(crate) fn step(&mut self, hasher: impl Fn(&T) -> u64) {
        self.move_step(UPDATE_STEP, &hasher);
    }

    /// Moves up to `n` entries from `old` to `main` (see [`step`](Self::step)).
    #[inline]
    fn move_step(&mut self, n: usize, hasher: &impl Fn(&T) -> u64) {
        if !self.old.is_empty() {
            self.move_some(n, hasher);
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

    /// One slice of a sweep: [`retain_range`](Self::retain_range) over up
    /// to `len` buckets from `at.from` if the layout is still `at.layout`
    /// (else from the first bucket). Returns where the next slice starts,
    /// or, when this slice reached the last bucket, the entries the table
    /// then holds (and shrinks the table if they leave it sparse).
    pub(crate) fn retain_slice(
        &mut self,
        at: Cursor,
        len: usize,
        keep: impl FnMut(&mut T) -> bool,
    ) -> Result<Cursor, usize> {
        let from = if self.layout == at.layout { at.from } else { 0 };
        let to = from.saturating_add(len).min(self.buckets());
        self.retain_range(from..to, keep);
        if to < self.buckets() {
            Ok(Cursor {
                from: to,
                layout: self.layout,
            })
        } else {
            self.shrink_if_sparse();
            Err(self.len())
        }
    }

    /// After a sweep went through the whole table (in slices, or at once):
    /// a `main` that the sweep
    /// has thinned out to less than an entry in [`SPARSE`] buckets (a flood of
    /// keys gone by) is set aside as for growth, for a table with room for
    /// twice its entries, and writes move the entries over a step at a
    /// time: the memory of a table sized for a peak goes back, and the
    /// sweep's passes over the shard shorten again, with no call paying
    /// for a whole table's rehash. The room left (twice the entries: a
    /// table grows again only once they double, and shrinks again only
    /// below a quarter of them) keeps a table from shrinking and growing
    /// by turns.
    fn shrink_if_sparse(&mut self) {
        // Buckets, not `capacity()`: a removal that leaves a tombstone
        // takes its bucket from hashbrown's room until the next rehash.
        let (len, buckets) = (self.main.len(), self.main.num_buckets());
        if !self.old.is_empty() || buckets < SHRINK_FROM || len * SPARSE >= buckets {
            return;
        }
        // Room too, twice over, for the insertions that empty `old` when
        // it is sparse: each looks at `STEP * SCAN_PER_MOVE` of its
        // buckets (see `move_some`), so `main` never fills before `old` is
        // empty (which would move the rest of `old` in one call).
        let emptying = buckets / (STEP * SCAN_PER_MOVE);
        let smaller = match len {
            0 => HashTable::new(),
            _ => HashTable::with_capacity((2 * len).max(2 * emptying)),
        };
        self.old = std::mem::replace(&mut self.main, smaller);
        self.old_next = 0;
        self.layout += 1;
        if self.old.is_empty() {
            // Nothing to move: the memory goes now.
            self.old = HashTable::new();
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

    /// Moves up to `n` entries from `old` to `main`, resuming at
    /// `old_next`, looking at no more than [`SCAN_PER_MOVE`] buckets for
    /// each.
    fn move_some(&mut self, n: usize, hasher: &impl Fn(&T) -> u64) {
        let mut moved = 0;
        let end = (self.old_next)
            .saturating_add(n.saturating_mul(SCAN_PER_MOVE))
            .min(self.old.num_buckets());
        loop {
            // A batch of entries is hashed where it lies, then taken out
            // and inserted: hashing reads each key's cold heap copy, and
            // hashes that do not wait for one another's insertion fetch
            // those at once, where one move after another would wait for
            // each in turn. An entry leaves `old` only once its hash is
            // known, and `old_next` passes it only once it has moved: a
            // key's `Hash` that panics leaves every entry in place, to be
            // moved by a later write.
            let mut batch = [(0, 0); STEP];
            let mut taken = 0;
            let mut next = self.old_next;
            let left = self.old.len();
            while taken < STEP && moved + taken < n && taken < left && next < end {
                if let Some(value) = self.old.get_bucket(next) {
                    batch[taken] = (next, hasher(value));
                    taken += 1;
                }
                next += 1;
            }
            if taken == 0 {
                // The buckets looked at held nothing.
                self.old_next = next;
                break;
            }
            for &(index, hash) in &batch[..taken] {
                // Removing an entry leaves every other one in its bucket.
                if let Ok(entry) = self.old.get_bucket_entry(index) {
                    self.main.insert_unique(hash, entry.remove().0, hasher);
                }
            }
            self.old_next = next;
            moved += taken;
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

    /// Keeps the entries for which `keep` returns true; shrinks the table
    /// if that leaves it sparse (see [`retain_slice`](Self::retain_slice)).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        self.main.retain(&mut keep);
        self.old.retain(keep);
        self.shrink_if_sparse();
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
mod tests;

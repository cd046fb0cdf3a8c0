//! One key's compound bucket behind an `Arc`: as many words as its policy
//! has quotas (at least `store::INLINE_WORDS` if it moved out of its map
//! entry), behind a sequence lock that calls can read without writing
//! anything.
//!
//! The state word is at once a write lock and a version. A write (an
//! admission, a retirement) takes it by a compare-and-swap that sets
//! [`LOCKED`], stores the words, and lets it go with a new version. A read
//! loads the state, the words and the state again, and keeps the words
//! only if the state is the same unlocked value both times: no write ran
//! in between, so the words are the bucket at one instant, and a denial
//! decided on them is the call's outcome at that instant, with nothing
//! written. Every access is atomic, so a read that races a write sees torn
//! words only to throw them away.
//!
//! A retired cell (set under the lock by the sweep, which removes it from
//! the map in the same step, or by a grow that replaces it) is never
//! written again: a read or a lock that finds it retired refuses, and the
//! caller goes back to the map.

use super::decide::Words;
use super::policy::MAX_QUOTAS;
use crate::sync::{fence, Arc, AtomicU64, Ordering};
use crate::time::Nanos;
use std::ops::Deref;

/// Set while a writer holds the cell.
const LOCKED: u64 = 1;
/// Set, for good, when the cell has left the map.
const RETIRED: u64 = 2;
/// What each write adds to the state when it lets go.
const VERSION: u64 = 4;

/// The most cells [`Cell::read_all`] takes.
pub(crate) const SNAPSHOT_CELLS: usize = 8;

/// Consistent reads tried before a reader takes the lock instead (a
/// writer holds it for a few words, so one or two retries do).
const READ_TRIES: usize = 4;

/// A key's words (`W` is `[AtomicU64]`; sized only to make one).
#[derive(Debug)]
pub(crate) struct Cell<W: ?Sized = [AtomicU64]> {
    /// [`LOCKED`] while a writer holds the words, [`RETIRED`] once the
    /// cell has left the map (never cleared), and above them a version
    /// that every write that changed a word bumps by [`VERSION`]. Changed
    /// only by the lock's holder (and the compare-and-swap that takes it).
    state: AtomicU64,
    /// Under loom, the cell's place in the global lock order, in the order
    /// cells are made: the allocator may place two cells in either order
    /// from one execution of a model to the next, and loom needs every
    /// execution to take the same steps until its schedule differs.
    #[cfg(loom)]
    made: u64,
    /// Word `i` is `full_at` of quota `i` (`Nanos` as `u64`), 1 to
    /// [`MAX_QUOTAS`] of them; written only under the lock.
    words: W,
}

/// Why a cell could not be read or locked.
#[derive(Debug)]
pub(crate) struct Retired;

impl Cell {
    /// A cell of `len` full words (1 to [`MAX_QUOTAS`]).
    pub(crate) fn new(len: usize) -> Arc<Cell> {
        match len {
            0 | 1 => sized::<1>(),
            2 => sized::<2>(),
            3 => sized::<3>(),
            4 => sized::<4>(),
            5 => sized::<5>(),
            6 => sized::<6>(),
            7 => sized::<7>(),
            _ => sized::<MAX_QUOTAS>(),
        }
    }

    /// A cell of `len` words (1 to [`MAX_QUOTAS`]) holding the first `len`
    /// of `words`: a bucket that moves into a new cell, out of its map
    /// entry or into a longer one.
    pub(crate) fn with_words(len: usize, words: Words) -> Arc<Cell> {
        let cell = Cell::new(len);
        // Not shared yet: never retired.
        if let Ok(mut locked) = cell.lock() {
            locked.words = words;
            locked.commit();
        }
        cell
    }

    /// How many words the cell holds.
    pub(crate) fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether the cell has left the map (a hint: a call checks again
    /// when it reads or locks the cell).
    pub(crate) fn is_retired(&self) -> bool {
        // Relaxed: a hint for choosing a cache way; it orders nothing.
        self.state.load(Ordering::Relaxed) & RETIRED != 0
    }

    /// The words at one instant, by a read if one succeeds, else under
    /// the lock; a retired cell's are all full (its key has no bucket).
    pub(crate) fn words_now(&self) -> Words {
        match self.read() {
            Ok(Some((_, words))) => words,
            Ok(None) => self
                .lock()
                .map_or([Nanos::ZERO; MAX_QUOTAS], |locked| locked.words),
            Err(Retired) => [Nanos::ZERO; MAX_QUOTAS],
        }
    }

    /// The cell's address: the global order in which a call takes the
    /// locks of several cells (see `charge::charge`).
    pub(crate) fn address(&self) -> usize {
        #[cfg(loom)]
        return self.made as usize;
        #[cfg(not(loom))]
        return std::ptr::from_ref(self).cast::<u8>() as usize;
    }

    /// The words at one instant, without writing anything (words past the
    /// cell's are 0, full), with the state they were read under (see
    /// [`unchanged_since`](Self::unchanged_since)), or `Ok(None)` if
    /// writers kept it busy.
    #[inline]
    pub(crate) fn read(&self) -> Result<Option<(u64, Words)>, Retired> {
        for _ in 0..READ_TRIES {
            // Acquire pairs with the Release store that let the last
            // write go: its words are visible to the loads below.
            let before = self.state.load(Ordering::Acquire);
            if before & RETIRED != 0 {
                return Err(Retired);
            }
            let words = self.load_words();
            // The fence orders the word loads before the state's second
            // load; paired with the Release fence in `lock`, a read that
            // saw any word a write stored sees that write's LOCKED state
            // (or a later one) here.
            fence(Ordering::Acquire);
            #[cfg(loom)]
            let skip = crate::flaw::flawed(crate::flaw::Flaw::CompoundReadWithoutRecheck);
            #[cfg(not(loom))]
            let skip = false;
            // Relaxed: ordered by the fence above.
            if skip || (before & LOCKED == 0 && self.state.load(Ordering::Relaxed) == before) {
                return Ok(Some((before, words)));
            }
            crate::sync::spin();
        }
        Ok(None)
    }

    /// Whether no write has landed on the cell since a [`read`](Self::read)
    /// under `state`, nor holds it now: its words are still the ones that
    /// read returned, at this instant. Writes nothing.
    #[inline]
    pub(crate) fn unchanged_since(&self, state: u64) -> bool {
        // Acquire, as the first load of `read`: this load is the instant
        // at which the caller decides on the words it read before. Every
        // write that changes a word, and every retirement, leaves a new
        // state for good, and a held lock shows in it.
        self.state.load(Ordering::Acquire) == state
    }

    /// The words of several cells at one common instant, without writing
    /// anything: `Ok(true)` with cell `i`'s words in `words[i]` (`cells[i]`
    /// is always `Some`; the words of `words[i]` past the cell's are left
    /// as they were), `Ok(false)` if writers kept some cell busy. At most
    /// [`SNAPSHOT_CELLS`] cells.
    ///
    /// Every state is loaded, then every cell's words, then every state
    /// again: all the first loads come before all the second ones, so each
    /// cell's words were current from its first load to its second, an
    /// interval that holds the last first load and the first second load.
    /// Reading the cells one after another (each `read` on its own) would
    /// not do: a call that writes two of them (both locked at once) could
    /// land between the two reads, and the snapshot would hold one cell
    /// from before it and one from after.
    pub(crate) fn read_all<C: Deref<Target = Cell>>(
        cells: &[Option<C>],
        words: &mut [Words],
    ) -> Result<bool, Retired> {
        let cell = |i: usize| cells[i].as_deref().expect("every scope has its cell");
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::CompoundSnapshotCellByCell) {
            for (i, words) in words.iter_mut().enumerate() {
                match cell(i).read()? {
                    Some((_, read)) => *words = read,
                    None => return Ok(false),
                }
            }
            return Ok(true);
        }
        let mut states = [0; SNAPSHOT_CELLS];
        let states = &mut states[..cells.len()];
        'tries: for _ in 0..READ_TRIES {
            for (i, state) in states.iter_mut().enumerate() {
                // Acquire pairs with the Release store that let the cell's
                // last write go: its words are visible to the loads below.
                // And a write of several cells locks them all before it
                // lets any go: if this load sees it let this cell go, its
                // lock of every other cell happened before, and the second
                // loads below (all after this one) see that lock or later.
                *state = cell(i).state.load(Ordering::Acquire);
                if *state & RETIRED != 0 {
                    return Err(Retired);
                }
                if *state & LOCKED != 0 {
                    crate::sync::spin();
                    continue 'tries;
                }
            }
            for (i, words) in words.iter_mut().enumerate() {
                cell(i).load_into(words);
            }
            // As in `read`: orders every word load before the second state
            // loads; paired with the Release fence in `lock`, a snapshot
            // that saw any word a write stored sees that write's LOCKED
            // state (or a later one) below.
            fence(Ordering::Acquire);
            // Relaxed: ordered by the fence above.
            let unchanged =
                |(i, state): (usize, &u64)| cell(i).state.load(Ordering::Relaxed) == *state;
            if states.iter().enumerate().all(unchanged) {
                return Ok(true);
            }
            crate::sync::spin();
        }
        Ok(false)
    }

    /// Takes the cell's lock (spinning while another writer holds it),
    /// unless it is retired.
    #[inline]
    pub(crate) fn lock(&self) -> Result<Locked<'_>, Retired> {
        // Relaxed: a first look; the compare-and-swap below decides.
        let mut state = self.state.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            #[cfg(loom)]
            let ignore = crate::flaw::flawed(crate::flaw::Flaw::CompoundSpendIgnoringRetired);
            #[cfg(not(loom))]
            let ignore = false;
            if state & RETIRED != 0 && !ignore {
                return Err(Retired);
            }
            if state & LOCKED == 0 {
                // Acquire pairs with the Release store that let the last
                // writer go: its words are visible here. Relaxed on
                // failure: the loop looks again.
                match self.state.compare_exchange_weak(
                    state,
                    state | LOCKED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => {
                        state = now;
                        continue;
                    }
                }
            }
            spin(&mut spins);
            // Relaxed: as above.
            state = self.state.load(Ordering::Relaxed);
        }
        // Release fence: the LOCKED state is ordered before the word
        // stores that follow, for any read that sees one of them (`read`).
        fence(Ordering::Release);
        let words = self.load_words();
        Ok(Locked {
            cell: self,
            state,
            words,
            changed: false,
            retired: false,
        })
    }

    /// The words, each loaded Relaxed (the state orders them); 0 (full)
    /// past the cell's.
    #[inline]
    fn load_words(&self) -> Words {
        let mut words = [Nanos::ZERO; MAX_QUOTAS];
        self.load_into(&mut words);
        words
    }

    /// [`load_words`](Self::load_words) into `words`, whose words past
    /// the cell's are left as they are.
    #[inline]
    fn load_into(&self, words: &mut Words) {
        for (word, atomic) in words.iter_mut().zip(&self.words) {
            // Relaxed: the state's loads around this decide (see `read`
            // and `lock`).
            *word = Nanos::new(atomic.load(Ordering::Relaxed));
        }
    }
}

/// A cell of `N` full words.
fn sized<const N: usize>() -> Arc<Cell> {
    let cell: std::sync::Arc<Cell> = std::sync::Arc::new(Cell {
        state: AtomicU64::new(0),
        #[cfg(loom)]
        made: {
            // Relaxed: only uniqueness and the order of one model thread's
            // cells matter, and fetch_add gives both.
            static MADE: crate::sync::unmodeled::AtomicU64 =
                crate::sync::unmodeled::AtomicU64::new(0);
            MADE.fetch_add(1, crate::sync::unmodeled::Relaxed)
        },
        words: std::array::from_fn::<_, N, _>(|_| AtomicU64::new(0)),
    });
    #[cfg(loom)]
    return Arc::from_std(cell);
    #[cfg(not(loom))]
    cell
}

/// Waits for a writer to let a cell go: spins a little, then yields (the
/// holder may be descheduled on a busy machine).
fn spin(spins: &mut u32) {
    *spins += 1;
    if cfg!(not(loom)) && *spins > 64 {
        std::thread::yield_now();
    } else {
        crate::sync::spin();
    }
}

/// A locked cell: its words, copied, to decide on and change; stored back
/// and let go on drop.
pub(crate) struct Locked<'a> {
    cell: &'a Cell,
    /// The state before the lock was taken (unlocked, not retired).
    state: u64,
    /// The words, to decide on and change before a [`commit`](Self::commit).
    pub(crate) words: Words,
    /// Whether the words are stored back when the lock is let go.
    changed: bool,
    /// Whether the cell is retired when the lock is let go.
    retired: bool,
}

impl Locked<'_> {
    /// Stores the words back when the lock is let go.
    #[inline]
    pub(crate) fn commit(&mut self) {
        self.changed = true;
    }

    /// Marks the cell retired when the lock is let go: nothing spends on
    /// it again. For the sweep and a grow, which remove it from the map
    /// in the same step, under its shard's lock.
    pub(crate) fn retire(&mut self) {
        self.retired = true;
    }
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.changed {
            for (atomic, word) in self.cell.words.iter().zip(self.words) {
                // Relaxed: published by the Release store below, and
                // ordered after LOCKED by the fence in `lock`.
                atomic.store(word.as_u64(), Ordering::Relaxed);
            }
        }
        let next = if self.retired {
            (self.state + VERSION) | RETIRED
        } else if self.changed {
            self.state + VERSION
        } else {
            // Nothing changed: a read that saw this state before the lock
            // may keep its words.
            self.state
        };
        // Release: publishes the words with the state that lets go.
        self.cell.state.store(next, Ordering::Release);
    }
}

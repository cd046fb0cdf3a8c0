//! Per-thread slots: each live thread owns one index, so that a limiter's
//! per-thread state (counters, offender sketches) has exactly one writer.
//!
//! A thread takes the lowest free index the first time it records anything
//! and gives it back when it exits; the next thread to start reuses it. A
//! limiter keeps one exclusive stripe per index below its stripe count;
//! threads with a higher index (or recording during thread teardown) share
//! one overflow stripe, written with atomic read-modify-writes and a lock.

use crate::sync::unmodeled::Mutex;
use std::cell::Cell;

/// Indices given back by exited threads, and the next never-used index.
static FREE: Mutex<(Vec<usize>, usize)> = Mutex::new((Vec::new(), 0));

/// A thread's index; returned to `FREE` when the thread exits.
struct Slot(usize);

impl Slot {
    fn take() -> Slot {
        // A poisoned lock only means a thread panicked while holding it;
        // the list itself is always consistent.
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        match free.0.pop() {
            Some(index) => Slot(index),
            None => {
                free.1 += 1;
                Slot(free.1 - 1)
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // From here on this thread records into the shared overflow
        // stripe: the index is about to go to another thread. (`INDEX` has
        // no destructor, so it is still there during teardown.)
        let _ = INDEX.try_with(|cached| cached.set(usize::MAX));
        // The lock orders this thread's last writes to its stripes before
        // the next owner's first ones (it takes the same lock in `take`).
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        free.0.push(self.0);
    }
}

thread_local! {
    static SLOT: Slot = Slot::take();
    /// A copy of `SLOT`'s index, read on every call: a plain `const`
    /// thread-local, with no initialisation or destructor state to check.
    /// `UNSET` until the thread's first call.
    static INDEX: Cell<usize> = const { Cell::new(UNSET) };
}

const UNSET: usize = usize::MAX - 1;

/// The calling thread's slot index; `usize::MAX` (the overflow stripe)
/// while the thread is being torn down.
#[inline]
pub(crate) fn index() -> usize {
    let index = INDEX.with(Cell::get);
    if index != UNSET {
        return index;
    }
    first_index()
}

/// Takes the thread's slot on its first call (or reads the overflow index
/// during teardown, without caching it).
#[cold]
fn first_index() -> usize {
    match SLOT.try_with(|slot| slot.0) {
        Ok(index) => {
            INDEX.with(|cached| cached.set(index));
            index
        }
        Err(_) => usize::MAX,
    }
}

/// How many exclusive stripes a limiter keeps: twice the cores, at least
/// 4 and at most 64, so that a thread pool of one thread per core (tokio's
/// default) never shares a stripe.
pub(crate) fn stripes() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (2 * cores).clamp(4, 64)
}

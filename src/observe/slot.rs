//! Per-thread slots: each live thread owns one index, so that a limiter's
//! per-thread state (counters, offender sketches) has exactly one writer.
//!
//! A thread takes the lowest free index the first time it records anything
//! and gives it back when it exits; the next thread to start reuses it. A
//! limiter keeps one exclusive stripe per index below its stripe count;
//! threads with a higher index (or recording during thread teardown) share
//! one overflow stripe, written with atomic read-modify-writes and a lock.

//!
//! Under `cfg(loom)` the slots are per model thread and their lock is
//! loom's (model 9), and a limiter keeps one exclusive stripe.

use std::cell::Cell;

/// Indices given back by exited threads, and the next never-used index.
type FreeList = (Vec<usize>, usize);

#[cfg(not(loom))]
static FREE: crate::sync::unmodeled::Mutex<FreeList> =
    crate::sync::unmodeled::Mutex::new((Vec::new(), 0));

#[cfg(loom)]
loom::lazy_static! {
    // A `std` Arc: loom's would be dropped outside the model when a
    // model fails, which loom cannot do.
    static ref FREE: std::sync::Arc<crate::sync::Mutex<FreeList>> =
        std::sync::Arc::new(crate::sync::Mutex::new((Vec::new(), 0)));
}

/// A thread's index; returned to `FREE` when the thread exits.
struct Slot {
    index: usize,
    /// Under loom, `FREE` itself: loom drops its statics before the
    /// model's main thread exits (and drops its slot). `None` once
    /// dropped.
    #[cfg(loom)]
    free: Option<std::sync::Arc<crate::sync::Mutex<FreeList>>>,
}

impl Slot {
    fn take() -> Slot {
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::SlotTakenInTwoLocks) {
            // BROKEN (a model's twin): reads the next index under the lock
            // and claims it under another, so two threads can take the
            // same one.
            let next = FREE.lock().unwrap().1;
            FREE.lock().unwrap().1 = next + 1;
            return Slot::new(next);
        }
        // A poisoned lock only means a thread panicked while holding it;
        // the list itself is always consistent.
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        let index = free.0.pop().unwrap_or_else(|| {
            free.1 += 1;
            free.1 - 1
        });
        Slot::new(index)
    }

    #[cfg(not(loom))]
    fn new(index: usize) -> Slot {
        Slot { index }
    }

    #[cfg(loom)]
    fn new(index: usize) -> Slot {
        Slot {
            index,
            free: Some(std::sync::Arc::clone(&FREE)),
        }
    }

    #[cfg(not(loom))]
    fn free(&self) -> &'static crate::sync::unmodeled::Mutex<FreeList> {
        &FREE
    }

    #[cfg(loom)]
    fn free(&self) -> &crate::sync::Mutex<FreeList> {
        self.free.as_ref().expect("a slot is dropped once")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Under loom, a model that failed drops its threads' slots outside
        // the model, where no loom object can be touched (and nothing is
        // checked any more): leak the list.
        #[cfg(loom)]
        if std::thread::panicking() {
            std::mem::forget(self.free.take());
            return;
        }
        // From here on this thread records into the shared overflow
        // stripe: the index is about to go to another thread. (`INDEX` has
        // no destructor, so it is still there during teardown.)
        let _ = INDEX.try_with(|cached| cached.set(usize::MAX));
        // The lock orders this thread's last writes to its stripes before
        // the next owner's first ones (it takes the same lock in `take`).
        let mut free = self.free().lock().unwrap_or_else(|e| e.into_inner());
        free.0.push(self.index);
    }
}

crate::sync::thread_local! {
    static SLOT: Slot = Slot::take();
}

#[cfg(not(loom))]
std::thread_local! {
    /// A copy of `SLOT`'s index, read on every call: a plain `const`
    /// thread-local, with no initialisation or destructor state to check.
    /// `UNSET` until the thread's first call.
    static INDEX: Cell<usize> = const { Cell::new(UNSET) };
}

#[cfg(loom)]
loom::thread_local! {
    static INDEX: Cell<usize> = Cell::new(UNSET);
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
    match SLOT.try_with(|slot| slot.index) {
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
#[cfg(not(loom))]
pub(crate) fn stripes() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (2 * cores).clamp(4, 64)
}

/// Under loom, one exclusive stripe: the first thread to record owns it,
/// and the others share the overflow stripe, as threads past the stripe
/// count do.
#[cfg(loom)]
pub(crate) fn stripes() -> usize {
    1
}

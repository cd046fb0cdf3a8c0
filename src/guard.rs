//! Guards that give back what a call took if the call unwinds half way:
//! a key's `Clone`, `Hash` or `Drop` is the caller's code, and a panic in
//! it must not leave a place under a cap taken, or a sweep stopped, for
//! good.

use std::cell::Cell;

/// Runs its closure when dropped, unless [`defuse`](Self::defuse)d first:
/// the undo of a step (a place reserved for an entry) that the rest of
/// the call completes, or leaves undone if it unwinds.
pub(crate) struct Unwinding<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Unwinding<F> {
    pub(crate) fn new(undo: F) -> Self {
        Unwinding(Some(undo))
    }

    /// The step is complete: nothing to undo.
    pub(crate) fn defuse(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for Unwinding<F> {
    fn drop(&mut self) {
        if let Some(undo) = self.0.take() {
            undo();
        }
    }
}

/// A count kept through a loop whose steps may unwind (a sweep's
/// removals), handed to `settle` when the tally is dropped, however the
/// loop ended.
pub(crate) struct Tally<F: FnMut(usize)> {
    count: Cell<usize>,
    settle: F,
}

impl<F: FnMut(usize)> Tally<F> {
    pub(crate) fn new(settle: F) -> Self {
        Tally {
            count: Cell::new(0),
            settle,
        }
    }

    /// Counts one more if `counted`.
    #[inline]
    pub(crate) fn add(&self, counted: bool) {
        if counted {
            self.count.set(self.count.get() + 1);
        }
    }

    /// The count, settled now.
    pub(crate) fn settle(self) -> usize {
        self.count.get()
    }

    /// The count, not settled: the caller settles it another way.
    pub(crate) fn forget(self) -> usize {
        let count = self.count.get();
        std::mem::forget(self);
        count
    }
}

impl<F: FnMut(usize)> Drop for Tally<F> {
    fn drop(&mut self) {
        (self.settle)(self.count.get());
    }
}

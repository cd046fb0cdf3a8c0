//! The one place that chooses between `std` and `loom` primitives.
//!
//! Every other module imports its atomics and locks from here, so that
//! building with `RUSTFLAGS="--cfg loom"` model-checks the real code paths.
//! The switch is `cfg(loom)`, never `cfg(all(test, loom))`: integration
//! tests build the library without `cfg(test)`, and the latter would
//! silently check `std` atomics.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex};

/// `std` atomics for state that loom does not model (the manual clock, the
/// offender sketches and the sweep's ghosts of evicted keys, which decide
/// nothing): named here so that this file stays the only one that picks
/// atomics.
pub(crate) mod unmodeled {
    pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
    /// The thread slots' lock (loom's under `cfg(loom)`: see `observe::slot`).
    #[cfg(not(loom))]
    pub(crate) use std::sync::Mutex;
}

/// The decision counters' stripes, written by one thread each: loom's
/// atomics under `cfg(loom)`, so that model 9 checks that protocol (and
/// the thread slots behind it).
pub(crate) mod striped {
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering::Relaxed};
}

/// Per-thread values: under `cfg(loom)`, per model thread (loom runs its
/// threads on one OS thread, so `std`'s would be shared between them).
#[cfg(loom)]
pub(crate) use loom::thread_local;
#[cfg(not(loom))]
pub(crate) use std::thread_local;

/// A wait for another thread's progress (a retried optimistic read): a
/// spin hint, or under loom a yield, which lets the model schedule the
/// thread waited for.
#[cfg(not(loom))]
#[inline]
pub(crate) fn spin() {
    std::hint::spin_loop();
}

#[cfg(loom)]
pub(crate) fn spin() {
    loom::thread::yield_now();
}

/// A small lock held for a hash lookup at a time (a compound store's
/// shard): `parking_lot`'s mutex, or under `cfg(loom)` loom's, behind the
/// same `lock()` that returns the guard.
#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex as Lock;

/// See the `cfg(not(loom))` item of the same name.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Lock<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Lock<T> {
    pub(crate) fn new(value: T) -> Self {
        Lock(loom::sync::Mutex::new(value))
    }

    /// Takes the lock. A poisoned lock (a panic while it was held, which
    /// only a failing model causes) is taken anyway, as `parking_lot` does.
    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

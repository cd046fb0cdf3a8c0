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
/// statistics and the sweep's ghosts of evicted keys, which decide
/// nothing): named here so that this file stays the only one that picks
/// atomics.
pub(crate) mod unmodeled {
    pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
    pub(crate) use std::sync::Mutex;
}

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

//! The one place that chooses between `std` and `loom` primitives.
//!
//! Every other module imports its atomics and locks from here, so that
//! building with `RUSTFLAGS="--cfg loom"` model-checks the real code paths.
//! The switch is `cfg(loom)`, never `cfg(all(test, loom))`: integration
//! tests build the library without `cfg(test)`, and the latter would
//! silently check `std` atomics.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

/// `std` atomics for state that loom does not model (the manual clock, and
/// the statistics, which decide nothing): named here so that this file
/// stays the only one that picks atomics.
pub(crate) mod unmodeled {
    pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
    pub(crate) use std::sync::Mutex;
}

//! Striped decision counters: each thread adds to its own cache-padded
//! stripe, and a read sums the stripes.

use super::slot;
use crate::error::Denial;
use crate::sync::striped::{AtomicU64, Relaxed};
use crate::time::Nanos;
use crossbeam_utils::CachePadded;
use std::time::Duration;

/// A limiter's counters, read with one call.
///
/// Returned by [`TokenBucketLimiter::stats`](crate::TokenBucketLimiter::stats)
/// (and the Redis limiters' `stats`). Every count starts at zero when the
/// limiter is made and only grows; a read sums per-thread counters without
/// stopping the writers, so counts that change together (such as `admitted`
/// and `admitted_cost`) may be one call apart in a read taken while calls
/// are in flight.
///
/// # Examples
///
/// ```
/// use keyrate::TokenBucketLimiter;
///
/// let limiter = TokenBucketLimiter::new(1.0, 3);
/// assert!(limiter.allow_n("k", 0.0, 2));
/// assert!(!limiter.allow_n("k", 0.0, 2));
/// assert!(!limiter.allow("k", f64::NAN));
/// let stats = limiter.stats();
/// assert_eq!((stats.admitted, stats.admitted_cost), (1, 2));
/// assert_eq!(stats.denied_insufficient_tokens, 1);
/// assert_eq!(stats.denied_invalid_timestamp, 1);
/// assert_eq!(stats.denied(), 2);
/// assert_eq!(stats.buckets_created, 1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls admitted (cost 0 included).
    pub admitted: u64,
    /// Tokens spent by the admitted calls.
    pub admitted_cost: u64,
    /// Calls denied with [`Denial::InsufficientTokens`].
    pub denied_insufficient_tokens: u64,
    /// Calls denied with [`Denial::ExceedsCapacity`].
    pub denied_exceeds_capacity: u64,
    /// Calls denied with [`Denial::InvalidTimestamp`].
    pub denied_invalid_timestamp: u64,
    /// Calls denied with [`Denial::LimiterFull`].
    pub denied_limiter_full: u64,
    /// In-memory limiters only: buckets created (keyed calls and handles).
    pub buckets_created: u64,
    /// In-memory limiters only: buckets evicted by sweeps.
    pub buckets_evicted: u64,
    /// In-memory limiters only: sweeps run, automatic and explicit.
    pub sweeps: u64,
    /// In-memory limiters only: wall time spent in those sweeps.
    pub sweep_time: Duration,
    /// Redis limiters only: calls whose Redis round trip failed, decided by
    /// the [`FailurePolicy`](crate::FailurePolicy) (and not counted above).
    pub backend_errors: u64,
    /// Redis limiters only: denials decided locally by the deny mirror's
    /// bound, with no round trip (also counted in
    /// `denied_insufficient_tokens`).
    pub mirror_denials: u64,
    /// In-memory limiters only: keys a thread's hot-key cache took in (see
    /// [`with_hot_key_cache`](crate::TokenBucketLimiter::with_hot_key_cache)).
    /// About one per hot key and thread; a count that keeps climbing under
    /// steady traffic means the caches are thrashing.
    pub hot_key_promotions: u64,
}

impl Stats {
    /// All denials, whatever the reason.
    #[must_use]
    pub fn denied(&self) -> u64 {
        self.denied_insufficient_tokens
            + self.denied_exceeds_capacity
            + self.denied_invalid_timestamp
            + self.denied_limiter_full
    }
}

/// One counter of a stripe.
///
/// The denial cells follow [`Denial`]'s variants in their order, so that
/// a denial's cell is its variant's index plus a constant: `denial_cell`
/// then compiles to an addition, not a jump table (paired-harness
/// callgrind: 8 instructions off a counted denial).
#[derive(Clone, Copy)]
pub(crate) enum Cell {
    Admitted,
    AdmittedCost,
    InsufficientTokens,
    ExceedsCapacity,
    InvalidTimestamp,
    LimiterFull,
    BackendErrors,
    Created,
    Evicted,
    Sweeps,
    SweepNanos,
    MirrorDenials,
    Promotions,
}

const CELLS: usize = Cell::Promotions as usize + 1;

/// The cell that counts `denial`.
fn denial_cell(denial: &Denial) -> Cell {
    match denial {
        Denial::InsufficientTokens { .. } => Cell::InsufficientTokens,
        Denial::ExceedsCapacity { .. } => Cell::ExceedsCapacity,
        Denial::InvalidTimestamp => Cell::InvalidTimestamp,
        Denial::LimiterFull { .. } => Cell::LimiterFull,
        Denial::Unavailable => Cell::BackendErrors,
    }
}

/// `N` counters per thread: one cache-padded stripe per thread slot,
/// summed on read; empty when counting is off.
pub(crate) struct Striped<const N: usize> {
    /// One stripe per thread slot below `len() - 1`, written by that
    /// thread only; the last stripe is shared by every other thread.
    stripes: Box<[CachePadded<[AtomicU64; N]>]>,
}

impl<const N: usize> Striped<N> {
    pub(crate) fn new(on: bool) -> Self {
        let n = if on { slot::stripes() + 1 } else { 0 };
        Striped {
            stripes: (0..n)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        !self.stripes.is_empty()
    }

    /// Adds `n` to counter `cell` in the calling thread's stripe.
    #[inline]
    pub(crate) fn add(&self, cell: usize, n: u64) {
        self.add_at(slot::index(), cell, n);
    }

    /// Adds each `(cell, n)` of `adds` in the calling thread's stripe,
    /// looking the thread's slot up once.
    #[inline]
    pub(crate) fn add_all<const M: usize>(&self, adds: [(usize, u64); M]) {
        let index = slot::index();
        for (cell, n) in adds {
            self.add_at(index, cell, n);
        }
    }

    /// Adds `n` to counter `cell` in the stripe of the calling thread,
    /// whose slot is `index` (see `slot::index`).
    #[inline]
    pub(crate) fn add_at(&self, index: usize, cell: usize, n: u64) {
        let Some(last) = self.stripes.len().checked_sub(1) else {
            return;
        };
        if index < last {
            // This thread is the stripe's only writer (see `slot`), so a
            // load and a store lose nothing, and cost no locked
            // instruction. Relaxed: a read only sums the counts, and orders
            // nothing else by them.
            let counter = &self.stripes[index][cell];
            counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
        } else {
            // The shared overflow stripe: an atomic add, Relaxed as above.
            self.stripes[last][cell].fetch_add(n, Relaxed);
        }
    }

    /// Each counter summed over all stripes.
    pub(crate) fn sums(&self) -> [u64; N] {
        let mut sum = [0u64; N];
        for stripe in self.stripes.iter() {
            for (total, counter) in sum.iter_mut().zip(stripe.iter()) {
                // Relaxed: see `add`.
                *total = total.wrapping_add(counter.load(Relaxed));
            }
        }
        sum
    }
}

/// A limiter's decision counters.
pub(crate) struct Counters(Striped<CELLS>);

impl Counters {
    pub(crate) fn new(on: bool) -> Self {
        Counters(Striped::new(on))
    }

    pub(crate) fn is_on(&self) -> bool {
        self.0.is_on()
    }

    /// Adds `n` to `cell` in the calling thread's stripe.
    #[inline]
    pub(crate) fn add(&self, cell: Cell, n: u64) {
        self.0.add(cell as usize, n);
    }

    /// Counts one decided call of `cost` (the Redis limiters' front ends).
    #[cfg(feature = "redis")]
    #[inline]
    pub(crate) fn decided(&self, cost: u64, result: Result<(), &Denial>) {
        let _ = self.decided_at(slot::index(), cost, result);
    }

    /// Counts one decided call of `cost` by the thread in slot `index`;
    /// true if it was denied for want of tokens (the one denial that
    /// counts as an offence, see `Observer::decided`).
    #[inline]
    pub(crate) fn decided_at(&self, index: usize, cost: u64, result: Result<(), &Denial>) -> bool {
        match result {
            Ok(()) => {
                self.0.add_at(index, Cell::Admitted as usize, 1);
                self.0.add_at(index, Cell::AdmittedCost as usize, cost);
                false
            }
            Err(denial) => {
                self.0.add_at(index, denial_cell(denial) as usize, 1);
                // Read off the denial, not the cell: the cell's `match`
                // then has one result, and folds to arithmetic.
                matches!(denial, Denial::InsufficientTokens { .. })
            }
        }
    }

    /// Counts a sweep that removed `removed` buckets in `took`.
    pub(crate) fn swept(&self, removed: usize, took: Duration) {
        self.add(Cell::Sweeps, 1);
        self.add(Cell::Evicted, removed as u64);
        let nanos = Nanos::saturating_from_duration(took);
        self.add(Cell::SweepNanos, nanos.as_u64());
    }

    /// The sums over all stripes.
    pub(crate) fn read(&self) -> Stats {
        let sum = self.0.sums();
        Stats {
            admitted: sum[Cell::Admitted as usize],
            admitted_cost: sum[Cell::AdmittedCost as usize],
            denied_insufficient_tokens: sum[Cell::InsufficientTokens as usize],
            denied_exceeds_capacity: sum[Cell::ExceedsCapacity as usize],
            denied_invalid_timestamp: sum[Cell::InvalidTimestamp as usize],
            denied_limiter_full: sum[Cell::LimiterFull as usize],
            buckets_created: sum[Cell::Created as usize],
            buckets_evicted: sum[Cell::Evicted as usize],
            sweeps: sum[Cell::Sweeps as usize],
            sweep_time: Duration::from_nanos(sum[Cell::SweepNanos as usize]),
            backend_errors: sum[Cell::BackendErrors as usize],
            mirror_denials: sum[Cell::MirrorDenials as usize],
            hot_key_promotions: sum[Cell::Promotions as usize],
        }
    }
}

//! What a concurrency limiter reports: permits in flight, keys, waiters,
//! and the calls answered, by outcome.

use super::ConcurrencyLimiter;
use crate::observe::Striped;
use crate::sync::unmodeled::{AtomicUsize, Relaxed};
use std::hash::{BuildHasher, Hash};

/// The outcomes counted, per thread.
const ACQUIRED: usize = 0;
const AT_LIMIT: usize = 1;
const LIMITER_FULL: usize = 2;
const TIMED_OUT: usize = 3;
const RATE_LIMITED: usize = 4;
/// Entries created and removed (by either sweep).
const CREATED: usize = 5;
const REMOVED: usize = 6;
const OUTCOMES: usize = 7;

/// A [`ConcurrencyLimiter`]'s state and counters, read with
/// [`stats`](ConcurrencyLimiter::stats).
///
/// The counts start at zero when the limiter is made and only grow; the
/// gauges (`in_flight`, `keys`, `waiting`) are the state at the read.
///
/// # Examples
///
/// ```
/// use keyrate::ConcurrencyLimiter;
///
/// let limiter = ConcurrencyLimiter::new(1);
/// let _a = limiter.try_acquire("a").unwrap();
/// assert!(limiter.try_acquire("a").is_err());
/// let stats = limiter.stats();
/// assert_eq!((stats.in_flight, stats.keys, stats.waiting), (1, 1, 0));
/// assert_eq!((stats.acquired, stats.refused_at_limit), (1, 1));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyStats {
    /// Permits held now, over every key.
    pub in_flight: u64,
    /// Keys tracked now (holding permits, waited for, or idle and not
    /// swept yet).
    pub keys: u64,
    /// Callers waiting now (`acquire`, `acquire_blocking`).
    pub waiting: u64,
    /// Permits given (at once or after a wait; with the combined call,
    /// also those given back because the token was refused).
    pub acquired: u64,
    /// Calls refused with `AtLimit`.
    pub refused_at_limit: u64,
    /// Calls refused with `LimiterFull`.
    pub refused_limiter_full: u64,
    /// Waits that ended without a permit (`TimedOut`).
    pub timed_out: u64,
    /// Combined calls whose token was refused (`RateLimited`).
    pub rate_limited: u64,
    /// Keys' entries created: a key's first permit (or wait), and again
    /// each time after the sweep removed it.
    pub keys_created: u64,
    /// Idle keys' entries removed, by the automatic sweep or by
    /// [`sweep`](ConcurrencyLimiter::sweep).
    pub keys_removed: u64,
}

impl ConcurrencyStats {
    /// All refusals, whatever the reason.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.refused_at_limit + self.refused_limiter_full + self.timed_out + self.rate_limited
    }
}

/// The counters behind [`ConcurrencyStats`].
pub(super) struct Counters {
    outcomes: Striped<OUTCOMES>,
    /// Callers waiting: the waits alone write it.
    waiting: AtomicUsize,
}

/// Counts one waiting caller while alive.
#[cfg_attr(loom, allow(dead_code))]
pub(super) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Relaxed: a gauge for reports; it orders nothing.
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Counters {
    pub(super) fn new() -> Self {
        Counters {
            outcomes: Striped::new(true),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Counts a call's outcome.
    #[inline]
    pub(super) fn count<T>(&self, outcome: &Result<T, super::ConcurrencyDenial>) {
        use super::ConcurrencyDenial as D;
        let cell = match outcome {
            Ok(_) => ACQUIRED,
            Err(D::AtLimit { .. }) => AT_LIMIT,
            Err(D::LimiterFull { .. }) => LIMITER_FULL,
            Err(D::TimedOut { .. }) => TIMED_OUT,
            Err(D::RateLimited(_)) => RATE_LIMITED,
        };
        self.outcomes.add(cell, 1);
    }

    /// Counts an entry created.
    pub(super) fn created(&self) {
        self.outcomes.add(CREATED, 1);
    }

    /// Takes back one [`created`](Self::created) whose entry was never
    /// inserted.
    pub(super) fn uncreated(&self) {
        // The counters wrap: adding 2^64 - 1 takes one back.
        self.outcomes.add(CREATED, 1u64.wrapping_neg());
    }

    /// Counts `n` entries removed.
    pub(super) fn removed(&self, n: usize) {
        if n > 0 {
            self.outcomes.add(REMOVED, n as u64);
        }
    }

    /// Counts a waiting caller until the guard drops.
    #[cfg_attr(loom, allow(dead_code))]
    pub(super) fn waiting(&self) -> Waiting<'_> {
        // Relaxed: see `Waiting`.
        self.waiting.fetch_add(1, Relaxed);
        Waiting(&self.waiting)
    }
}

/// # What the limiter reports
impl<K: Hash + Eq, S: BuildHasher + Clone> ConcurrencyLimiter<K, S> {
    /// The permits in flight, keys, waiters and outcomes so far.
    ///
    /// # Locking behaviour
    ///
    /// Counting the permits in flight visits every key: it takes each
    /// shard's write lock in turn, briefly, as a sweep does.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = keyrate::ConcurrencyLimiter::new(2);
    /// let _p = limiter.try_acquire("k").unwrap();
    /// assert_eq!(limiter.stats().in_flight, 1);
    /// ```
    #[must_use]
    pub fn stats(&self) -> ConcurrencyStats {
        let [acquired, at_limit, full, timed_out, rate_limited, created, removed] =
            self.counters.outcomes.sums();
        let (mut in_flight, mut keys) = (0u64, 0u64);
        self.slots.retain(|_, slot| {
            in_flight += u64::from(slot.held());
            keys += 1;
            true
        });
        ConcurrencyStats {
            in_flight,
            keys,
            // Relaxed: see `Waiting`.
            waiting: self.counters.waiting.load(Relaxed) as u64,
            acquired,
            refused_at_limit: at_limit,
            refused_limiter_full: full,
            timed_out,
            rate_limited,
            keys_created: created,
            keys_removed: removed,
        }
    }
}

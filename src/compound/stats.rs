//! A compound limiter's counters: decisions by outcome, and denials by
//! the bucket that bound them, `(scope, quota)`.

use super::outcome::{CompoundDecision, CompoundDenial};
use super::policy::MAX_QUOTAS;
use crate::observe::Striped;

/// The scopes [`CompoundStats::denied_by`] tells apart: a denial bound by
/// scope `COUNTED_SCOPES - 1` or later is counted under that last one.
pub const COUNTED_SCOPES: usize = 8;

/// A compound limiter's counters, read with one call (`stats()` of
/// [`CompoundLimiter`](crate::CompoundLimiter) and of the Redis limiters'
/// compound calls). Counts start at zero and only grow; a read sums
/// per-thread counters without stopping the writers.
///
/// # Examples
///
/// ```
/// use keyrate::{CompoundLimiter, Policy, Quota};
///
/// let plan = Policy::new([Quota::new(10.0, 5).unwrap(), Quota::new(1.0, 2).unwrap()]).unwrap();
/// let org = Policy::from(Quota::new(1.0, 1).unwrap());
/// let limiter = CompoundLimiter::new();
/// assert!(limiter.check_scopes(&[("k", &plan), ("org", &org)], 0.0, 1).is_ok());
/// assert!(limiter.check_scopes(&[("k", &plan), ("org", &org)], 0.0, 1).is_err()); // the org's
/// assert!(limiter.check("k", &plan, 0.0, 2).is_err()); // the plan's second quota
/// let stats = limiter.stats();
/// assert_eq!((stats.admitted, stats.denied_insufficient_tokens), (1, 2));
/// assert_eq!(stats.denied_by(1, 0), 1);
/// assert_eq!(stats.denied_by(0, 1), 1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompoundStats {
    /// Calls admitted (cost 0 included; not `remaining`).
    pub admitted: u64,
    /// Tokens spent by the admitted calls (from every bucket of a call).
    pub admitted_cost: u64,
    /// Calls denied with [`CompoundDenial::InsufficientTokens`].
    pub denied_insufficient_tokens: u64,
    /// Calls denied with [`CompoundDenial::ExceedsCapacity`].
    pub denied_exceeds_capacity: u64,
    /// Calls denied with [`CompoundDenial::InvalidTimestamp`].
    pub denied_invalid_timestamp: u64,
    /// Calls denied with [`CompoundDenial::LimiterFull`].
    pub denied_limiter_full: u64,
    /// Calls refused as malformed: no scope, a key named twice, keys in
    /// different Redis Cluster slots.
    pub denied_bad_call: u64,
    /// Redis limiters only: calls whose round trip failed, decided by the
    /// `FailurePolicy`.
    pub backend_errors: u64,
    /// Redis limiters only: denials decided locally by the deny mirror
    /// (also counted in `denied_insufficient_tokens`).
    pub mirror_denials: u64,
    /// Denials by a quota (insufficient tokens or a cost above its
    /// capacity), by the bucket that bound them: `[scope][quota]`, scopes
    /// from [`COUNTED_SCOPES`]` - 1` on counted together.
    pub denied_by_bucket: [[u64; MAX_QUOTAS]; COUNTED_SCOPES],
}

impl CompoundStats {
    /// Denials bound by quota `quota` of scope `scope` (0 out of range).
    #[must_use]
    pub fn denied_by(&self, scope: usize, quota: usize) -> u64 {
        let scope = scope.min(COUNTED_SCOPES - 1);
        self.denied_by_bucket[scope]
            .get(quota)
            .copied()
            .unwrap_or(0)
    }

    /// All denials, whatever the reason.
    #[must_use]
    pub fn denied(&self) -> u64 {
        self.denied_insufficient_tokens
            + self.denied_exceeds_capacity
            + self.denied_invalid_timestamp
            + self.denied_limiter_full
            + self.denied_bad_call
    }
}

/// The fixed counters, then one per `(scope, quota)`.
#[derive(Clone, Copy)]
pub(crate) enum Cell {
    Admitted,
    AdmittedCost,
    InsufficientTokens,
    ExceedsCapacity,
    InvalidTimestamp,
    LimiterFull,
    BadCall,
    BackendErrors,
    MirrorDenials,
    /// The first of the `(scope, quota)` counters.
    Binding,
}

const CELLS: usize = Cell::Binding as usize + COUNTED_SCOPES * MAX_QUOTAS;

/// A compound limiter's counters, striped per thread.
pub(crate) struct CompoundCounters(Striped<CELLS>);

impl CompoundCounters {
    pub(crate) fn new() -> Self {
        CompoundCounters(Striped::new(true))
    }

    pub(crate) fn add(&self, cell: Cell, n: u64) {
        self.0.add(cell as usize, n);
    }

    /// Counts one decided call of `cost`.
    #[inline]
    pub(crate) fn decided(&self, cost: u64, result: Result<&CompoundDecision, &CompoundDenial>) {
        let denial = match result {
            Ok(_) => {
                self.0.add_all([
                    (Cell::Admitted as usize, 1),
                    (Cell::AdmittedCost as usize, cost),
                ]);
                return;
            }
            Err(denial) => denial,
        };
        let cell = match denial {
            CompoundDenial::InsufficientTokens { .. } => Cell::InsufficientTokens,
            CompoundDenial::ExceedsCapacity { .. } => Cell::ExceedsCapacity,
            CompoundDenial::InvalidTimestamp => Cell::InvalidTimestamp,
            CompoundDenial::LimiterFull { .. } => Cell::LimiterFull,
            CompoundDenial::DuplicateKey { .. }
            | CompoundDenial::NoScopes
            | CompoundDenial::CrossSlot { .. } => Cell::BadCall,
        };
        match denial.binding() {
            Some((scope, quota)) => {
                let scope = scope.min(COUNTED_SCOPES - 1);
                let index = Cell::Binding as usize + scope * MAX_QUOTAS + quota.min(MAX_QUOTAS - 1);
                self.0.add_all([(cell as usize, 1), (index, 1)]);
            }
            None => self.add(cell, 1),
        }
    }

    pub(crate) fn read(&self) -> CompoundStats {
        let sum = self.0.sums();
        let mut denied_by_bucket = [[0; MAX_QUOTAS]; COUNTED_SCOPES];
        for (scope, row) in denied_by_bucket.iter_mut().enumerate() {
            for (quota, count) in row.iter_mut().enumerate() {
                *count = sum[Cell::Binding as usize + scope * MAX_QUOTAS + quota];
            }
        }
        CompoundStats {
            admitted: sum[Cell::Admitted as usize],
            admitted_cost: sum[Cell::AdmittedCost as usize],
            denied_insufficient_tokens: sum[Cell::InsufficientTokens as usize],
            denied_exceeds_capacity: sum[Cell::ExceedsCapacity as usize],
            denied_invalid_timestamp: sum[Cell::InvalidTimestamp as usize],
            denied_limiter_full: sum[Cell::LimiterFull as usize],
            denied_bad_call: sum[Cell::BadCall as usize],
            backend_errors: sum[Cell::BackendErrors as usize],
            mirror_denials: sum[Cell::MirrorDenials as usize],
            denied_by_bucket,
        }
    }
}

impl std::fmt::Debug for CompoundCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.read().fmt(f)
    }
}

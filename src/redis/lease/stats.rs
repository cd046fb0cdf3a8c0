//! What a Redis concurrency limiter counts in this process.

use crate::sync::unmodeled::{AtomicU64, Relaxed};

/// A [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter)'s counts
/// in this process (the limiter and its clones), read with
/// [`stats`](crate::RedisConcurrencyLimiter::stats).
///
/// The counts start at zero and only grow; `held` is the state at the
/// read. Redis itself counts every process's leases: see
/// [`held`](crate::RedisConcurrencyLimiter::held).
///
/// # Examples
///
/// ```
/// use keyrate::RedisConcurrencyStats;
///
/// let stats = RedisConcurrencyStats::default();
/// assert_eq!((stats.held, stats.acquired, stats.leases_lost), (0, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConcurrencyStats {
    /// Permits with a lease that this process holds now (degraded ones,
    /// which hold none, are not counted).
    pub held: u64,
    /// Permits given with a lease.
    pub acquired: u64,
    /// Calls refused because the key held its limit.
    pub refused_at_limit: u64,
    /// Waits (`acquire`) that ended without a permit.
    pub timed_out: u64,
    /// This process's callers waiting for a permit now (`acquire`).
    pub waiting: u64,
    /// Calls Redis could not decide (unreachable, timed out, a bad reply,
    /// the circuit open), answered by the failure policy.
    pub failed: u64,
    /// Of those, the ones admitted without a lease (fail open).
    pub degraded: u64,
    /// Permits dropped whose release was sent to Redis.
    pub released: u64,
    /// `ZREM` calls that failed: their leases expire within the lease time.
    pub release_failures: u64,
    /// Renewal rounds done (one every lease time / 3 while leases are held;
    /// counted when the round ends).
    pub renew_rounds: u64,
    /// Renew script calls sent (one per round on a standalone Redis; on a
    /// cluster, one per lease set, or one for all with a hash tag; more
    /// past 512 leases).
    pub renew_calls: u64,
    /// Renew calls that failed (their leases are tried again next round).
    pub renew_failures: u64,
    /// Leases a renewal found gone (expired, or lost by Redis: a restart
    /// without persistence, a failover): their permits hold no lease any
    /// more, and are no longer renewed.
    pub leases_lost: u64,
}

/// The counters behind [`RedisConcurrencyStats`], shared by the limiter,
/// its clones, its permits and its renewal task. Relaxed: they decide
/// nothing.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) held: AtomicU64,
    pub(super) acquired: AtomicU64,
    pub(super) refused_at_limit: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) waiting: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) degraded: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) release_failures: AtomicU64,
    pub(super) renew_rounds: AtomicU64,
    pub(super) renew_calls: AtomicU64,
    pub(super) renew_failures: AtomicU64,
    pub(super) leases_lost: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(super) fn read(&self) -> RedisConcurrencyStats {
        RedisConcurrencyStats {
            held: self.held.load(Relaxed),
            acquired: self.acquired.load(Relaxed),
            refused_at_limit: self.refused_at_limit.load(Relaxed),
            timed_out: self.timed_out.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            failed: self.failed.load(Relaxed),
            degraded: self.degraded.load(Relaxed),
            released: self.released.load(Relaxed),
            release_failures: self.release_failures.load(Relaxed),
            renew_rounds: self.renew_rounds.load(Relaxed),
            renew_calls: self.renew_calls.load(Relaxed),
            renew_failures: self.renew_failures.load(Relaxed),
            leases_lost: self.leases_lost.load(Relaxed),
        }
    }
}

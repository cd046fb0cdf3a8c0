//! Coalescing, per key, the calls that the bound admits: boarding a call
//! ([`Mirror::board`]), and the guard that lands it ([`FlightGuard`]).

use super::{Entry, Mirror};
use crate::gcra::{self, Quota};
use crate::time::Nanos;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::futures::OwnedNotified;

/// Whether a call the bound admits goes to Redis now or waits.
pub(in crate::redis) enum Boarding {
    /// Go: the call counts as in flight until the guard is dropped.
    Go(Option<FlightGuard>),
    /// Wait until a call in flight on the key ends, then decide again.
    Wait(Pin<Box<OwnedNotified>>),
}

/// A call in flight to Redis: dropping it (answered, failed or cancelled)
/// takes its spend off the key's pending refill and wakes the waiters.
pub(in crate::redis) struct FlightGuard {
    mirror: Arc<Mirror>,
    key: Box<str>,
    spend: Nanos,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut shard = self.mirror.shard(&self.key).write();
        if let Some(entry) = shard.get_mut(&*self.key) {
            entry.pending = entry.pending.saturating_sub(self.spend);
            if let Some(landed) = &entry.landed {
                landed.notify_waiters();
            }
        }
    }
}

impl std::fmt::Debug for FlightGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightGuard")
            .field("spend", &self.spend)
            .finish_non_exhaustive()
    }
}

impl Mirror {
    /// Boards a call of `cost` (`spend` of refill) on `key` at `at`
    /// that the bound admits:
    /// it goes when the bound still admits it with every call in flight
    /// counted as admitted (or when the entry cannot be kept), and waits
    /// otherwise.
    pub(in crate::redis) fn board(
        self: &Arc<Self>,
        key: &str,
        at: Nanos,
        cost: u64,
        spend: Nanos,
        quota: &Quota,
    ) -> Boarding {
        let mut shard = self.shard(key).write();
        if !shard.contains_key(key) {
            if shard.len() >= self.per_shard {
                return Boarding::Go(None);
            }
            shard.insert(Box::from(key), Entry::default());
        }
        let local_now = self.local_now();
        let entry = shard.get_mut(key).expect("present");
        if entry.pending > Nanos::ZERO {
            // A stale bound counts for nothing: the flights' answers
            // bring a fresh one.
            let bound = if self.fresh(entry.seen, local_now) {
                entry.bound
            } else {
                Nanos::ZERO
            };
            let if_all_admitted = bound.max(at).saturating_add(entry.pending);
            if gcra::decide(if_all_admitted, at, cost, quota).is_err() {
                let landed = entry.landed.get_or_insert_with(Default::default).clone();
                let mut wait = Box::pin(landed.notified_owned());
                // Registered before the shard lock is released: a flight
                // that lands from now on wakes it.
                wait.as_mut().enable();
                return Boarding::Wait(wait);
            }
        }
        entry.pending = entry.pending.saturating_add(spend);
        Boarding::Go(Some(FlightGuard {
            mirror: Arc::clone(self),
            key: Box::from(key),
            spend,
        }))
    }
}

//! The Redis limiters' counters: the same [`Stats`] as the in-memory
//! limiter, counted per thread in this process, plus backend errors.

use super::call::Outcome;
use super::error::RedisLimiterError;
use super::settings::Settings;
use crate::observe::Cell;

impl Settings {
    /// Counts a decided call of `cost` (or a failed round trip), and
    /// passes it on.
    pub(super) fn record(&self, cost: u64, outcome: Outcome) -> Outcome {
        match &outcome {
            Ok(decision) => self.counters.decided(cost, decision.as_ref().map(|_| ())),
            Err(_) => self.counters.add(Cell::BackendErrors, 1),
        }
        outcome
    }

    /// Counts a failed round trip that decided nothing, and passes it on.
    pub(super) fn failed(&self, err: RedisLimiterError) -> RedisLimiterError {
        self.counters.add(Cell::BackendErrors, 1);
        err
    }
}

#[cfg(feature = "prometheus")]
impl<C: Send + Sync> crate::prometheus::Observe for super::RedisLimiter<C> {
    fn backend(&self) -> crate::prometheus::Backend {
        crate::prometheus::Backend::Shared
    }

    fn stats(&self) -> crate::observe::Stats {
        super::RedisLimiter::stats(self)
    }
}

//! An independent model of buckets whose quota changes: the seed's
//! `(credit, last_refill)` pair per key, where a key's credit is converted
//! when a call arrives under a different quota than the key's last one.
//!
//! keyrate's rule, stated in the model's terms: what a change keeps is the
//! refill still missing, `full - credit` nanoseconds, so under the new quota
//! the credit becomes `new full - missing` (negative: a debt, when more is
//! missing than the new bucket holds). Credit is in nanoseconds of refill:
//! a token of a quota is worth its whole-nanosecond interval
//! `ceil(1e9 * den / num)`.
#![allow(dead_code)]

use std::collections::HashMap;

/// A quota of the model: `num / den` tokens per second (den a power of
/// two), `capacity` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub num: u64,
    pub den: u64,
    pub capacity: u64,
}

impl Plan {
    pub fn rate(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// Nanoseconds of refill one token is worth.
    pub fn token(&self) -> i128 {
        (1_000_000_000 * i128::from(self.den) + i128::from(self.num) - 1) / i128::from(self.num)
    }

    fn full(&self) -> i128 {
        i128::from(self.capacity) * self.token()
    }
}

/// Plans with whole and fractional intervals, small and large bursts.
pub const PLANS: &[Plan] = &[
    Plan {
        num: 1,
        den: 1,
        capacity: 5,
    }, // free: 1/s, burst 5
    Plan {
        num: 20,
        den: 1,
        capacity: 100,
    }, // pro: 20/s, burst 100
    Plan {
        num: 3,
        den: 1,
        capacity: 3,
    }, // 3/s: 333_333_333.3 ns a token
    Plan {
        num: 1,
        den: 4,
        capacity: 2,
    }, // 0.25/s
    Plan {
        num: 7,
        den: 2,
        capacity: 12,
    }, // 3.5/s
];

/// What a call does: the same outcomes as the model without plans.
pub use super::model::Outcome;

#[derive(Debug, Default)]
pub struct PlanModel {
    /// key -> (credit in ns of refill, last refill, the plan it was under)
    buckets: HashMap<String, (i128, u64, Plan)>,
}

impl PlanModel {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key's credit at `now` under `plan`, without storing it.
    fn credit(&self, key: &str, now: u64, plan: &Plan) -> i128 {
        let Some(&(credit, last, was)) = self.buckets.get(key) else {
            return plan.full();
        };
        assert!(now >= last, "the model needs per-key monotone time");
        // Refill under the plan it was under, capped at that plan's full.
        let credit = (credit + i128::from(now - last)).min(was.full());
        // Keep what is missing, in the new plan.
        plan.full() - (was.full() - credit)
    }

    fn tokens(credit: i128, plan: &Plan) -> u64 {
        if credit <= 0 {
            0
        } else {
            (credit / plan.token()) as u64
        }
    }

    pub fn call(&mut self, key: &str, now: u64, cost: u64, plan: &Plan) -> Outcome {
        if cost > plan.capacity {
            return Outcome::ExceedsCapacity;
        }
        let credit = self.credit(key, now, plan);
        let spend = i128::from(cost) * plan.token();
        if cost == 0 {
            return Outcome::Admitted {
                remaining: Self::tokens(credit, plan),
            };
        }
        if credit >= spend {
            self.buckets
                .insert(key.to_owned(), (credit - spend, now, *plan));
            Outcome::Admitted {
                remaining: Self::tokens(credit - spend, plan),
            }
        } else {
            Outcome::Wait {
                retry_ns: (spend - credit) as u64,
            }
        }
    }

    pub fn remaining(&self, key: &str, now: u64, plan: &Plan) -> u64 {
        Self::tokens(self.credit(key, now, plan), plan)
    }
}

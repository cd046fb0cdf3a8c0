//! An exact integer model of keyrate's semantics, written independently of
//! the library: the seed's `(tokens, last_refill)` pair per key, in integer
//! units so that no arithmetic rounds.
//!
//! With `rate = num / den` tokens per second, one token is `1e9 * den` units
//! and one nanosecond of refill is `num` units. [`Model::exact`] is the seed
//! verbatim. [`Model::rounded`] is keyrate's contract: identical, except that
//! an admitted call of cost `n` uses `ceil(n * 1e9 / rate)` whole nanoseconds
//! of refill (less than 1 ns more than exact), and the bucket holds
//! `ceil(capacity * 1e9 / rate)` ns of refill when full.
#![allow(dead_code)]

use std::collections::HashMap;

const NANOS: u128 = 1_000_000_000;

/// What one call does in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; whole tokens left afterwards.
    Admitted { remaining: u64 },
    /// Denied for lack of tokens; nanoseconds until it would be admitted.
    Wait { retry_ns: u64 },
    /// Denied: the cost is above the capacity.
    ExceedsCapacity,
}

#[derive(Debug, Clone)]
pub struct Model {
    num: u128,
    den: u128,
    capacity: u64,
    rounded: bool,
    /// key -> (credit in units, last refill in ns)
    buckets: HashMap<String, (u128, u64)>,
}

impl Model {
    /// keyrate's contract for `rate = num / den` (den a power of two, so
    /// the rate is an exact `f64`).
    pub fn rounded(num: u64, den: u64, capacity: u64) -> Self {
        Self::build(num, den, capacity, true)
    }

    /// The seed's semantics with exact rational arithmetic.
    pub fn exact(num: u64, den: u64, capacity: u64) -> Self {
        Self::build(num, den, capacity, false)
    }

    fn build(num: u64, den: u64, capacity: u64, rounded: bool) -> Self {
        assert!(den.is_power_of_two() && num > 0 && capacity > 0);
        Model {
            num: num.into(),
            den: den.into(),
            capacity,
            rounded,
            buckets: HashMap::new(),
        }
    }

    pub fn rate(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether `1e9 / rate` is a whole number of nanoseconds, in which case
    /// the rounded and exact models coincide.
    pub fn interval_is_whole(&self) -> bool {
        (NANOS * self.den) % self.num == 0
    }

    /// Units a call of `cost` tokens uses.
    fn spend(&self, cost: u64) -> u128 {
        let exact = u128::from(cost) * NANOS * self.den;
        if self.rounded {
            exact.div_ceil(self.num) * self.num
        } else {
            exact
        }
    }

    /// Nanoseconds a call of `cost` uses (rounded up).
    pub fn spend_ns(&self, cost: u64) -> u64 {
        (u128::from(cost) * NANOS * self.den).div_ceil(self.num) as u64
    }

    /// The units a full bucket holds.
    fn full(&self) -> u128 {
        self.spend(self.capacity)
    }

    /// The bucket's credit at `now` (refilled, capped), without storing it.
    fn credit_at(&self, key: &str, now: u64) -> u128 {
        match self.buckets.get(key) {
            None => self.full(),
            Some(&(credit, last)) => {
                assert!(now >= last, "the model needs per-key monotone time");
                let refill = u128::from(now - last) * self.num;
                (credit + refill).min(self.full())
            }
        }
    }

    fn whole_tokens(&self, credit: u128) -> u64 {
        ((credit / (NANOS * self.den)) as u64).min(self.capacity)
    }

    /// One call of `cost` tokens on `key` at `now` (ns). Per key, `now`
    /// must not decrease.
    pub fn call(&mut self, key: &str, now: u64, cost: u64) -> Outcome {
        if cost > self.capacity {
            return Outcome::ExceedsCapacity;
        }
        let credit = self.credit_at(key, now);
        if cost == 0 {
            return Outcome::Admitted {
                remaining: self.whole_tokens(credit),
            };
        }
        let spend = self.spend(cost);
        if credit >= spend {
            let left = credit - spend;
            self.buckets.insert(key.to_owned(), (left, now));
            Outcome::Admitted {
                remaining: self.whole_tokens(left),
            }
        } else {
            // Recording the refill on denial changes nothing observable.
            if self.buckets.contains_key(key) {
                self.buckets.insert(key.to_owned(), (credit, now));
            }
            Outcome::Wait {
                retry_ns: (spend - credit).div_ceil(self.num) as u64,
            }
        }
    }

    /// Whole tokens `key` holds at `now`.
    pub fn remaining(&self, key: &str, now: u64) -> u64 {
        self.whole_tokens(self.credit_at(key, now))
    }

    /// Keys that have a bucket (made by a first admitted positive-cost call).
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether the call `(cost admitted at t)` history of one key respects
    /// the budget: in every window `[t_i, t_j]`, the admitted cost is at
    /// most `capacity + rate * (t_j - t_i)` (exactly).
    pub fn within_budget(&self, admitted: &[(u64, u64)]) -> bool {
        for i in 0..admitted.len() {
            let mut sum: u128 = 0;
            for &(t, cost) in &admitted[i..] {
                sum += u128::from(cost);
                let span = u128::from(t - admitted[i].0);
                let budget = u128::from(self.capacity) * NANOS * self.den + span * self.num;
                if sum * NANOS * self.den > budget {
                    return false;
                }
            }
        }
        true
    }
}

/// Converts model nanoseconds to the `f64` seconds passed to keyrate, and
/// returns the nanoseconds keyrate will see (the rounding of that `f64`).
pub fn as_secs(ns: u64) -> (f64, u64) {
    let secs = ns as f64 / 1e9;
    let seen = std::time::Duration::try_from_secs_f64(secs)
        .expect("valid timestamp")
        .as_nanos() as u64;
    (secs, seen)
}

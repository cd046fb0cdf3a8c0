//! An exact integer model of keyrate's semantics, written independently of
//! the library: the seed's `(tokens, last_refill)` pair per key, in integer
//! units so that no arithmetic rounds.
//!
//! With `rate = num / den` tokens per second, one token takes
//! `1e9 * den / num` nanoseconds to refill. [`Model::exact`] is the seed
//! verbatim, in units where one token is `1e9 * den` and one nanosecond of
//! refill is `num`. [`Model::rounded`] is keyrate's contract: the same
//! bucket refilled at the served rate, one token per `ceil(1e9 * den / num)`
//! whole nanoseconds (one token is that many units, one nanosecond one
//! unit). Its only difference from the exact model is that rate, at most
//! 1 ns per token slower, and never by more than 0.1% (see
//! [`Model::served_shortfall`]); there is no per-call slack.
//!
//! Time may run backwards per key: a call stamped before the key's last
//! refill sees the credit the bucket held then, every spend since still
//! charged (the refill since `now` is taken back, so the credit can be
//! negative: a debt). Written as credit and time, independently of
//! keyrate's one-word form of the same rule.
#![allow(dead_code)]

use keyrate::{Decision, Denial, Refusal};
use std::collections::HashMap;

const NANOS: u128 = 1_000_000_000;

/// Rates as exact fractions `num / den`: whole and fractional intervals.
pub const RATES: &[(u64, u64)] = &[
    (1, 1),             // 1/s: 1 s per token
    (3, 1),             // 3/s: 333_333_333.3 ns per token
    (1, 4),             // 0.25/s: 4 s per token
    (7, 2),             // 3.5/s: 285_714_285.7 ns per token
    (10, 1),            // 10/s
    (3, 8),             // 0.375/s: 2_666_666_666.6 ns per token
    (1000, 1),          // 1000/s: 1 ms per token
    (13, 16),           // 0.8125/s
    (1_000_000, 1),     // 1e6/s: 1 us per token
    (999_983, 1),       // a prime near 1e6/s: 1000.017 ns, charged 1001 (0.098% slow)
    (1_000_000_000, 1), // 1e9/s: 1 ns per token
];

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
    /// The exact rate, `num / den` tokens per second.
    num: u128,
    den: u128,
    capacity: u64,
    /// Units one token is worth.
    token: u128,
    /// Units one nanosecond refills.
    per_ns: u128,
    /// key -> (credit in units, negative for a debt; last refill in ns)
    buckets: HashMap<String, (i128, u64)>,
}

impl Model {
    /// keyrate's contract for `rate = num / den` (den a power of two, so
    /// the rate is an exact `f64`): a whole interval per token.
    pub fn rounded(num: u64, den: u64, capacity: u64) -> Self {
        Self::rounded_wide(num.into(), den.into(), capacity)
    }

    /// [`rounded`](Self::rounded) for any `f64` rate whose exact fraction
    /// fits 128 bits, such as 1.1e-10 (whose denominator is 2^86).
    pub fn rounded_f64(rate: f64, capacity: u64) -> Self {
        let (mantissa, exponent) = Self::binary(rate);
        let (num, den) = if exponent >= 0 {
            let num = u128::from(mantissa) << exponent;
            assert_eq!(num >> exponent, u128::from(mantissa), "{rate} too large");
            (num, 1)
        } else {
            assert!(exponent > -98, "{rate} too small");
            (u128::from(mantissa), 1u128 << -exponent)
        };
        Self::rounded_wide(num, den, capacity)
    }

    fn rounded_wide(num: u128, den: u128, capacity: u64) -> Self {
        let interval = (NANOS * den).div_ceil(num);
        Self::build(num, den, capacity, interval, 1)
    }

    /// The seed's semantics with exact rational arithmetic.
    pub fn exact(num: u64, den: u64, capacity: u64) -> Self {
        let den = u128::from(den);
        Self::build(num.into(), den, capacity, NANOS * den, num.into())
    }

    /// A positive finite `f64` as `mantissa * 2^exponent` exactly, the
    /// mantissa odd.
    fn binary(rate: f64) -> (u64, i32) {
        assert!(rate.is_finite() && rate > 0.0);
        let bits = rate.to_bits();
        let biased = ((bits >> 52) & 0x7ff) as i32;
        let fraction = bits & ((1 << 52) - 1);
        let (mantissa, exponent) = if biased == 0 {
            (fraction, -1074)
        } else {
            (fraction | (1 << 52), biased - 1075)
        };
        let zeros = mantissa.trailing_zeros();
        (mantissa >> zeros, exponent + zeros as i32)
    }

    /// The rate of an `f64` as the exact fraction `(num, den)` that
    /// [`rounded`](Self::rounded) and [`exact`](Self::exact) take, when
    /// both fit a `u64`.
    pub fn fraction(rate: f64) -> Option<(u64, u64)> {
        let (mantissa, exponent) = Self::binary(rate);
        if exponent >= 0 {
            mantissa
                .checked_shl(exponent as u32)
                .filter(|m| m >> exponent == mantissa)
                .map(|m| (m, 1))
        } else if exponent > -64 {
            Some((mantissa, 1u64 << -exponent))
        } else {
            None
        }
    }

    fn build(num: u128, den: u128, capacity: u64, token: u128, per_ns: u128) -> Self {
        assert!(den.is_power_of_two() && num > 0 && capacity > 0);
        Model {
            num,
            den,
            capacity,
            token,
            per_ns,
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

    /// How far below the exact rate this model refills, as a fraction of
    /// the exact rate (0 for the exact model).
    pub fn served_shortfall(&self) -> f64 {
        let served = self.per_ns as f64 * NANOS as f64 / self.token as f64;
        1.0 - served / self.rate()
    }

    /// Units a call of `cost` tokens uses.
    fn spend(&self, cost: u64) -> i128 {
        (u128::from(cost) * self.token) as i128
    }

    /// Nanoseconds of refill a call of `cost` uses (rounded up).
    pub fn spend_ns(&self, cost: u64) -> u64 {
        (self.spend(cost) as u128).div_ceil(self.per_ns) as u64
    }

    /// The units a full bucket holds.
    fn full(&self) -> i128 {
        self.spend(self.capacity)
    }

    /// The bucket's credit at `now` (refilled and capped, or, before the
    /// last refill, with the refill since `now` taken back), without
    /// storing it.
    fn credit_at(&self, key: &str, now: u64) -> i128 {
        match self.buckets.get(key) {
            None => self.full(),
            Some(&(credit, last)) if now >= last => {
                let refill = i128::from(now - last) * self.per_ns as i128;
                (credit + refill).min(self.full())
            }
            Some(&(credit, last)) => credit - i128::from(last - now) * self.per_ns as i128,
        }
    }

    fn whole_tokens(&self, credit: i128) -> u64 {
        if credit <= 0 {
            return 0;
        }
        ((credit as u128 / self.token) as u64).min(self.capacity)
    }

    /// One call of `cost` tokens on `key` at `now` (ns).
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
                retry_ns: ((spend - credit) as u128).div_ceil(self.per_ns) as u64,
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

    /// Whether one key's admitted calls `(t, cost)`, in time order, respect
    /// the exact token bucket's budget: over every span `[t_i, t_j]`, the
    /// admitted cost is at most `capacity + rate * (t_j - t_i)`, in exact
    /// rational arithmetic on the exact rate (whichever model this is).
    ///
    /// Linear time: with `S_k` the cost admitted up to call `k`, the budget
    /// holds iff `(S_j - rate * t_j) - (S_{i-1} - rate * t_i) <= capacity`
    /// for all `i <= j`, so it keeps the least `S_{i-1} - rate * t_i` seen.
    pub fn within_budget(&self, admitted: &[(u64, u64)]) -> bool {
        // Everything times 1e9 * den, so that rate * t is t * num.
        let scale = (NANOS * self.den) as i128;
        let capacity = i128::from(self.capacity as i64) * scale;
        let mut before: i128 = 0; // S_{i-1} * scale
        let mut least = i128::MAX;
        let mut last = 0;
        for &(t, cost) in admitted {
            assert!(t >= last, "within_budget needs calls in time order");
            last = t;
            let refill = i128::from(t as i64) * self.num as i128;
            least = least.min(before - refill);
            before += i128::from(cost as i64) * scale;
            if before - refill - least > capacity {
                return false;
            }
        }
        true
    }
}

/// A call's answer in the model's terms, from any backend. A refusal that
/// is no denial (Redis failed) or a denial the model has no outcome for
/// fails the test.
pub fn outcome<E: Refusal>(answer: Result<Decision, E>) -> Outcome {
    let denial = match answer {
        Ok(decision) => {
            return Outcome::Admitted {
                remaining: decision.remaining(),
            }
        }
        Err(refusal) => *refusal
            .denial()
            .unwrap_or_else(|| panic!("the backend failed: {refusal}")),
    };
    match denial {
        Denial::InsufficientTokens { retry_after } => Outcome::Wait {
            retry_ns: u64::try_from(retry_after.as_nanos()).expect("a wait below 2^64 ns"),
        },
        Denial::ExceedsCapacity { .. } => Outcome::ExceedsCapacity,
        other => panic!("a denial the model does not make: {other:?}"),
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

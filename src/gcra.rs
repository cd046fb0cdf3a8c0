//! The pure decision: `(bucket word, now, cost, quota) -> admit or deny`.
//!
//! No atomics and no maps here: plain integer arithmetic on nanoseconds,
//! so every rule can be unit-tested and model-checked on its own.
//!
//! # The bucket word
//!
//! A bucket is one `u64`, `full_at`: the instant (in nanoseconds) at which
//! the bucket will hold `capacity` tokens again. At time `now` the bucket
//! lacks `full_at - now` nanoseconds of refill (nothing if `full_at <= now`),
//! so it holds `capacity - (full_at - now) / interval` tokens. This is the
//! seed's `(tokens, last_refill)` pair folded into one number (the generic
//! cell rate algorithm): refill is implicit in the passing of time, so it
//! can never be counted twice, and the cap at `capacity` is the `max` with
//! `now` below.
//!
//! A brand-new bucket is the word `0`: full at every valid timestamp.

use crate::error::{ConfigError, Denial};
use crate::time::MAX_TIMESTAMP_NANOS;
use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The largest refill a spend (and so the refill window) may use up:
/// `2^63 - 2` ns, so that a live word (`now + missing <= 2^64 - 3`) never
/// meets the bucket's two marker words.
const MAX_SPEND_NANOS: u64 = MAX_TIMESTAMP_NANOS - 1;

/// A bucket's shape: how many tokens it holds at most, and how fast it refills.
///
/// The per-token interval `1e9 / rate` nanoseconds is kept as an exact
/// fraction of the `f64` rate, so rates such as 3/s or 0.1/s lose nothing
/// to a rounded interval.
///
/// # Examples
///
/// ```
/// use keyrate::Quota;
///
/// let quota = Quota::new(3.0, 10).unwrap();
/// assert_eq!(quota.capacity(), 10);
/// assert_eq!(quota.rate(), 3.0);
/// assert!(Quota::new(0.0, 10).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    rate: f64,
    capacity: u64,
    /// The per-token interval is `interval_num / interval_den` nanoseconds.
    interval_num: u128,
    interval_den: u64,
    /// `spend(capacity)`: the refill an empty bucket needs to become full.
    window: u64,
    /// `spend(1)`, the common case, computed once.
    spend_one: u64,
    /// The interval when it is a whole number of nanoseconds, else 0: then
    /// `spend(cost)` is a multiplication, not a 128-bit division.
    whole_interval: u64,
}

impl Quota {
    /// Makes a quota of `capacity` tokens refilled at `rate` tokens per second.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when `rate` is not finite and positive, when one token
    /// would take less than 1 ns or more than `2^63` ns to refill, when
    /// `capacity` is zero, or when refilling `capacity` tokens would take
    /// more than `2^63 - 1` ns.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConfigError, Quota};
    ///
    /// assert!(Quota::new(0.25, 1).is_ok());
    /// assert_eq!(Quota::new(1.0, 0), Err(ConfigError::ZeroCapacity));
    /// ```
    pub fn new(rate: f64, capacity: u64) -> Result<Self, ConfigError> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(ConfigError::RateNotPositive { rate });
        }
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let out_of_range = ConfigError::RateOutOfRange { rate };
        // rate = odd * 2^exp exactly, so 1e9 / rate = num / den exactly.
        let (mantissa, exponent) = decompose(rate);
        let zeros = mantissa.trailing_zeros();
        let odd = mantissa >> zeros;
        let exponent = exponent + zeros as i32;
        let (num, den) = if exponent >= 0 {
            let den = odd
                .checked_shl(exponent as u32)
                .filter(|d| d >> exponent == odd)
                .ok_or(out_of_range)?;
            (NANOS_PER_SEC, den)
        } else {
            let shift = exponent.unsigned_abs();
            // 1e9 < 2^30: the numerator fits a u128 up to a shift of 97.
            if shift > 97 {
                return Err(out_of_range);
            }
            (NANOS_PER_SEC << shift, odd)
        };
        // One token must take at least 1 ns and at most 2^63 - 1 ns.
        let den_wide = u128::from(den);
        if num < den_wide || num / den_wide > u128::from(MAX_TIMESTAMP_NANOS) {
            return Err(out_of_range);
        }
        let mut quota = Quota {
            rate,
            capacity,
            interval_num: num,
            interval_den: den,
            window: 0,
            spend_one: 0,
            whole_interval: 0,
        };
        // Fill the shortcuts only after computing them the general way.
        let spend_one = quota.spend(1).ok_or(out_of_range)?;
        if num % den_wide == 0 {
            quota.whole_interval = spend_one;
        }
        quota.spend_one = spend_one;
        quota.window = quota
            .spend(capacity)
            .ok_or(ConfigError::WindowTooLong { capacity, rate })?;
        Ok(quota)
    }

    /// The refill rate, in tokens per second.
    #[must_use]
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The most tokens a bucket holds: the largest burst.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How long an empty bucket takes to refill completely, rounded up to
    /// the nanosecond. A bucket idle this long is indistinguishable from a
    /// new one.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::Quota;
    /// use std::time::Duration;
    ///
    /// let quota = Quota::new(2.0, 3).unwrap();
    /// assert_eq!(quota.refill_time(), Duration::from_millis(1500));
    /// ```
    #[must_use]
    pub fn refill_time(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The refill of a full bucket, in nanoseconds: `spend(capacity)`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn window(&self) -> u64 {
        self.window
    }

    /// The refill a call of `cost` tokens uses up: `ceil(cost * interval)`
    /// nanoseconds, or `None` when that exceeds `2^63 - 2` ns.
    ///
    /// This ceiling is the only rounding in keyrate's arithmetic: it makes
    /// an admitted call cost less than 1 ns of refill more than the exact
    /// model, never less.
    #[inline]
    pub(crate) fn spend(&self, cost: u64) -> Option<u64> {
        if cost == 1 && self.spend_one != 0 {
            return Some(self.spend_one);
        }
        if self.whole_interval != 0 {
            return cost
                .checked_mul(self.whole_interval)
                .filter(|&ns| ns <= MAX_SPEND_NANOS);
        }
        let ns = mul_div_ceil(cost, self.interval_num, self.interval_den)?;
        u64::try_from(ns).ok().filter(|&ns| ns <= MAX_SPEND_NANOS)
    }

    /// Whole tokens held by a bucket lacking `missing` ns of refill.
    fn tokens_with(&self, missing: u64) -> u64 {
        let Some(available) = self.window.checked_sub(missing) else {
            return 0;
        };
        // The largest n with ceil(n * num / den) <= available, i.e.
        // n <= available * den / num. available < 2^63 and den < 2^64.
        let n = u128::from(available) * u128::from(self.interval_den) / self.interval_num;
        u64::try_from(n).unwrap_or(u64::MAX).min(self.capacity)
    }
}

/// Splits a finite, positive `f64` into `(mantissa, exponent)` with
/// `value == mantissa * 2^exponent` exactly.
fn decompose(value: f64) -> (u64, i32) {
    let bits = value.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    if biased == 0 {
        // Subnormal: no implicit leading one.
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    }
}

/// `ceil(a * b / d)` without overflow, or `None` if it exceeds `u128`.
///
/// The product is formed in three 64-bit limbs and divided by schoolbook
/// long division, so it is exact for every input.
fn mul_div_ceil(a: u64, b: u128, d: u64) -> Option<u128> {
    debug_assert!(d > 0);
    let a = u128::from(a);
    let low = a * (b & u128::from(u64::MAX));
    let high = a * (b >> 64) + (low >> 64);
    let limbs = [(high >> 64) as u64, high as u64, low as u64];
    let d = u128::from(d);
    let mut quotient = [0u64; 3];
    let mut remainder = 0u128;
    for (q, limb) in quotient.iter_mut().zip(limbs) {
        let current = (remainder << 64) | u128::from(limb);
        *q = (current / d) as u64;
        remainder = current % d;
    }
    if quotient[0] != 0 {
        return None;
    }
    let result = (u128::from(quotient[1]) << 64) | u128::from(quotient[2]);
    result.checked_add(u128::from(remainder != 0))
}

/// Decides one call against a bucket word.
///
/// Returns the word to store when the call is admitted (equal to `full_at`
/// when nothing changes, as for cost 0), or why it is denied. A denial
/// leaves the bucket exactly as it was: the caller writes nothing.
///
/// `now` must already be a validated timestamp (`<= MAX_TIMESTAMP_NANOS`)
/// and `full_at` a live word (not the retired marker).
///
/// Time running backwards needs no special case: a call whose `now` is
/// older than the bucket's last update sees the bucket as it would have
/// been at `now` with every later spend already charged, which is never
/// more than it held then. The word only ever grows.
#[inline]
pub(crate) fn decide(full_at: u64, now: u64, cost: u64, quota: &Quota) -> Result<u64, Denial> {
    if cost == 0 {
        return Ok(full_at);
    }
    if cost > quota.capacity {
        return Err(Denial::ExceedsCapacity {
            cost,
            capacity: quota.capacity,
        });
    }
    // cost <= capacity, so spend <= window and cannot fail.
    let spend = quota.spend(cost).unwrap_or(u64::MAX);
    // Refill the bucket still lacks at `now` after this call (capped: a
    // full bucket lacks nothing, whatever time has passed).
    let missing = full_at.saturating_sub(now).saturating_add(spend);
    if missing <= quota.window {
        // now + missing <= (2^63 - 1) * 2: no overflow, never u64::MAX.
        Ok(now + missing)
    } else {
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_nanos(missing - quota.window),
        })
    }
}

/// Whole tokens a bucket with word `full_at` holds at `now`.
#[inline]
pub(crate) fn tokens_at(full_at: u64, now: u64, quota: &Quota) -> u64 {
    quota.tokens_with(full_at.saturating_sub(now))
}

/// Whether the bucket is full at `now`, so that dropping it changes nothing.
#[inline]
pub(crate) fn is_full(full_at: u64, now: u64) -> bool {
    full_at <= now
}

/// The checks [`decide`] makes before it reads the word, in its order:
/// the refill `cost` uses up (0 for cost 0, which changes nothing), or the
/// denial that no word can change. For callers that must fetch the word
/// first (the Redis limiter): they skip the fetch when this denies.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[inline]
pub(crate) fn spend_for(cost: u64, quota: &Quota) -> Result<u64, Denial> {
    if cost == 0 {
        return Ok(0);
    }
    if cost > quota.capacity {
        return Err(Denial::ExceedsCapacity {
            cost,
            capacity: quota.capacity,
        });
    }
    // cost <= capacity, so spend <= window and cannot fail.
    Ok(quota.spend(cost).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn quota(rate: f64, capacity: u64) -> Quota {
        Quota::new(rate, capacity).unwrap()
    }

    #[test]
    fn seed_example() {
        let q = quota(1.0, 3);
        let mut w = 0;
        for _ in 0..3 {
            w = decide(w, 0, 1, &q).unwrap();
        }
        assert_eq!(w, 3 * SEC);
        assert_eq!(
            decide(w, 0, 1, &q),
            Err(Denial::InsufficientTokens {
                retry_after: Duration::from_secs(1)
            })
        );
        w = decide(w, 2 * SEC, 1, &q).unwrap();
        assert_eq!(w, 4 * SEC);
        assert_eq!(tokens_at(w, 2 * SEC, &q), 1);
        assert!(decide(w, 2 * SEC, 2, &q).is_err());
    }

    #[test]
    fn cost_boundaries() {
        let q = quota(1.0, 3);
        // Cost 0 changes nothing, even on an empty bucket.
        assert_eq!(decide(3 * SEC, 0, 0, &q), Ok(3 * SEC));
        // Cost == capacity on a full bucket is admitted; capacity + 1 never.
        assert_eq!(decide(0, 10 * SEC, 3, &q), Ok(13 * SEC));
        assert_eq!(
            decide(0, 10 * SEC, 4, &q),
            Err(Denial::ExceedsCapacity {
                cost: 4,
                capacity: 3
            })
        );
        assert!(matches!(
            decide(0, 0, u64::MAX, &q),
            Err(Denial::ExceedsCapacity { .. })
        ));
    }

    #[test]
    fn refill_is_capped_and_exact_at_the_boundary() {
        let q = quota(1.0, 3);
        let empty_at_0 = 3 * SEC;
        // One nanosecond short of one token.
        assert!(decide(empty_at_0, SEC - 1, 1, &q).is_err());
        assert_eq!(
            decide(empty_at_0, SEC - 1, 1, &q)
                .unwrap_err()
                .retry_after(),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(decide(empty_at_0, SEC, 1, &q), Ok(4 * SEC));
        // A long idle refills to capacity, not beyond.
        let w = decide(empty_at_0, 1000 * SEC, 3, &q).unwrap();
        assert!(decide(w, 1000 * SEC, 1, &q).is_err());
        assert_eq!(tokens_at(empty_at_0, 1000 * SEC, &q), 3);
        assert!(is_full(empty_at_0, 3 * SEC));
        assert!(!is_full(empty_at_0, 3 * SEC - 1));
    }

    #[test]
    fn backwards_time_never_creates_tokens() {
        let q = quota(1.0, 3);
        let w = decide(0, 10 * SEC, 1, &q).unwrap(); // 2 left at 10 s
        assert_eq!(tokens_at(w, 10 * SEC, &q), 2);
        // At 9.5 s the same bucket holds fewer, never more.
        assert_eq!(tokens_at(w, 9 * SEC + SEC / 2, &q), 1);
        let w2 = decide(w, 9 * SEC + SEC / 2, 1, &q).unwrap();
        assert!(w2 > w, "the word only moves forward");
        assert_eq!(tokens_at(w2, 10 * SEC, &q), 1);
        // Far in the past: nothing at all, and the word is not moved.
        assert_eq!(tokens_at(w, 0, &q), 0);
        assert!(decide(w, 0, 1, &q).is_err());
    }

    #[test]
    fn fractional_intervals_round_each_spend_up_by_less_than_a_nanosecond() {
        // 3 tokens/s: 333_333_333.33 ns per token.
        let q = quota(3.0, 3);
        assert_eq!(q.spend(1), Some(333_333_334));
        assert_eq!(q.spend(2), Some(666_666_667));
        assert_eq!(q.spend(3), Some(SEC));
        assert_eq!(q.window, SEC);
        // 1 then 2 from a full bucket: 333_333_334 + 666_666_667 > 1e9, so
        // the rounding denies the second call by one nanosecond...
        let w = decide(0, 0, 1, &q).unwrap();
        assert_eq!(
            decide(w, 0, 2, &q).unwrap_err().retry_after(),
            Some(Duration::from_nanos(1))
        );
        // ...and 1 ns later it is admitted.
        assert!(decide(w, 1, 2, &q).is_ok());
        // 0.1/s is not exactly representable; the interval is still exact.
        let q = quota(0.1, 1);
        assert_eq!(q.spend(1), Some(10 * SEC)); // 1e9 / 0.1000...0555 rounds up to 1e10
    }

    #[test]
    fn whole_tokens_match_spend() {
        for (rate, cap) in [(3.0, 7), (0.25, 5), (1e9, 100), (7.5, 13), (0.1, 4)] {
            let q = quota(rate, cap);
            for missing in [0, 1, q.window / 3, q.window / 2 + 1, q.window - 1, q.window] {
                let n = q.tokens_with(missing);
                let available = q.window - missing;
                assert!(n == 0 || q.spend(n).unwrap() <= available);
                assert!(n == cap || q.spend(n + 1).unwrap() > available);
            }
        }
    }

    #[test]
    fn config_errors() {
        for rate in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -1.0, -0.0] {
            assert!(matches!(
                Quota::new(rate, 1),
                Err(ConfigError::RateNotPositive { .. })
            ));
        }
        for rate in [1e9 * 1.5, 1e300, 1e-11, 5e-324] {
            assert!(
                matches!(Quota::new(rate, 1), Err(ConfigError::RateOutOfRange { .. })),
                "{rate}"
            );
        }
        assert_eq!(Quota::new(1.0, 0), Err(ConfigError::ZeroCapacity));
        assert!(matches!(
            Quota::new(1.0, u64::MAX),
            Err(ConfigError::WindowTooLong { .. })
        ));
        // The extremes that are accepted.
        assert!(Quota::new(1e9, 1 << 62).is_ok());
        assert!(Quota::new(1.0, 9_223_372_036).is_ok());
        assert!(Quota::new(1.0, 9_223_372_037).is_err());
        assert!(Quota::new(1.1e-10, 1).is_ok());
    }

    #[test]
    fn shortcuts_agree_with_the_general_spend() {
        for (rate, cap) in [
            (1.0, 9),
            (3.0, 9),
            (0.25, 9),
            (1e9, 9),
            (0.1, 9),
            (1000.0, 9),
        ] {
            let q = quota(rate, cap);
            let general = Quota {
                spend_one: 0,
                whole_interval: 0,
                ..q
            };
            for cost in [0, 1, 2, 3, 7, 9, 1 << 20, u64::MAX / 3, u64::MAX] {
                assert_eq!(q.spend(cost), general.spend(cost), "{rate} {cost}");
            }
        }
        assert_eq!(quota(4.0, 1).whole_interval, 250_000_000);
        assert_eq!(quota(3.0, 1).whole_interval, 0);
    }

    #[test]
    fn decompose_is_exact() {
        for v in [1.0, 0.25, 3.0, 0.1, 1e-300, 5e-324, 1.7e9, f64::MAX] {
            let (m, e) = decompose(v);
            let back = (m as f64) * 2f64.powi(e.max(-1022)) * 2f64.powi((e + 1022).min(0));
            assert_eq!(back, v, "{v}");
        }
    }

    #[test]
    fn mul_div_ceil_is_exact() {
        assert_eq!(mul_div_ceil(3, 10, 4), Some(8));
        assert_eq!(mul_div_ceil(0, 10, 4), Some(0));
        assert_eq!(mul_div_ceil(u64::MAX, u128::MAX, 1), None);
        let big = 1u128 << 100;
        assert_eq!(mul_div_ceil(1 << 40, big, 1 << 20), Some(1 << 120));
        assert_eq!(mul_div_ceil(7, big + 1, 7), Some(big + 1));
        assert_eq!(mul_div_ceil(u64::MAX, 3, 3), Some(u128::from(u64::MAX)));
    }
}

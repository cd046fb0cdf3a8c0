//! The pure decision: `(bucket word, now, cost, quota) -> admit or deny`.
//!
//! No atomics and no maps here: plain integer arithmetic on nanoseconds
//! ([`Nanos`]: instants and spans) and token counts (`u64`), so every rule
//! can be unit-tested and model-checked on its own.
//!
//! # The bucket word
//!
//! A bucket is one word, `full_at` (stored as a `u64`): the instant at which
//! the bucket will hold `capacity` tokens again. At time `now` the bucket
//! lacks `full_at - now` nanoseconds of refill (nothing if `full_at <= now`),
//! so it holds `capacity - (full_at - now) / interval` tokens, where the
//! interval is a whole number of nanoseconds per token (see [`Quota`]'s
//! precision rule). This is the
//! seed's `(tokens, last_refill)` pair folded into one number (the generic
//! cell rate algorithm): refill is implicit in the passing of time, so it
//! can never be counted twice, and the cap at `capacity` is the `max` with
//! `now` below.
//!
//! A brand-new bucket is the word `0`: full at every valid timestamp.
//!
//! # Why a whole number of nanoseconds per token
//!
//! Charging each call its own rounded share of a fractional interval
//! (`ceil(cost * 1e9 / rate)`) lets the roundings add up over a burst, so a
//! full bucket at 3 tokens/s lost the last token of its burst. Keeping the
//! fraction exactly would need sub-nanosecond bits that a 64-bit word of
//! absolute nanoseconds (Unix time is about 2^60.6 ns) does not have, and
//! coarsening time instead would let a bucket gain a token early. A whole
//! interval per token keeps every bucket on an exact integer grid: bursts
//! are exact, nothing is ever more lenient than the exact token bucket, and
//! the only error is the interval's rounding, once per token, which
//! [`Quota::new`] bounds (see [`Quota`]).

use crate::error::{ConfigError, Denial};
use crate::time::{Nanos, MAX_TIMESTAMP_NANOS, NANOS_PER_SEC};
use std::time::Duration;

/// The largest refill a spend (and so the refill window) may use up:
/// `2^63 - 2` ns, so that a live word (`now + missing <= 2^64 - 3`) never
/// meets the bucket's two marker words.
const MAX_SPEND_NANOS: u64 = MAX_TIMESTAMP_NANOS - 1;

/// The largest shortfall of the long-run served rate against the rate asked
/// for that [`Quota::new`] accepts: 0.1%. A rate that would be served
/// further below is refused with [`ConfigError::RateImprecise`].
pub const MAX_RATE_SHORTFALL: f64 = 1e-3;

/// A bucket's shape: how many tokens it holds at most, and how fast it refills.
///
/// # Precision
///
/// A quota charges every token one whole number of nanoseconds of refill:
/// its [`interval`](Quota::interval) is `1e9 / rate` rounded **up** to the
/// nanosecond (computed from the exact binary value of the `f64` rate), and
/// a full bucket holds exactly `capacity` such intervals. So:
///
/// - a full bucket admits calls whose costs sum to exactly `capacity`, at
///   one instant, with any mix of costs, and nothing more;
/// - over any span of timestamps, admitted cost never exceeds
///   `capacity + rate * span`: keyrate is never more lenient than the exact
///   token bucket;
/// - the long-run rate served is [`served_rate`](Quota::served_rate)
///   `= 1e9 / interval`, at most 1 ns per token slower than `rate`: below it
///   by less than `rate / 1e9` relatively (under one part per million up to
///   1000 tokens/s, and exactly `rate` whenever `1e9 / rate` is a whole
///   number of nanoseconds). [`Quota::new`] refuses a rate that would be
///   served more than [`MAX_RATE_SHORTFALL`] (0.1%) below what was asked,
///   which can only happen above 1e6 tokens/s, such as 3e8 (3.33 ns per
///   token would be served as 4 ns). Count coarser tokens there (KiB, not
///   bytes), or pick a whole interval with [`Quota::with_interval`].
///
/// # Examples
///
/// ```
/// use keyrate::Quota;
/// use std::time::Duration;
///
/// let quota = Quota::new(3.0, 10).unwrap();
/// assert_eq!(quota.capacity(), 10);
/// assert_eq!(quota.rate(), 3.0);
/// assert_eq!(quota.interval(), Duration::from_nanos(333_333_334));
/// assert!(Quota::new(0.0, 10).is_err());
/// assert!(Quota::new(3e8, 10).is_err()); // 3.33 ns per token: not whole
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    rate: f64,
    capacity: u64,
    /// Refill per token: `ceil(1e9 / rate)` ns, at least 1 ns.
    interval: Nanos,
    /// `capacity * interval`: the refill an empty bucket needs to be full.
    window: Nanos,
}

impl Quota {
    /// Makes a quota of `capacity` tokens refilled at `rate` tokens per second.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when `rate` is not finite and positive, when one token
    /// would take less than 1 ns or more than `2^63` ns to refill, when the
    /// whole-nanosecond interval would serve the rate more than
    /// [`MAX_RATE_SHORTFALL`] below what was asked (see
    /// [Precision](Quota#precision)), when `capacity` is zero, or when
    /// refilling `capacity` tokens would take more than `2^63 - 2` ns.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConfigError, Quota};
    ///
    /// assert!(Quota::new(0.25, 1).is_ok());
    /// assert_eq!(Quota::new(1.0, 0), Err(ConfigError::ZeroCapacity));
    /// assert!(matches!(Quota::new(3e8, 1), Err(ConfigError::RateImprecise { .. })));
    /// ```
    pub fn new(rate: f64, capacity: u64) -> Result<Self, ConfigError> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(ConfigError::RateNotPositive { rate });
        }
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let (num, den) = exact_interval(rate).ok_or(ConfigError::RateOutOfRange { rate })?;
        // One token must take at least 1 ns and at most 2^63 - 1 ns.
        let den_wide = u128::from(den);
        if num < den_wide {
            return Err(ConfigError::RateOutOfRange { rate });
        }
        let interval = u64::try_from(num.div_ceil(den_wide))
            .ok()
            .filter(|&t| t <= MAX_TIMESTAMP_NANOS)
            .ok_or(ConfigError::RateOutOfRange { rate })?;
        // Served rate 1e9 / interval against 1e9 / (num / den): the relative
        // shortfall is (interval - num / den) / interval. The excess
        // `interval * den - num` is below `den`, so `1000 * excess` fits.
        let excess = u128::from(interval) * den_wide - num;
        if 1000 * excess > u128::from(interval) * den_wide {
            return Err(ConfigError::RateImprecise {
                rate,
                interval_nanos: interval,
            });
        }
        Self::build(rate, Nanos::new(interval), capacity)
    }

    /// Makes a quota of `capacity` tokens, one token refilled every
    /// `interval` (a whole number of nanoseconds): the rate is served
    /// exactly.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when `interval` is under 1 ns or above `2^63 - 1`
    /// ns, when `capacity` is zero, or when refilling `capacity` tokens
    /// would take more than `2^63 - 2` ns.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::Quota;
    /// use std::time::Duration;
    ///
    /// // 3 ns per token: the 3.33e8 tokens/s that Quota::new(1e9 / 3.0, _)
    /// // cannot state exactly in an f64.
    /// let quota = Quota::with_interval(Duration::from_nanos(3), 1024).unwrap();
    /// assert_eq!(quota.interval(), Duration::from_nanos(3));
    /// assert_eq!(quota.refill_time(), Duration::from_nanos(3 * 1024));
    /// ```
    pub fn with_interval(interval: Duration, capacity: u64) -> Result<Self, ConfigError> {
        let nanos = Nanos::checked_from_duration(interval)
            .filter(|t| (1..=MAX_TIMESTAMP_NANOS).contains(&t.as_u64()))
            .ok_or(ConfigError::IntervalOutOfRange { interval })?;
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        Self::build(1e9 / nanos.as_u64() as f64, nanos, capacity)
    }

    fn build(rate: f64, interval: Nanos, capacity: u64) -> Result<Self, ConfigError> {
        let window = interval
            .checked_mul(capacity)
            .filter(|w| w.as_u64() <= MAX_SPEND_NANOS)
            .ok_or(ConfigError::WindowTooLong { capacity, rate })?;
        Ok(Quota {
            rate,
            capacity,
            interval,
            window,
        })
    }

    /// The refill rate asked for, in tokens per second.
    #[must_use]
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The rate actually served over a long run, in tokens per second:
    /// `1e9 / interval`. Equal to [`rate`](Self::rate) when `1e9 / rate` is
    /// a whole number of nanoseconds, else below it by less than 1 ns per
    /// token and at most [`MAX_RATE_SHORTFALL`] relatively.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::Quota;
    ///
    /// assert_eq!(Quota::new(4.0, 1).unwrap().served_rate(), 4.0);
    /// let third = Quota::new(3.0, 1).unwrap().served_rate();
    /// assert!(third < 3.0 && third > 3.0 * (1.0 - 1e-8));
    /// ```
    #[must_use]
    pub fn served_rate(&self) -> f64 {
        1e9 / self.interval.as_u64() as f64
    }

    /// The most tokens a bucket holds: the largest burst.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill each token costs: `1e9 / rate` nanoseconds, rounded up to
    /// a whole nanosecond.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::Quota;
    /// use std::time::Duration;
    ///
    /// assert_eq!(Quota::new(2.0, 3).unwrap().interval(), Duration::from_millis(500));
    /// ```
    #[must_use]
    pub fn interval(&self) -> Duration {
        self.interval.into()
    }

    /// How long an empty bucket takes to refill completely: `capacity`
    /// intervals. A bucket idle this long is indistinguishable from a new
    /// one.
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
        self.window.into()
    }

    /// The quota as four words, for a cell that stores it in atomics.
    pub(crate) fn to_words(self) -> [u64; 4] {
        [
            self.rate.to_bits(),
            self.capacity,
            self.interval.as_u64(),
            self.window.as_u64(),
        ]
    }

    /// The inverse of [`to_words`](Self::to_words), for words it returned.
    pub(crate) fn from_words([rate, capacity, interval, window]: [u64; 4]) -> Quota {
        Quota {
            rate: f64::from_bits(rate),
            capacity,
            interval: Nanos::new(interval),
            window: Nanos::new(window),
        }
    }

    /// The refill of a full bucket: `capacity * interval`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) fn window(&self) -> Nanos {
        self.window
    }

    /// Whole tokens held by a bucket lacking `missing` of refill.
    #[inline]
    pub(crate) fn tokens_with(&self, missing: Nanos) -> u64 {
        // window = capacity * interval, so this is at most capacity.
        self.window.saturating_sub(missing) / self.interval
    }
}

/// The exact per-token interval `1e9 / rate` nanoseconds as a fraction
/// `(num, den)`, or `None` when it cannot be formed in 128 bits (the rate
/// is then far outside the accepted range).
fn exact_interval(rate: f64) -> Option<(u128, u64)> {
    // rate = odd * 2^exp exactly, so 1e9 / rate = num / den exactly.
    let (mantissa, exponent) = decompose(rate);
    let zeros = mantissa.trailing_zeros();
    let odd = mantissa >> zeros;
    let exponent = exponent + zeros as i32;
    if exponent >= 0 {
        let den = odd
            .checked_shl(exponent as u32)
            .filter(|d| d >> exponent == odd)?;
        Some((u128::from(NANOS_PER_SEC), den))
    } else {
        let shift = exponent.unsigned_abs();
        // 1e9 < 2^30: the numerator fits a u128 up to a shift of 97.
        (shift <= 97).then(|| (u128::from(NANOS_PER_SEC) << shift, odd))
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
pub(crate) fn decide(
    full_at: Nanos,
    now: Nanos,
    cost: u64,
    quota: &Quota,
) -> Result<Nanos, Denial> {
    let spend = spend_for(cost, quota)?;
    step(full_at, now, spend, quota).map_err(|wait| Denial::InsufficientTokens {
        retry_after: wait.into(),
    })
}

/// [`decide`] once [`spend_for`] has admitted the cost, which spends
/// `spend`: the new word, or how long until the bucket holds the cost
/// (never 0).
#[inline]
pub(crate) fn step(
    full_at: Nanos,
    now: Nanos,
    spend: Nanos,
    quota: &Quota,
) -> Result<Nanos, Nanos> {
    if spend == Nanos::ZERO {
        // Cost 0 (a positive cost spends at least one interval, 1 ns).
        return Ok(full_at);
    }
    // The refill the bucket lacks at `now` (capped: a full bucket lacks
    // nothing, whatever time has passed), against the room this call
    // leaves in the window. Compared apart rather than summed: a word far
    // ahead of `now` (up to 2^64 - 2) plus the spend would overflow, and a
    // saturated sum would report a wait short of the exact one.
    let lacking = full_at.saturating_sub(now);
    let Some(room) = quota.window.checked_sub(spend) else {
        // A spend above the window (never from `spend_for`): never fits.
        return Err(lacking.saturating_add(spend - quota.window));
    };
    if lacking <= room {
        // now + lacking + spend <= (2^63 - 1) + window < 2^64 - 1: no
        // overflow, never u64::MAX.
        Ok(now + lacking + spend)
    } else {
        Err(lacking - room)
    }
}

/// Whole tokens a bucket with word `full_at` holds at `now`.
#[inline]
pub(crate) fn tokens_at(full_at: Nanos, now: Nanos, quota: &Quota) -> u64 {
    quota.tokens_with(full_at.saturating_sub(now))
}

/// Whether the bucket is full at `now`, so that dropping it changes nothing.
#[inline]
pub(crate) fn is_full(full_at: Nanos, now: Nanos) -> bool {
    full_at <= now
}

/// The checks made before the word is read: the refill `cost` uses up (0
/// for cost 0, which changes nothing), or the denial that no word can
/// change. [`decide`] starts with it, and so do callers that must fetch
/// the word first (the Redis limiter): they skip the fetch when it denies.
#[inline]
pub(crate) fn spend_for(cost: u64, quota: &Quota) -> Result<Nanos, Denial> {
    if cost > quota.capacity {
        return Err(Denial::ExceedsCapacity {
            cost,
            capacity: quota.capacity,
        });
    }
    // cost <= capacity, so spend <= capacity * interval = window: no
    // overflow. Cost 0 spends 0.
    Ok(quota.interval * cost)
}

#[cfg(test)]
mod tests;

//! Time: whole nanoseconds as a type ([`Nanos`]), `f64` seconds and
//! [`Duration`]s converted to them, and the range accepted.
//!
//! Every timestamp that reaches the decision function has been through
//! [`nanos_from_secs`] or [`nanos_from_duration`]: finite, non-negative,
//! rounded to the nearest whole nanosecond (ties to even), and at most
//! [`MAX_TIMESTAMP_NANOS`]. [`Clock`] supplies timestamps to the methods
//! that read the time themselves.

use crate::sync::unmodeled::{AtomicU64, Relaxed};
use std::fmt;
use std::ops::{Add, Div, Mul, Sub};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Nanoseconds in a second: the crate's one such constant (take
/// `u128::from(NANOS_PER_SEC)` for 128-bit arithmetic).
pub(crate) const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A whole number of nanoseconds: an instant on the caller's timeline (a
/// timestamp, or a bucket's word `full_at`) or a span between two (a
/// refill, an interval, a wait).
///
/// A token count is a plain `u64`; this type keeps the two from being
/// swapped. The arithmetic is what the units allow: spans add to
/// instants, a span times a count is a span, a span over a span is a
/// count. `repr(transparent)` and `#[inline]` everywhere: it compiles to
/// the `u64` it wraps.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default)]
pub(crate) struct Nanos(u64);

impl Nanos {
    /// No time: the epoch, or an empty span. Also the word of a new bucket.
    pub(crate) const ZERO: Nanos = Nanos(0);

    /// `nanos` whole nanoseconds.
    #[inline]
    pub(crate) const fn new(nanos: u64) -> Nanos {
        Nanos(nanos)
    }

    /// The count of nanoseconds, for an atomic word, a counter or a wire.
    #[inline]
    pub(crate) const fn as_u64(self) -> u64 {
        self.0
    }

    /// `self - other`, or zero if `other` is later.
    #[inline]
    pub(crate) const fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }

    /// `self - other`, or `None` if `other` is later.
    #[inline]
    pub(crate) const fn checked_sub(self, other: Nanos) -> Option<Nanos> {
        match self.0.checked_sub(other.0) {
            Some(ns) => Some(Nanos(ns)),
            None => None,
        }
    }

    /// `self + other`, or `u64::MAX` ns on overflow.
    #[inline]
    pub(crate) const fn saturating_add(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(other.0))
    }

    /// `self * count`, or `None` on overflow.
    #[inline]
    pub(crate) const fn checked_mul(self, count: u64) -> Option<Nanos> {
        match self.0.checked_mul(count) {
            Some(nanos) => Some(Nanos(nanos)),
            None => None,
        }
    }

    /// `duration` in whole nanoseconds, or `None` beyond `u64::MAX` ns
    /// (about 584 years). The crate's one conversion from a [`Duration`];
    /// every other one goes through it.
    #[inline]
    pub(crate) fn checked_from_duration(duration: Duration) -> Option<Nanos> {
        u64::try_from(duration.as_nanos()).ok().map(Nanos)
    }

    /// `duration` in whole nanoseconds, `u64::MAX` ns beyond that: for
    /// spans where "longer than anything" is the right reading (a window,
    /// a measured time, a clock's setting).
    #[inline]
    pub(crate) fn saturating_from_duration(duration: Duration) -> Nanos {
        Self::checked_from_duration(duration).unwrap_or(Nanos(u64::MAX))
    }
}

/// An instant plus a span, or two spans.
impl Add for Nanos {
    type Output = Nanos;

    #[inline]
    fn add(self, other: Nanos) -> Nanos {
        Nanos(self.0 + other.0)
    }
}

/// The span between two instants, or a span less another.
impl Sub for Nanos {
    type Output = Nanos;

    #[inline]
    fn sub(self, other: Nanos) -> Nanos {
        Nanos(self.0 - other.0)
    }
}

/// A span per token times a token count.
impl Mul<u64> for Nanos {
    type Output = Nanos;

    #[inline]
    fn mul(self, count: u64) -> Nanos {
        Nanos(self.0 * count)
    }
}

/// How many whole spans `other` fit in `self`: a count.
impl Div for Nanos {
    type Output = u64;

    #[inline]
    fn div(self, other: Nanos) -> u64 {
        self.0 / other.0
    }
}

impl From<Nanos> for Duration {
    #[inline]
    fn from(nanos: Nanos) -> Duration {
        Duration::from_nanos(nanos.0)
    }
}

/// The largest timestamp accepted, in nanoseconds: `2^63 - 1` ns, about
/// 292 years after the caller's epoch (the Unix epoch works until 2262).
///
/// Keeping timestamps and refill windows below `2^63` means that
/// `timestamp + window` never overflows a `u64`.
pub const MAX_TIMESTAMP_NANOS: u64 = (1 << 63) - 1;

/// Converts a timestamp in seconds to whole nanoseconds, exactly.
///
/// Returns `None` for NaN, infinities, negative values and values above
/// [`MAX_TIMESTAMP_NANOS`]. Rounding is to the nearest nanosecond, ties to
/// even (as [`Duration::try_from_secs_f64`] does), computed from the exact
/// binary value of `secs` with one 64x64-bit multiplication: this runs on
/// every call, so it avoids the general conversion's extra work.
#[inline]
pub(crate) fn nanos_from_secs(secs: f64) -> Option<Nanos> {
    let bits = secs.to_bits();
    // The sign bit and the biased exponent together: positive values
    // only, so that one range test below also rejects negatives.
    let biased = (bits >> 52) as u32;
    let mantissa = (bits & ((1 << 52) - 1)) | (1 << 52);
    if (1003..1056).contains(&biased) {
        // The usual range, 2^-20 s <= secs < 2^33 s (272 years), in 64-bit
        // words. secs = mantissa * 2^-(t + 9) with 11 <= t <= 63, and
        // 1e9 = 2^9 * 5^9, so nanos = mantissa * 5^9 / 2^t, rounded.
        let t = 1066 - biased;
        let product = u128::from(mantissa) * 1_953_125; // exact: < 2^74
        let (low, high) = (product as u64, (product >> 64) as u64);
        // `product >> (t - 1)`: twice the quotient, plus the half bit.
        let doubled = (low >> (t - 1)) | (high << (65 - t));
        let below_half = low & ((1 << (t - 1)) - 1);
        let whole = doubled >> 1;
        let round_up = doubled & 1 == 1 && (below_half != 0 || whole & 1 == 1);
        // < 2^33 s: far below MAX_TIMESTAMP_NANOS.
        return Some(Nanos(whole + u64::from(round_up)));
    }
    // Rejects NaN (every comparison is false), negatives, infinities and
    // anything clearly beyond the range; -0.0 passes and becomes 0.
    if !(0.0..9_223_372_037.0).contains(&secs) {
        return None;
    }
    let biased = biased & 0x7ff;
    if biased < 1023 - 32 {
        // secs < 2^-32 s (zero and subnormals included): below 0.5 ns.
        return Some(Nanos::ZERO);
    }
    // secs = mantissa * 2^-shift, with 18 <= shift <= 1075 - (1023 - 32).
    let shift = 1075 - biased;
    let product = u128::from(mantissa) * u128::from(NANOS_PER_SEC); // exact: < 2^83
    let whole = product >> shift;
    let rest = product & ((1 << shift) - 1);
    let half = 1u128 << (shift - 1);
    let round_up = rest > half || (rest == half && whole & 1 == 1);
    let nanos = whole + u128::from(round_up);
    u64::try_from(nanos)
        .ok()
        .filter(|&n| n <= MAX_TIMESTAMP_NANOS)
        .map(Nanos)
}

/// When a call happens: the one time argument of every call.
///
/// Built from `f64` seconds on the caller's timeline (the seed's form,
/// `limiter.allow("key", 0.0)`), from an exact [`Duration`] since the
/// caller's epoch (to the nanosecond; an `f64` of Unix seconds resolves
/// only about 240 ns), or from [`Now`]: the backend's own clock (the
/// limiter's [`Clock`] in memory, Redis's `TIME` on Redis).
///
/// Every call takes `impl Into<At>`, so each of these works as written:
///
/// ```
/// use keyrate::{At, Now, TokenBucketLimiter};
/// use std::time::Duration;
///
/// let limiter = TokenBucketLimiter::new(1.0, 3);
/// assert!(limiter.allow("k", 0.0)); // f64 seconds
/// assert!(limiter.allow("k", Duration::from_millis(500))); // exact
/// assert!(limiter.allow("k", Now)); // the limiter's clock
/// assert!(!limiter.allow("k", At::Secs(f64::NAN))); // denied, changes nothing
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum At {
    /// Seconds on the caller's timeline, rounded to the nearest
    /// nanosecond. NaN, infinite, negative or values beyond
    /// [`MAX_TIMESTAMP_NANOS`] are denied ([`Denial::InvalidTimestamp`](crate::Denial::InvalidTimestamp)).
    Secs(f64),
    /// An exact instant after the caller's epoch; beyond
    /// [`MAX_TIMESTAMP_NANOS`] it is denied.
    Since(Duration),
    /// The backend's own clock at the call.
    Now,
}

/// The backend's own clock: `limiter.allow(key, Now)`. See [`At::Now`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now;

impl From<f64> for At {
    #[inline(always)]
    fn from(secs: f64) -> At {
        At::Secs(secs)
    }
}

impl From<Duration> for At {
    #[inline(always)]
    fn from(since_epoch: Duration) -> At {
        At::Since(since_epoch)
    }
}

impl From<Now> for At {
    #[inline(always)]
    fn from(_: Now) -> At {
        At::Now
    }
}

impl At {
    /// The caller's instant in validated nanoseconds: `Some(None)` for an
    /// invalid one, `None` for [`At::Now`] (the backend reads its clock).
    #[inline(always)]
    pub(crate) fn caller_nanos(self) -> Option<Option<Nanos>> {
        match self {
            At::Secs(secs) => Some(nanos_from_secs(secs)),
            At::Since(since) => Some(nanos_from_duration(since)),
            At::Now => None,
        }
    }

    /// This instant in validated nanoseconds, reading `clock` for
    /// [`At::Now`]; `None` for an instant out of range.
    #[inline(always)]
    pub(crate) fn nanos(self, clock: &dyn Clock) -> Option<Nanos> {
        match self.caller_nanos() {
            Some(nanos) => nanos,
            None => nanos_from_duration(clock.now()),
        }
    }
}

/// The in-memory limiter's source of [`Now`].
///
/// A clock returns the time elapsed since its own epoch. It must be
/// monotonic for decisions to be fair; a clock that steps backwards never
/// creates tokens (see the crate's semantics), it only makes calls stricter.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The time elapsed since this clock's epoch.
    fn now(&self) -> Duration;
}

/// The default clock: [`Instant`], measured from the clock's creation.
///
/// `Instant` is monotonic on every platform Rust supports, costs about
/// 20-25 ns per reading on Linux (vDSO `clock_gettime`), and is never
/// affected by wall-clock adjustments.
///
/// # Examples
///
/// ```
/// use keyrate::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    #[must_use]
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to, for tests and simulations.
///
/// Clones share the same time.
///
/// # Examples
///
/// ```
/// use keyrate::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now(), Duration::from_millis(1500));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    /// Nanoseconds since the epoch; set by `set` and `advance`.
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at its epoch.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (saturating at `u64::MAX` ns).
    pub fn advance(&self, by: Duration) {
        let by = Nanos::saturating_from_duration(by).as_u64();
        // Relaxed: the clock's value is the only data; readers need no
        // other memory ordered with it.
        let _ = self
            .nanos
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_add(by)));
    }

    /// Sets the clock to `to` after its epoch (it may move backwards).
    pub fn set(&self, to: Duration) {
        // Relaxed: as in `advance`.
        let to = Nanos::saturating_from_duration(to).as_u64();
        self.nanos.store(to, Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        // Relaxed: as in `advance`.
        Duration::from_nanos(self.nanos.load(Relaxed))
    }
}

/// A duration since the epoch (a clock reading, or a caller's exact
/// timestamp) as validated nanoseconds, or `None` beyond
/// [`MAX_TIMESTAMP_NANOS`].
#[inline]
pub(crate) fn nanos_from_duration(since_epoch: Duration) -> Option<Nanos> {
    Nanos::checked_from_duration(since_epoch).filter(|n| n.0 <= MAX_TIMESTAMP_NANOS)
}

#[cfg(test)]
mod tests;

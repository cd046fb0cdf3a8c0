//! Unit tests of the quota and the decision function, with expected values worked out by hand.

use super::*;

const SEC: u64 = 1_000_000_000;

#[test]
fn with_interval_reports_its_rate_interval_and_window() {
    // Computed apart from the code: 1e9 ns / 4 ns = 2.5e8 tokens/s.
    let quota = Quota::with_interval(Duration::from_nanos(4), 3).unwrap();
    assert_eq!(quota.rate(), 2.5e8);
    assert_eq!(quota.interval(), Duration::from_nanos(4));
    assert_eq!(quota.window(), Nanos::new(12));
    // 4 tokens/s: 250 ms a token, 1 s for a bucket of 4.
    let quota = Quota::new(4.0, 4).unwrap();
    assert_eq!(quota.interval(), Duration::from_millis(250));
    assert_eq!(quota.window(), Nanos::new(SEC));
}

#[test]
fn a_wait_past_the_last_instant_is_exact() {
    // The longest window (2^63 - 2 ns, two tokens of 2^62 - 1 ns),
    // emptied at the last instant: its word is 2^64 - 3, the highest a
    // bucket holds. Read at 0 for one token, the wait is the word less
    // the room one token leaves, 2^64 - 3 - (2^62 - 1). The word plus the
    // spend overflows 2^64: summed saturating, the wait read 2^63 + 1.
    let token = (1u64 << 62) - 1;
    let quota = Quota::with_interval(Duration::from_nanos(token), 2).unwrap();
    assert_eq!(quota.window(), Nanos::new((1 << 63) - 2));
    let at = Nanos::new(MAX_TIMESTAMP_NANOS);
    let full_at = Nanos::new(u64::MAX - 2);
    assert_eq!(step(at, at, quota.window(), &quota), Ok(full_at));
    let exact = u64::MAX - 2 - token;
    assert_eq!(
        step(full_at, Nanos::ZERO, Nanos::new(token), &quota),
        Err(Nanos::new(exact))
    );
    // The whole window: the wait is the whole word.
    assert_eq!(
        step(full_at, Nanos::ZERO, quota.window(), &quota),
        Err(full_at)
    );
}

#[test]
fn the_refill_window_reaches_two_to_the_63_minus_2_and_no_further() {
    // 2^63 - 2 ns, written out rather than taken from the constant.
    let largest = (1u64 << 63) - 2;
    let quota = Quota::with_interval(Duration::from_nanos(largest), 1).unwrap();
    assert_eq!(quota.window(), Nanos::new(largest));
    assert!(matches!(
        Quota::with_interval(Duration::from_nanos(largest + 1), 1),
        Err(ConfigError::WindowTooLong { capacity: 1, .. })
    ));
    // The same edge reached by the capacity: 2 ns a token.
    assert!(Quota::with_interval(Duration::from_nanos(2), (1 << 62) - 1).is_ok());
    assert!(matches!(
        Quota::with_interval(Duration::from_nanos(2), 1 << 62),
        Err(ConfigError::WindowTooLong { .. })
    ));
}

fn quota(rate: f64, capacity: u64) -> Quota {
    Quota::new(rate, capacity).unwrap()
}

// The decision's functions in plain counts of nanoseconds, as the
// tables below write them.

fn decide(full_at: u64, now: u64, cost: u64, q: &Quota) -> Result<u64, Denial> {
    super::decide(Nanos::new(full_at), Nanos::new(now), cost, q).map(Nanos::as_u64)
}

fn tokens_at(full_at: u64, now: u64, q: &Quota) -> u64 {
    super::tokens_at(Nanos::new(full_at), Nanos::new(now), q)
}

fn is_full(full_at: u64, now: u64) -> bool {
    super::is_full(Nanos::new(full_at), Nanos::new(now))
}

fn spend_for(cost: u64, q: &Quota) -> Result<u64, Denial> {
    super::spend_for(cost, q).map(Nanos::as_u64)
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
fn fractional_intervals_charge_a_whole_interval_per_token() {
    // 3 tokens/s: 333_333_333.3 ns per token, charged 333_333_334.
    let q = quota(3.0, 3);
    assert_eq!(spend_for(1, &q).ok(), Some(333_333_334));
    assert_eq!(spend_for(2, &q).ok(), Some(666_666_668));
    assert_eq!(q.window, Nanos::new(1_000_000_002));
    // A full bucket admits its whole burst, whatever the cost mix...
    for costs in [&[1, 1, 1][..], &[1, 2], &[2, 1], &[3]] {
        let mut w = 0;
        for &c in costs {
            w = decide(w, 0, c, &q).unwrap();
        }
        assert_eq!(w, q.window.as_u64());
        // ...and not one token more, until a whole interval has passed.
        let wait = decide(w, 0, 1, &q).unwrap_err().retry_after();
        assert_eq!(wait, Some(Duration::from_nanos(333_333_334)));
        assert!(decide(w, 333_333_333, 1, &q).is_err());
        assert!(decide(w, 333_333_334, 1, &q).is_ok());
    }
    // 0.1/s is not exactly representable: the interval rounds up to 10 s.
    let q = quota(0.1, 1);
    assert_eq!(spend_for(1, &q).ok(), Some(10 * SEC));
}

#[test]
fn whole_tokens_match_spend() {
    for (rate, cap) in [(3.0, 7), (0.25, 5), (1e9, 100), (7.5, 13), (0.1, 4)] {
        let q = quota(rate, cap);
        let window = q.window.as_u64();
        for missing in [0, 1, window / 3, window / 2 + 1, window - 1, window] {
            let n = q.tokens_with(Nanos::new(missing));
            let available = window - missing;
            assert!(n == 0 || spend_for(n, &q).unwrap() <= available);
            assert!(n == cap || spend_for(n + 1, &q).unwrap() > available);
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
fn rates_served_more_than_a_tenth_of_a_percent_slow_are_refused() {
    // 3.33 ns per token would be served as 4 ns: 25% slow.
    assert_eq!(
        Quota::new(3e8, 1),
        Err(ConfigError::RateImprecise {
            rate: 3e8,
            interval_nanos: 4
        })
    );
    // The f64 nearest 1e9 / 3 is a little below it: 3.0000000000000002
    // ns per token, charged 4.
    assert!(matches!(
        Quota::new(1e9 / 3.0, 1),
        Err(ConfigError::RateImprecise {
            interval_nanos: 4,
            ..
        })
    ));
    // Whole intervals are exact at any speed.
    for rate in [1e9, 5e8, 2.5e8, 1e8, 1e7] {
        let q = quota(rate, 1);
        assert_eq!(q.served_rate(), rate);
    }
    // Near the bound: half a nanosecond short of a whole interval is
    // 0.05% slow at 1000.5 ns, 0.06% at 800.5 ns (both accepted) and
    // 0.12% at 400.5 ns (refused).
    assert_eq!(quota(1e9 / 1000.5, 1).interval, Nanos::new(1001));
    assert_eq!(quota(1e9 / 800.5, 1).interval, Nanos::new(801));
    assert!(Quota::new(1e9 / 400.5, 1).is_err());
    // Every rate up to 1e6/s is accepted (interval >= 1000 ns).
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let rate = 1e-9 + (x >> 11) as f64 / (1u64 << 53) as f64 * 1e6;
        let q = quota(rate, 1);
        assert!(q.served_rate() <= rate);
        assert!(q.served_rate() >= rate * (1.0 - MAX_RATE_SHORTFALL));
    }
    // The message says what is accepted.
    let msg = Quota::new(3e8, 1).unwrap_err().to_string();
    assert!(
        msg.contains("0.1%") && msg.contains("with_interval"),
        "{msg}"
    );
}

#[test]
fn whole_intervals_are_taken_as_given() {
    let q = Quota::with_interval(Duration::from_nanos(3), 10).unwrap();
    let (interval, window) = (q.interval.as_u64(), q.window.as_u64());
    assert_eq!((interval, window, q.capacity), (3, 30, 10));
    assert!(matches!(
        Quota::with_interval(Duration::ZERO, 1),
        Err(ConfigError::IntervalOutOfRange { .. })
    ));
    assert!(Quota::with_interval(Duration::from_nanos(1 << 63), 1).is_err());
    assert_eq!(
        Quota::with_interval(Duration::from_secs(1), 0),
        Err(ConfigError::ZeroCapacity)
    );
    assert!(matches!(
        Quota::with_interval(Duration::from_secs(1 << 20), 1 << 40),
        Err(ConfigError::WindowTooLong { .. })
    ));
}

#[test]
fn decompose_is_exact() {
    for v in [1.0, 0.25, 3.0, 0.1, 1e-300, 5e-324, 1.7e9, f64::MAX] {
        let (m, e) = decompose(v);
        let back = (m as f64) * 2f64.powi(e.max(-1022)) * 2f64.powi((e + 1022).min(0));
        assert_eq!(back, v, "{v}");
    }
}

//! Unit tests of the conversions to nanoseconds (against std's exact
//! conversion and values worked out by hand) and of the clocks.

use super::*;

/// The conversion under test, as a plain count for the tables below.
fn nanos_from_secs(secs: f64) -> Option<u64> {
    super::nanos_from_secs(secs).map(Nanos::as_u64)
}

#[test]
fn rounds_to_nearest_nanosecond() {
    assert_eq!(nanos_from_secs(0.0), Some(0));
    assert_eq!(nanos_from_secs(-0.0), Some(0));
    assert_eq!(nanos_from_secs(1.0), Some(1_000_000_000));
    assert_eq!(nanos_from_secs(2.5), Some(2_500_000_000));
    assert_eq!(nanos_from_secs(1e-9), Some(1));
    assert_eq!(nanos_from_secs(0.4e-9), Some(0));
    assert_eq!(nanos_from_secs(0.6e-9), Some(1));
    // Exact ties (1/1024 s = 976_562.5 ns) go to the even nanosecond.
    assert_eq!(nanos_from_secs(1.0 / 1024.0), Some(976_562));
    assert_eq!(nanos_from_secs(3.0 / 1024.0), Some(2_929_688));
    assert_eq!(nanos_from_secs(f64::MIN_POSITIVE), Some(0));
    assert_eq!(nanos_from_secs(5e-324), Some(0));
    // 0.1 is slightly above 1/10 in binary; still 100 ms to the ns.
    assert_eq!(nanos_from_secs(0.1), Some(100_000_000));
    // Unix-epoch scale: the f64 spacing is 2^-22 s (~238 ns).
    let t = 1_700_000_000.123_456_7;
    let expected = (t * 1e9_f64).round() as u64;
    let got = nanos_from_secs(t).unwrap();
    assert!(got.abs_diff(expected) <= 256, "{got} vs {expected}");
}

#[test]
fn agrees_with_std_exact_conversion() {
    let std_nanos = |secs: f64| {
        Duration::try_from_secs_f64(secs)
            .ok()
            .and_then(|d| u64::try_from(d.as_nanos()).ok())
            .filter(|&n| n <= MAX_TIMESTAMP_NANOS)
    };
    // Edge values, then a deterministic pseudo-random sweep of bit
    // patterns and of decimal timestamps at every scale.
    let mut values = vec![
        0.0,
        -0.0,
        5e-324,
        2.3e-10,
        2.5e-10,
        4.9e-10,
        5e-10,
        5.1e-10,
        1.0 / 1024.0,
        1.5e-9,
        2.5e-9,
        1.0,
        1.7e9,
        9_223_372_036.854_775,
        9_223_372_036.854_776,
        9_223_372_037.0,
        f64::NAN,
        f64::INFINITY,
        -1.0,
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..200_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        values.push(f64::from_bits(x >> 1)); // any positive pattern
        values.push(-f64::from_bits(x >> 1)); // and its negative
        let scale = 10f64.powi((i % 22) as i32 - 12);
        values.push((x >> 11) as f64 / (1u64 << 53) as f64 * scale);
        // Exact half-nanosecond ties: odd multiples of 2^-k seconds.
        values.push((2 * (x % 4096) + 1) as f64 / (1u64 << (10 + i % 20)) as f64);
    }
    // The general path's upper range, 2^33 s up to the maximum (and
    // past it): every value is a whole multiple of 2^-19 s, k * 2^-19
    // with k = 2^52 + m, and k * 10^9 / 2^19 is an exact tie whenever
    // m = 512 modulo 1024 (10^9 / 2^19 = 5^9 / 2^10). Ties, their
    // neighbours and a spread of patterns, to past 2^63 ns.
    let upper = |m: u64| f64::from_bits((1056 << 52) | m);
    for j in 0..4096u64 {
        let m = j * 85_899_345 * 1024 + 512; // up to about 0.08 * 2^52
        values.extend([upper(m - 1), upper(m), upper(m + 1), upper(m + 512)]);
    }
    for v in values {
        assert_eq!(nanos_from_secs(v), std_nanos(v), "{v:e}");
    }
}

/// Ties in the general path go to the even nanosecond, as computed
/// here by hand: 2^33 s is 8,589,934,592,000,000,000 ns, and 1/1024 s
/// is 976,562.5 ns, 3/1024 s 2,929,687.5 ns.
#[test]
fn ties_above_2_pow_33_seconds_go_to_even() {
    let base = 8_589_934_592_000_000_000u64;
    let two_33 = 8_589_934_592.0f64;
    assert_eq!(nanos_from_secs(two_33), Some(base));
    assert_eq!(nanos_from_secs(two_33 + 1.0 / 1024.0), Some(base + 976_562));
    assert_eq!(
        nanos_from_secs(two_33 + 3.0 / 1024.0),
        Some(base + 2_929_688)
    );
    // Just either side of a tie: the nearest, up or down.
    let above = f64::from_bits((two_33 + 1.0 / 1024.0).to_bits() + 1);
    let below = f64::from_bits((two_33 + 1.0 / 1024.0).to_bits() - 1);
    // One step is 2^-19 s, 1,907.35 ns: 976,562.5 +- 1,907.35.
    assert_eq!(nanos_from_secs(above), Some(base + 978_470));
    assert_eq!(nanos_from_secs(below), Some(base + 974_655));
}

#[test]
fn the_monotonic_clock_advances() {
    let clock = MonotonicClock::new();
    let before = clock.now();
    // A sleep lasts at least as long as asked, on the same clock.
    std::thread::sleep(Duration::from_millis(2));
    let after = clock.now();
    assert!(
        after >= before + Duration::from_millis(2),
        "{before:?} {after:?}"
    );
}

#[test]
fn the_manual_clock_moves_only_when_told() {
    let clock = ManualClock::new();
    let shared = clock.clone();
    assert_eq!(clock.now(), Duration::ZERO);
    clock.advance(Duration::from_millis(1500));
    assert_eq!(shared.now(), Duration::from_millis(1500), "clones share");
    shared.advance(Duration::from_nanos(7));
    assert_eq!(clock.now(), Duration::from_nanos(1_500_000_007));
    clock.set(Duration::from_secs(1));
    assert_eq!(clock.now(), Duration::from_secs(1), "set may go back");
    clock.advance(Duration::MAX);
    assert_eq!(clock.now(), Duration::from_nanos(u64::MAX), "saturates");
    clock.set(Duration::MAX);
    assert_eq!(clock.now(), Duration::from_nanos(u64::MAX));
}

#[test]
fn rejects_out_of_range() {
    assert_eq!(nanos_from_secs(f64::NAN), None);
    assert_eq!(nanos_from_secs(f64::INFINITY), None);
    assert_eq!(nanos_from_secs(f64::NEG_INFINITY), None);
    assert_eq!(nanos_from_secs(-1e-9), None);
    assert_eq!(nanos_from_secs(-1.0), None);
    assert_eq!(nanos_from_secs(1e300), None);
    // 2^63 ns is one past the maximum.
    assert_eq!(nanos_from_secs(9_223_372_036.854_776), None);
    assert!(nanos_from_secs(9_223_372_036.0).is_some());
}

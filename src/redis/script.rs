//! The decision script (`bucket.lua`): its arguments and its reply.

use super::error::RedisLimiterError;
use crate::time::{At, Nanos, NANOS_PER_SEC};
use ::redis::{ScriptInvocation, Value};

/// The decision script; Redis caches it by its SHA-1.
pub(super) const BUCKET_SCRIPT: &str = include_str!("bucket.lua");

/// The compound decision script (see `compound`); Redis caches it by its
/// SHA-1.
pub(super) const COMPOUND_SCRIPT: &str = include_str!("compound/compound.lua");

/// Where "now" comes from for one call.
#[derive(Debug, Clone, Copy)]
pub(super) enum When {
    /// The caller's timestamp, validated.
    At(Nanos),
    /// Redis's `TIME`, read inside the script.
    Server,
}

impl When {
    /// Where `at` is read: the caller's validated nanoseconds (`None` when
    /// invalid), or Redis's clock for [`At::Now`].
    pub(super) fn from_at(at: At) -> Option<When> {
        match at.caller_nanos() {
            Some(nanos) => nanos.map(When::At),
            None => Some(When::Server),
        }
    }
}

/// The script's answer: what it did, the word it read, and when.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reply {
    pub(super) admitted: bool,
    /// The bucket's word before the call (0 for a missing key).
    pub(super) full_at: Nanos,
    /// The instant the script decided at.
    pub(super) now: Nanos,
}

/// Splits nanoseconds into the script's `(seconds, nanoseconds)` limbs.
pub(super) fn limbs(ns: Nanos) -> (u64, u64) {
    let ns = ns.as_u64();
    (ns / NANOS_PER_SEC, ns % NANOS_PER_SEC)
}

/// Joins the script's limbs into nanoseconds, if they form a `u64`.
pub(super) fn join(secs: i64, nanos: i64) -> Option<Nanos> {
    let secs = u64::try_from(secs).ok()?;
    let nanos = u64::try_from(nanos).ok().filter(|&n| n < NANOS_PER_SEC)?;
    let ns = secs.checked_mul(NANOS_PER_SEC)?.checked_add(nanos)?;
    Some(Nanos::new(ns))
}

/// Adds the script's arguments for one call at `now` spending `spend` of
/// refill, on a bucket whose full refill is `window`; the keys' TTL floor
/// `min_ttl_ms` is in milliseconds.
pub(super) fn arguments(
    invocation: &mut ScriptInvocation<'_>,
    now: When,
    spend: Nanos,
    window: Nanos,
    min_ttl_ms: u64,
    guess: Option<Guess>,
) {
    match now {
        When::At(ns) => {
            let (secs, nanos) = limbs(ns);
            invocation.arg(secs).arg(nanos);
        }
        When::Server => {
            invocation.arg("time").arg(0);
        }
    }
    let (spend_secs, spend_nanos) = limbs(spend);
    // spend <= window (gcra::spend_for checked the cost): admitted exactly
    // when full_at <= now + slack.
    let (slack_secs, slack_nanos) = limbs(window - spend);
    invocation
        .arg(spend_secs)
        .arg(spend_nanos)
        .arg(slack_secs)
        .arg(slack_nanos)
        // At least 1 ms: the script's fast path at Redis's clock passes it
        // to `PX` as it is.
        .arg(min_ttl_ms.max(1));
    if let Some(guess) = guess {
        match guess.expected {
            Nanos::ZERO => invocation.arg(""),
            word => invocation.arg(word.as_u64()),
        };
        invocation.arg(guess.word.as_u64()).arg(guess.expiry_ms);
        if let Some(within) = guess.server {
            invocation
                .arg(within.admitted_from_us)
                .arg(within.not_full_until_us)
                .arg(within.expiry_until_us.map_or(-1, |us| us as i64));
        }
    }
}

/// What the script writes, with no arithmetic, if the key holds `expected`
/// (and, at Redis's clock, if the call is admitted with the bucket not yet
/// full: see [`Guess::at_server`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Guess {
    /// The word Rust expects the key to hold (0: no key).
    pub(super) expected: Nanos,
    /// `gcra::decide` on `expected`: the word to write.
    pub(super) word: Nanos,
    /// With the caller's time, the key's TTL: the time from `now` until
    /// `word`, in whole milliseconds rounded up, at least the floor and at
    /// least 1 ms. At Redis's clock, the instant `word` rounded up to the
    /// millisecond, for `PXAT` (the script raises it to its floor).
    pub(super) expiry_ms: u64,
    /// At Redis's clock, the instants at which `word` is the call's.
    pub(super) server: Option<Within>,
}

/// The instants of Redis's clock, in whole microseconds of Unix time (the
/// resolution of `TIME`), at which a [`Guess::at_server`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Within {
    /// From this instant on, the call is admitted: `expected <= now + slack`.
    pub(super) admitted_from_us: u64,
    /// Until this instant, the bucket is not full: `now < expected`, so the
    /// new word is `expected + spend`.
    pub(super) not_full_until_us: u64,
    /// Until this instant the floor does not raise `expiry_ms` (`None`:
    /// it always does); after it, the script computes the floor.
    pub(super) expiry_until_us: Option<u64>,
}

/// Instants in microseconds at or above this are not exact in a Lua
/// double (2^53 µs: the year 2255).
const LUA_EXACT_US: u64 = 1 << 53;

impl Guess {
    /// The guess of a call at the caller's instant `now`: `word` is
    /// `gcra::decide` on `expected` at `now`.
    pub(super) fn new(expected: Nanos, word: Nanos, now: Nanos, min_ttl_ms: u64) -> Self {
        let missing = word.saturating_sub(now).as_u64();
        let ttl_ms = missing.div_ceil(1_000_000).max(min_ttl_ms).max(1);
        Guess {
            expected,
            word,
            expiry_ms: ttl_ms,
            server: None,
        }
    }

    /// The guess of a call at Redis's clock, whose instant Rust does not
    /// know, spending `spend` (of a bucket whose slack is `slack`, the
    /// window less the spend) from a bucket expected to hold `expected`:
    /// while the bucket is not full (`expected` after Redis's instant), the
    /// new word is `expected + spend` whatever the instant, so the script
    /// only compares its instant with the bounds of [`Within`]. `None` for
    /// a missing key (its new word depends on the instant), or instants
    /// too far off for a Lua double.
    pub(super) fn at_server(
        expected: Nanos,
        spend: Nanos,
        slack: Nanos,
        min_ttl_ms: u64,
    ) -> Option<Self> {
        if expected == Nanos::ZERO {
            return None;
        }
        let word = expected.as_u64().checked_add(spend.as_u64())?;
        let expiry_ms = word.div_ceil(1_000_000);
        // `TIME` gives now = now_us * 1000 ns exactly, so: admitted when
        // now_us * 1000 >= expected - slack, not full while
        // now_us * 1000 < expected.
        let admitted_from_us = expected.saturating_sub(slack).as_u64().div_ceil(1_000);
        let not_full_until_us = expected.as_u64().div_ceil(1_000) - 1;
        // The floor, floor(now_us / 1000) + max(min_ttl, 1), is at most
        // expiry_ms while floor(now_us / 1000) <= expiry_ms - that.
        let expiry_until_us = expiry_ms
            .checked_sub(min_ttl_ms.max(1))
            .and_then(|ms| ms.checked_mul(1_000)?.checked_add(999));
        if not_full_until_us >= LUA_EXACT_US || expiry_ms >= LUA_EXACT_US {
            return None;
        }
        Some(Guess {
            expected,
            word: Nanos::new(word),
            expiry_ms,
            server: Some(Within {
                admitted_from_us,
                not_full_until_us,
                expiry_until_us: expiry_until_us.map(|us| us.min(LUA_EXACT_US - 1)),
            }),
        })
    }
}

/// The word a bucket key holds: the decimal of a `u64`, digits only, as
/// the script and every earlier version write it; `""` for a missing key.
pub(super) fn word(stored: &str) -> Option<Nanos> {
    if stored.is_empty() {
        return Some(Nanos::ZERO);
    }
    if !stored.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stored.parse().ok().map(Nanos::new)
}

/// The script's answer as a [`Reply`], or why it is not one. `now` is
/// the caller's timestamp, if the call had one; `guessed`, the word the
/// call's [`Guess`] expected, if it sent one.
pub(super) fn parse(
    answer: &Value,
    now: Option<Nanos>,
    guessed: Option<Nanos>,
) -> Result<Reply, RedisLimiterError> {
    let shape = || RedisLimiterError::reply("not an answer the decision script gives");
    let items = match (answer, now, guessed) {
        // The fast path: the key held the guessed word, and the script
        // wrote the guess's.
        (Value::Int(1), Some(now), Some(full_at)) => {
            return Ok(Reply {
                admitted: true,
                full_at,
                now,
            })
        }
        // The fast path at Redis's clock: its `TIME`, seconds and
        // microseconds.
        (Value::Array(items), None, Some(full_at)) if items.len() == 2 => {
            let secs: i64 = ::redis::from_redis_value(&items[0]).map_err(|_| shape())?;
            let micros: i64 = ::redis::from_redis_value(&items[1]).map_err(|_| shape())?;
            let now = micros
                .checked_mul(1_000)
                .and_then(|nanos| join(secs, nanos))
                .ok_or_else(|| RedisLimiterError::reply("bad time limbs"))?;
            return Ok(Reply {
                admitted: true,
                full_at,
                now,
            });
        }
        (Value::Array(items), ..) => items,
        _ => return Err(shape()),
    };
    let [admitted, stored, secs, nanos] = &items[..] else {
        return Err(shape());
    };
    let admitted: i64 = ::redis::from_redis_value(admitted).map_err(|_| shape())?;
    let stored: String = ::redis::from_redis_value(stored).map_err(|_| shape())?;
    let full_at = word(&stored).ok_or_else(RedisLimiterError::foreign)?;
    let now = match now {
        Some(now) => now,
        None => {
            let secs: i64 = ::redis::from_redis_value(secs).map_err(|_| shape())?;
            let nanos: i64 = ::redis::from_redis_value(nanos).map_err(|_| shape())?;
            join(secs, nanos).ok_or_else(|| RedisLimiterError::reply("bad time limbs"))?
        }
    };
    Ok(Reply {
        admitted: admitted == 1,
        full_at,
        now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MAX_TIMESTAMP_NANOS;

    #[test]
    fn limbs_round_trip_across_the_whole_range() {
        for ns in [
            0,
            1,
            999_999_999,
            1_000_000_000,
            1_700_000_000_123_456_789,
            MAX_TIMESTAMP_NANOS,
            u64::MAX,
        ] {
            let (s, n) = limbs(Nanos::new(ns));
            assert!(n < NANOS_PER_SEC);
            // Each limb is exact in a Lua double.
            assert!(s < 1 << 35);
            assert_eq!(join(s as i64, n as i64), Some(Nanos::new(ns)));
        }
        assert_eq!(join(-1, 0), None);
        assert_eq!(join(0, 1_000_000_000), None);
        assert_eq!(join(0, -1), None);
        assert_eq!(join(i64::MAX, 0), None);
    }

    #[test]
    fn the_fast_path_answers_with_the_guessed_word() {
        let now = Nanos::new(1_700_000_000_123_456_789);
        let guessed = Nanos::new(1_700_000_000_000_000_000);
        let reply = parse(&Value::Int(1), Some(now), Some(guessed)).unwrap();
        assert!(reply.admitted);
        assert_eq!(reply.full_at, guessed);
        assert_eq!(reply.now, now);
        // An integer answer without a guess, or at Redis's clock, or other
        // than 1, is not one the script gives.
        for (answer, at, guess) in [
            (Value::Int(1), Some(now), None),
            (Value::Int(1), None, Some(guessed)),
            (Value::Int(0), Some(now), Some(guessed)),
        ] {
            assert!(parse(&answer, at, guess).is_err(), "{answer:?}");
        }
        // The general path's answer is read whether or not a guess was sent.
        let general = Value::Array(vec![
            Value::Int(0),
            Value::BulkString(b"1700000001000000000".to_vec()),
            Value::Int(1_700_000_000),
            Value::Int(123_456_789),
        ]);
        for guess in [None, Some(guessed)] {
            let reply = parse(&general, None, guess).unwrap();
            assert!(!reply.admitted);
            assert_eq!(reply.full_at, Nanos::new(1_700_000_001_000_000_000));
            assert_eq!(reply.now, now);
        }
        // The old two-item fast-path answer is no longer one.
        let two = Value::Array(vec![Value::Int(1), Value::BulkString(Vec::new())]);
        assert!(parse(&two, Some(now), Some(guessed)).is_err());
    }

    #[test]
    fn the_fast_path_at_redis_clock_answers_with_its_time() {
        let guessed = Nanos::new(1_700_000_001_000_000_000);
        let time = |secs: &str, micros: &str| {
            Value::Array(vec![
                Value::BulkString(secs.as_bytes().to_vec()),
                Value::BulkString(micros.as_bytes().to_vec()),
            ])
        };
        let reply = parse(&time("1700000000", "123456"), None, Some(guessed)).unwrap();
        assert!(reply.admitted);
        assert_eq!(reply.full_at, guessed);
        assert_eq!(reply.now, Nanos::new(1_700_000_000_123_456_000));
        // Only a call at Redis's clock that sent a guess gets this answer;
        // and TIME's microseconds are below a second.
        assert!(parse(&time("1700000000", "123456"), None, None).is_err());
        let now = Some(Nanos::new(1));
        assert!(parse(&time("1700000000", "123456"), now, Some(guessed)).is_err());
        assert!(parse(&time("1700000000", "1000000"), None, Some(guessed)).is_err());
        assert!(parse(&time("-1", "0"), None, Some(guessed)).is_err());
    }

    #[test]
    fn a_guess_at_redis_clock_adds_the_spend() {
        let spend = Nanos::new(2_500_000);
        let slack = Nanos::new(10_000_000_001);
        let expected = Nanos::new(1_000_000_000_000_001);
        let guess = Guess::at_server(expected, spend, slack, 0).unwrap();
        assert_eq!(guess.word, Nanos::new(1_000_000_002_500_001));
        // PXAT: the new word rounded up to the millisecond.
        assert_eq!(guess.expiry_ms, 1_000_000_003);
        let within = guess.server.unwrap();
        // Each bound is the exact one, on TIME's microseconds (now =
        // now_us * 1000 ns): admitted from expected - slack =
        // 999,990,000,000,000 ns; not full while now < expected.
        let at = |us: u64| Nanos::new(us * 1_000);
        assert_eq!(within.admitted_from_us, 999_990_000_000);
        assert!(at(within.admitted_from_us) + slack >= expected);
        assert!(at(within.admitted_from_us - 1) + slack < expected);
        assert_eq!(within.not_full_until_us, 1_000_000_000_000);
        assert!(at(within.not_full_until_us) < expected);
        assert!(at(within.not_full_until_us + 1) >= expected);
        // With no floor (1 ms at least): floor(now_us / 1000) + 1 <= 1e9 + 3.
        assert_eq!(within.expiry_until_us, Some(1_000_000_002_999));
        let floored = Guess::at_server(expected, spend, slack, 5_000).unwrap();
        assert_eq!(
            floored.server.unwrap().expiry_until_us,
            Some(999_995_003_999)
        );
        let never = Guess::at_server(expected, spend, slack, u64::MAX).unwrap();
        assert_eq!(never.server.unwrap().expiry_until_us, None);
        // A slack beyond the word: admitted at every instant.
        let early = Guess::at_server(expected, spend, Nanos::new(u64::MAX), 0).unwrap();
        assert_eq!(early.server.unwrap().admitted_from_us, 0);
        // A missing key's new word depends on the instant; no guess, nor
        // for a word that would overflow or an instant past a double's
        // exact range.
        assert!(Guess::at_server(Nanos::ZERO, spend, slack, 0).is_none());
        assert!(Guess::at_server(Nanos::new(u64::MAX - 1), spend, slack, 0).is_none());
        assert!(Guess::at_server(Nanos::new(1 << 63), spend, slack, 0).is_none());
    }

    #[test]
    fn words_are_plain_decimals() {
        assert_eq!(word(""), Some(Nanos::ZERO));
        assert_eq!(word("18446744073709551615"), Some(Nanos::new(u64::MAX)));
        for bad in [
            "18446744073709551616",
            "+1",
            "-1",
            " 1",
            "1e5",
            "0x10",
            "not a word",
        ] {
            assert_eq!(word(bad), None, "{bad}");
        }
    }
}

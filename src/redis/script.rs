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
        .arg(min_ttl_ms);
    if let Some(guess) = guess {
        match guess.expected {
            Nanos::ZERO => invocation.arg(""),
            word => invocation.arg(word.as_u64()),
        };
        invocation.arg(guess.word.as_u64()).arg(guess.ttl_ms);
    }
}

/// What the script writes, with no arithmetic, if the key holds `expected`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Guess {
    /// The word Rust expects the key to hold (0: no key).
    pub(super) expected: Nanos,
    /// `gcra::decide` on `expected`: the word to write.
    pub(super) word: Nanos,
    /// The key's TTL: the time from `now` until `word`, in whole
    /// milliseconds rounded up, at least the floor and at least 1 ms.
    pub(super) ttl_ms: u64,
}

impl Guess {
    pub(super) fn new(expected: Nanos, word: Nanos, now: Nanos, min_ttl_ms: u64) -> Self {
        let missing = word.saturating_sub(now).as_u64();
        let ttl_ms = missing.div_ceil(1_000_000).max(min_ttl_ms).max(1);
        Guess {
            expected,
            word,
            ttl_ms,
        }
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
    key: &str,
    answer: &Value,
    now: Option<Nanos>,
    guessed: Option<Nanos>,
) -> Result<Reply, RedisLimiterError> {
    let shape = || RedisLimiterError::reply("expected [admitted, word, secs, nanos]");
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
        (Value::Array(items), ..) => items,
        _ => return Err(shape()),
    };
    let [admitted, stored, secs, nanos] = &items[..] else {
        return Err(shape());
    };
    let admitted: i64 = ::redis::from_redis_value(admitted).map_err(|_| shape())?;
    let stored: String = ::redis::from_redis_value(stored).map_err(|_| shape())?;
    let full_at = word(&stored).ok_or_else(|| RedisLimiterError::foreign(key))?;
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
        let reply = parse("k", &Value::Int(1), Some(now), Some(guessed)).unwrap();
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
            assert!(parse("k", &answer, at, guess).is_err(), "{answer:?}");
        }
        // The general path's answer is read whether or not a guess was sent.
        let general = Value::Array(vec![
            Value::Int(0),
            Value::BulkString(b"1700000001000000000".to_vec()),
            Value::Int(1_700_000_000),
            Value::Int(123_456_789),
        ]);
        for guess in [None, Some(guessed)] {
            let reply = parse("k", &general, None, guess).unwrap();
            assert!(!reply.admitted);
            assert_eq!(reply.full_at, Nanos::new(1_700_000_001_000_000_000));
            assert_eq!(reply.now, now);
        }
        // The old two-item fast-path answer is no longer one.
        let two = Value::Array(vec![Value::Int(1), Value::BulkString(Vec::new())]);
        assert!(parse("k", &two, Some(now), Some(guessed)).is_err());
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

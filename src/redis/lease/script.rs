//! The lease scripts (`acquire.lua`, `renew.lua`): their arguments and
//! replies. A release needs no script: it is one `ZREM` of the key's
//! released ids, atomic as any command.
//!
//! Time: both scripts read Redis's `TIME` and work in whole milliseconds
//! of Unix time on that clock; Rust passes only durations (the lease time
//! in milliseconds), never an instant, so the processes sharing a limit
//! need not agree on the time.

use crate::redis::error::RedisLimiterError;
use ::redis::{Script, ScriptInvocation, Value};
use std::time::Duration;

/// The acquire script; Redis caches it by its SHA-1.
pub(super) const ACQUIRE_SCRIPT: &str = include_str!("acquire.lua");

/// The renew script.
pub(super) const RENEW_SCRIPT: &str = include_str!("renew.lua");

/// The most lease ids one renew call carries: a bound on the time one
/// script holds Redis (a set's ids go in one call, so a call may carry
/// more when one set alone holds more).
pub(super) const RENEW_BATCH: usize = 512;

/// The acquire script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Acquired {
    pub(super) admitted: bool,
    /// The leases the key holds after the call.
    pub(super) held: u32,
    /// Redis's clock when it decided, Unix milliseconds.
    pub(super) now_ms: u64,
    /// The new lease's expiry, Unix milliseconds (0 when refused).
    pub(super) expiry_ms: u64,
}

/// The acquire script's invocation: `max` leases of `lease_key` at most,
/// the new one `id`, for `lease_ms`.
pub(super) fn acquire<'a>(
    script: &'a Script,
    lease_key: &str,
    max: u32,
    lease_ms: u64,
    id: &str,
) -> ScriptInvocation<'a> {
    let mut invocation = script.key(lease_key);
    invocation.arg(max).arg(lease_ms).arg(id);
    invocation
}

/// The acquire script's reply, or why it is not one.
pub(super) fn parse_acquired(answer: &Value) -> Result<Acquired, RedisLimiterError> {
    let shape = || RedisLimiterError::reply("expected [admitted, held, now_ms, expiry_ms]");
    let Value::Array(items) = answer else {
        return Err(shape());
    };
    let [admitted, held, now, expiry] = &items[..] else {
        return Err(shape());
    };
    let int = |value: &Value| -> Result<u64, RedisLimiterError> {
        ::redis::from_redis_value::<u64>(value).map_err(|_| shape())
    };
    let admitted = match int(admitted)? {
        0 => false,
        1 => true,
        _ => return Err(shape()),
    };
    Ok(Acquired {
        admitted,
        held: u32::try_from(int(held)?).unwrap_or(u32::MAX),
        now_ms: int(now)?,
        expiry_ms: int(expiry)?,
    })
}

/// One renew call: lease sets and, for each, the ids to renew.
#[derive(Debug, Default)]
pub(super) struct RenewCall {
    pub(super) sets: Vec<(String, Vec<String>)>,
    /// The ids over all sets.
    pub(super) ids: usize,
}

impl RenewCall {
    /// The invocation renewing every lease of the call for `lease_ms`.
    pub(super) fn invocation<'a>(&self, script: &'a Script, lease_ms: u64) -> ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        invocation.arg(lease_ms);
        for (key, ids) in &self.sets {
            invocation.key(key).arg(ids.len());
            for id in ids {
                invocation.arg(id);
            }
        }
        invocation
    }

    /// The `(set, id)` at a 1-based `position` over the call's ids.
    pub(super) fn at(&self, position: usize) -> Option<(&str, &str)> {
        let mut rest = position.checked_sub(1)?;
        for (key, ids) in &self.sets {
            match ids.get(rest) {
                Some(id) => return Some((key, id)),
                None => rest -= ids.len(),
            }
        }
        None
    }
}

/// The renew script's reply: the positions of the lost leases.
pub(super) fn parse_renewed(answer: &Value) -> Result<Vec<usize>, RedisLimiterError> {
    let shape = || RedisLimiterError::reply("expected [now_ms, lost positions...]");
    let Value::Array(items) = answer else {
        return Err(shape());
    };
    if items.is_empty() {
        return Err(shape());
    }
    items[1..]
        .iter()
        .map(|item| ::redis::from_redis_value::<usize>(item).map_err(|_| shape()))
        .collect()
}

/// A lease time in whole milliseconds, at least 1.
pub(super) fn millis(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_bad_ones_are_errors() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(1_700_000_000_000),
            Value::Int(1_700_000_003_000),
        ]);
        assert_eq!(
            parse_acquired(&reply).unwrap(),
            Acquired {
                admitted: true,
                held: 2,
                now_ms: 1_700_000_000_000,
                expiry_ms: 1_700_000_003_000
            }
        );
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(2); 4]),
            Value::Array(vec![Value::Int(-1); 4]),
        ] {
            assert!(parse_acquired(&bad).is_err(), "{bad:?}");
        }
        let renewed = Value::Array(vec![Value::Int(5), Value::Int(2), Value::Int(3)]);
        assert_eq!(parse_renewed(&renewed).unwrap(), vec![2, 3]);
        assert!(parse_renewed(&Value::Array(vec![])).is_err());
    }

    #[test]
    fn positions_name_the_leases_in_order() {
        let call = RenewCall {
            sets: vec![
                ("a".into(), vec!["1".into(), "2".into()]),
                ("b".into(), vec!["3".into()]),
            ],
            ids: 3,
        };
        assert_eq!(call.at(0), None);
        assert_eq!(call.at(1), Some(("a", "1")));
        assert_eq!(call.at(2), Some(("a", "2")));
        assert_eq!(call.at(3), Some(("b", "3")));
        assert_eq!(call.at(4), None);
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_secs(3)), 3000);
    }
}

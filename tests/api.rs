//! The public contract: it compiles as written and behaves as documented.
#![cfg(not(loom))]

use keyrate::{BucketHandle, ConfigError, Denial, Offenders, Quota, Stats, TokenBucketLimiter};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn the_contract_compiles_and_holds() {
    let limiter = TokenBucketLimiter::new(1.0, 3);
    assert!(limiter.allow("key1", 0.0));
    assert!(limiter.allow("key1", 0.0));
    assert!(limiter.allow("key1", 0.0));
    assert!(!limiter.allow("key1", 0.0));
    assert!(limiter.allow("key1", 2.0));
    assert!(!limiter.allow_n("key1", 2.0, 2));
    let err = TokenBucketLimiter::try_new(f64::NAN, 3);
    assert!(matches!(err, Err(ConfigError::RateNotPositive { .. })));
}

#[test]
fn types_are_send_sync_and_shared_with_arc() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TokenBucketLimiter>();
    assert_send_sync::<TokenBucketLimiter<u64>>();
    assert_send_sync::<BucketHandle>();
    assert_send_sync::<ConfigError>();
    assert_send_sync::<Denial>();
    assert_send_sync::<Quota>();
    assert_send_sync::<Stats>();
    assert_send_sync::<Offenders<String>>();

    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || limiter.allow("shared", 0.0))
        })
        .collect();
    let admitted = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|&ok| ok)
        .count();
    assert_eq!(admitted, 4);
    assert!(!limiter.allow("shared", 0.0));
}

#[test]
fn errors_are_std_errors_with_useful_messages() {
    fn as_error(e: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
        e.to_string()
    }
    let cases = [
        (
            TokenBucketLimiter::try_new(f64::NAN, 3),
            "greater than zero",
        ),
        (TokenBucketLimiter::try_new(-1.0, 3), "greater than zero"),
        (TokenBucketLimiter::try_new(f64::INFINITY, 3), "finite"),
        (TokenBucketLimiter::try_new(2e9, 3), "1e9"),
        (TokenBucketLimiter::try_new(1.0, 0), "at least 1"),
        (TokenBucketLimiter::try_new(1e-3, u64::MAX / 2), "292 years"),
    ];
    for (result, needle) in cases {
        let err = result.unwrap_err();
        let message = as_error(&err);
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }
    let denial = Denial::InsufficientTokens {
        retry_after: Duration::from_millis(250),
    };
    assert!(as_error(&denial).contains("250ms"));
    assert!(as_error(&Denial::InvalidTimestamp).contains("timestamp"));
}

#[test]
#[should_panic(expected = "invalid capacity 0")]
fn new_panics_with_the_config_error_message() {
    let _ = TokenBucketLimiter::new(1.0, 0);
}

#[test]
fn other_key_types() {
    let limiter = TokenBucketLimiter::<u64>::with_quota(Quota::new(2.0, 2).unwrap());
    assert!(limiter.allow(&7, 0.0));
    assert!(limiter.allow(&7, 0.0));
    assert!(!limiter.allow(&7, 0.0));
    assert!(limiter.allow(&8, 0.0));
    assert!(limiter.allow(&7, 0.5));
    assert_eq!(limiter.len(), 2);

    // Tuple keys: (tenant, route).
    let limiter =
        TokenBucketLimiter::<(u32, &'static str)>::with_quota(Quota::new(1.0, 1).unwrap());
    assert!(limiter.allow(&(1, "/tts"), 0.0));
    assert!(limiter.allow(&(1, "/stt"), 0.0));
    assert!(!limiter.allow(&(1, "/tts"), 0.0));
}

#[test]
fn check_reports_remaining_and_exact_waits() {
    let limiter = TokenBucketLimiter::new(4.0, 10);
    assert_eq!(limiter.check("k", 0.0, 7).map(|d| d.remaining()), Ok(3));
    assert_eq!(
        limiter.check("k", 0.0, 5),
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_millis(500)
        })
    );
    assert_eq!(limiter.check("k", 0.5, 5).map(|d| d.remaining()), Ok(0));
    assert_eq!(limiter.remaining("k", 0.5), Ok(0));
    assert_eq!(limiter.remaining("k", 0.75), Ok(1));
    assert_eq!(limiter.remaining("never-seen", 0.75), Ok(10));
    assert_eq!(limiter.len(), 1, "remaining() creates no bucket");
    assert_eq!(
        limiter.check("k", 0.75, 11),
        Err(Denial::ExceedsCapacity {
            cost: 11,
            capacity: 10
        })
    );
}

#[test]
fn handles_share_the_keyed_bucket() {
    let limiter = TokenBucketLimiter::new(1.0, 3);
    assert!(limiter.allow("k", 0.0));
    let handle = limiter.bucket("k");
    let clone = handle.clone();
    assert_eq!(handle.remaining(0.0), Ok(2));
    assert!(clone.allow(0.0));
    assert!(limiter.allow("k", 0.0));
    assert!(!handle.allow(0.0));
    assert!(!limiter.allow("k", 0.0));
    // A live handle keeps its bucket through sweeps, and spends survive.
    assert_eq!(limiter.sweep(100.0), 0);
    assert!(handle.allow_n(100.0, 3));
    assert!(!limiter.allow("k", 100.0));
    drop((handle, clone));
    assert_eq!(limiter.sweep(103.0), 1);
    assert!(limiter.is_empty());
}

#[test]
fn quota_accessors() {
    let limiter = TokenBucketLimiter::new(0.5, 4);
    assert_eq!(limiter.quota().capacity(), 4);
    assert_eq!(limiter.quota().rate(), 0.5);
    assert_eq!(limiter.quota().refill_time(), Duration::from_secs(8));
    let debug = format!("{limiter:?}");
    assert!(debug.contains("TokenBucketLimiter") && debug.contains("buckets: 0"));
}

//! Model 7: the default quota replaced while another thread reads it.
//!
//! `set_quota` stores four words under a sequence lock, and every keyed call
//! reads them with `quota()`'s optimistic read. In every interleaving, the
//! read returns the old quota or the new one, whole: never some words of
//! one and some of the other (a torn quota could have a window that
//! matches no interval).
//!
//! A keyed call reads the initial quota in place while no store has begun:
//! its decision is the old quota's or the new one's, and a call after a
//! store decides under the new quota.

use crate::support::model;
use keyrate::{Quota, TokenBucketLimiter};
use loom::sync::Arc;
use loom::thread;

#[test]
fn a_quota_is_read_whole_while_it_is_replaced() {
    model("a_quota_is_read_whole_while_it_is_replaced", || {
        let first = Quota::new(1.0, 3).unwrap();
        let second = Quota::new(1000.0, 70).unwrap();
        let limiter: Arc<TokenBucketLimiter> = Arc::new(TokenBucketLimiter::with_quota(first));
        let writer = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.set_quota(second))
        };
        let read = limiter.quota();
        assert!(read == first || read == second, "a torn quota: {read:?}");
        writer.join().unwrap();
        assert_eq!(limiter.quota(), second);
    });
}

/// The real sequence lock with the read's `Acquire` fence left out
/// (`Flaw::QuotaReadWithoutFence`): the read may see some words of the new
/// quota and still find the old, even version afterwards.
#[test]
#[should_panic(expected = "a torn quota")]
fn broken_read_without_fence_tears_the_quota() {
    keyrate::loom_api::with_flaw(keyrate::loom_api::Flaw::QuotaReadWithoutFence, || {
        model("7 broken: quota read without its fence", || {
            let first = Quota::new(1.0, 3).unwrap();
            let second = Quota::new(1000.0, 70).unwrap();
            let limiter: Arc<TokenBucketLimiter> = Arc::new(TokenBucketLimiter::with_quota(first));
            let writer = {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || limiter.set_quota(second))
            };
            let read = limiter.quota();
            assert!(read == first || read == second, "a torn quota: {read:?}");
            writer.join().unwrap();
        });
    });
}

/// A keyed call reads the initial quota in place until a store begins
/// (`LiveQuota::current`): racing a store, its decision is the old
/// quota's or the new one's, and a call made after the store (here, after
/// joining the writer) decides under the new quota. Cost 5 exceeds the
/// first quota's capacity (3) and fits the second's (70).
#[test]
fn a_keyed_call_decides_under_the_initial_quota_or_the_stored_one() {
    model(
        "a_keyed_call_decides_under_the_initial_quota_or_the_stored_one",
        || {
            let first = Quota::new(1.0, 3).unwrap();
            let second = Quota::new(1000.0, 70).unwrap();
            let limiter: Arc<TokenBucketLimiter> = Arc::new(TokenBucketLimiter::with_quota(first));
            let writer = {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || limiter.set_quota(second))
            };
            // Either quota may decide this one: both answers are whole.
            let _ = limiter.allow_n("racing", 0.0, 5);
            writer.join().unwrap();
            assert!(
                limiter.allow_n("after", 0.0, 5),
                "a call after the store decided under the old quota"
            );
        },
    );
}

/// The same with the keyed call reading the initial quota whatever the
/// version says (`Flaw::QuotaInitialAlways`): the call after the store
/// still decides under the old quota.
#[test]
#[should_panic(expected = "decided under the old quota")]
fn broken_initial_quota_read_ignores_a_store() {
    keyrate::loom_api::with_flaw(keyrate::loom_api::Flaw::QuotaInitialAlways, || {
        model(
            "7 broken: the initial quota read whatever the version",
            || {
                let first = Quota::new(1.0, 3).unwrap();
                let second = Quota::new(1000.0, 70).unwrap();
                let limiter: Arc<TokenBucketLimiter> =
                    Arc::new(TokenBucketLimiter::with_quota(first));
                let writer = {
                    let limiter = Arc::clone(&limiter);
                    thread::spawn(move || limiter.set_quota(second))
                };
                let _ = limiter.allow_n("racing", 0.0, 5);
                writer.join().unwrap();
                assert!(
                    limiter.allow_n("after", 0.0, 5),
                    "a call after the store decided under the old quota"
                );
            },
        );
    });
}

//! Model 7: the default quota replaced while another thread reads it.
//!
//! `set_quota` stores four words under a sequence lock, and every keyed call
//! reads them with `quota()`'s optimistic read. In every interleaving, the
//! read returns the old quota or the new one, whole: never some words of
//! one and some of the other (a torn quota could have a window that
//! matches no interval).

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

//! `BucketHandle`: one key's bucket held by a long-lived caller; its calls are
//! in `calls`.

use crate::bucket::{Bucket, SpendError};
use crate::error::Denial;
use crate::gcra::Quota;
use crate::live_quota::LiveQuota;
use crate::observe::HandleTally;
use crate::sync::Arc;
use crate::time::{Clock, Nanos};

/// One key's bucket, held by a long-lived caller such as a connection.
///
/// Made by [`TokenBucketLimiter::bucket`](crate::TokenBucketLimiter::bucket).
/// Cloning a handle shares the same bucket.
#[derive(Debug, Clone)]
pub struct BucketHandle {
    /// The limiter's default quota, shared so that `set_quota` reaches
    /// handles too.
    pub(super) quota: std::sync::Arc<LiveQuota>,
    pub(super) bucket: Arc<Bucket>,
    /// Keeps the bucket from being evicted while any handle on it lives
    /// (see `Moved::pin`).
    pub(super) _pin: Arc<()>,
    /// The limiter's clock, for calls at [`Now`](crate::Now).
    pub(super) clock: std::sync::Arc<dyn Clock>,
    /// The limiter's stats and offender sketches, with this key.
    pub(super) tally: HandleTally,
}

impl BucketHandle {
    /// Spends `cost` at `now` (validated nanoseconds) on the bucket, under
    /// `quota`.
    pub(super) fn charge(&self, now: Nanos, cost: u64, quota: &Quota) -> Result<Nanos, Denial> {
        // `None` would be a retired or moved bucket, which a handle never
        // holds: eviction never retires a bucket that a live handle pins
        // (see `sweep`), and a moved bucket never moves again. Were it to
        // happen, the handle's bucket is gone: fail closed, and say so.
        SpendError::decision(self.bucket.spend(now, cost, quota)).unwrap_or_else(|| {
            debug_assert!(false, "a handle's pinned bucket was retired");
            Err(Denial::Unavailable)
        })
    }

    /// The bucket's word.
    pub(super) fn word(&self) -> u64 {
        self.bucket.word()
    }
}

//! `BucketHandle`: one key's bucket held by a long-lived caller, and how
//! the limiter makes one; its calls are in `calls`.

use super::life::Moved;
use super::TokenBucketLimiter;
use crate::bucket::{Bucket, SpendError};
use crate::error::Denial;
use crate::gcra::Quota;
use crate::live_quota::LiveQuota;
use crate::observe::HandleTally;
use crate::sync::Arc;
use crate::time::{Clock, Nanos};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// One key's bucket, held by a long-lived caller such as a connection.
///
/// Made by [`TokenBucketLimiter::try_bucket`](crate::TokenBucketLimiter::try_bucket)
/// or [`TokenBucketLimiter::bucket`](crate::TokenBucketLimiter::bucket).
/// Cloning a handle shares the same bucket. Its `Debug` shows no key.
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
    /// Set on a handle that `bucket` made at the cap: it holds no bucket
    /// of the limiter's, and refuses every call with this denial.
    refusal: Option<Denial>,
}

impl BucketHandle {
    /// Spends `cost` at `now` (validated nanoseconds) on the bucket, under
    /// `quota`.
    pub(super) fn charge(&self, now: Nanos, cost: u64, quota: &Quota) -> Result<Nanos, Denial> {
        if let Some(refusal) = self.refusal {
            return Err(refusal);
        }
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

/// # Handles: one key's bucket, with no lookup per call
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// A handle on `key`'s bucket that spends with no map lookup, for a
    /// connection that resolves its API key once and then spends on every
    /// message; or, when the key has no bucket and the limiter holds its
    /// maximum ([`with_max_buckets`](Self::with_max_buckets)), the
    /// refusal.
    ///
    /// The handle shares the bucket with keyed calls on the same key. A
    /// bucket with a live handle is never evicted, so the handle stays
    /// valid however long it lives; once every handle is dropped, the bucket
    /// is evicted like any other. A handle's bucket counts toward the cap
    /// like any other.
    ///
    /// # Errors
    ///
    /// [`Denial::LimiterFull`] when `key` has no bucket and the limiter
    /// holds its maximum number of buckets (nothing is created, and no
    /// sweep runs: keyed calls for new keys sweep at their timestamps).
    ///
    /// # Locking behaviour
    ///
    /// Takes the shard's write lock once; the handle's own calls take no
    /// lock at all.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Denial, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 2).with_max_buckets(1);
    /// let handle = limiter.try_bucket("sk_live_abc")?;
    /// assert!(handle.allow(0.0));
    /// assert!(limiter.allow("sk_live_abc", 0.0));
    /// assert!(!handle.allow(0.0));
    /// // The cap holds one bucket: another key's handle is refused.
    /// assert_eq!(limiter.try_bucket("sk_live_def").unwrap_err(), Denial::LimiterFull { max_buckets: 1 });
    /// assert_eq!(limiter.len(), 1);
    /// # Ok::<(), Denial>(())
    /// ```
    pub fn try_bucket<Q>(&self, key: &Q) -> Result<BucketHandle, Denial>
    where
        // A handle records its denials under a copy of its key.
        K: Borrow<Q> + Clone + Send + Sync,
        S: Send + Sync + 'static,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let occupancy = &self.occupancy;
        // The place under the cap is reserved under the shard's write lock,
        // only when the key is absent (as for a keyed call's new bucket).
        let init = || {
            occupancy
                .reserve()
                .then(|| self.observer.created(self.start_word()))
        };
        let moved = self.buckets.try_write(
            self.buckets.hash(key),
            key,
            init,
            |bucket| self.move_to_arc(key, bucket),
            || self.creation_undone(),
        );
        let Some(Moved { bucket, pin }) = moved else {
            return Err(Denial::LimiterFull {
                max_buckets: occupancy.max_buckets,
            });
        };
        Ok(self.handle(bucket, pin, None, key))
    }

    /// A handle on `key`'s bucket, as [`try_bucket`](Self::try_bucket);
    /// when that is refused (the key has no bucket and the limiter holds
    /// its maximum), a handle that refuses every call with
    /// [`Denial::LimiterFull`] (fail closed, as a keyed call for a new key
    /// at the cap is), and never gets a bucket: make it again later, or
    /// call `try_bucket` to learn of the refusal at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Denial, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 2).with_max_buckets(1);
    /// let handle = limiter.bucket("sk_live_abc");
    /// assert!(handle.allow(0.0));
    /// assert!(limiter.allow("sk_live_abc", 0.0));
    /// assert!(!handle.allow(0.0));
    /// let refused = limiter.bucket("sk_live_def"); // at the cap
    /// assert_eq!(refused.check(0.0, 1).unwrap_err(), Denial::LimiterFull { max_buckets: 1 });
    /// assert_eq!(limiter.len(), 1);
    /// ```
    #[must_use]
    pub fn bucket<Q>(&self, key: &Q) -> BucketHandle
    where
        K: Borrow<Q> + Clone + Send + Sync,
        S: Send + Sync + 'static,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_bucket(key).unwrap_or_else(|refusal| {
            // A bucket of its own, in no map: never spent, never evicted.
            let detached = Arc::new(Bucket::new());
            self.handle(detached, Arc::new(()), Some(refusal), key)
        })
    }

    fn handle<Q>(
        &self,
        bucket: Arc<Bucket>,
        pin: Arc<()>,
        refusal: Option<Denial>,
        key: &Q,
    ) -> BucketHandle
    where
        K: Borrow<Q> + Clone + Send + Sync,
        S: Send + Sync + 'static,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        BucketHandle {
            quota: std::sync::Arc::clone(&self.quota),
            bucket,
            _pin: pin,
            clock: std::sync::Arc::clone(&self.clock),
            tally: self.observer.for_handle(key.to_owned()),
            refusal,
        }
    }
}

//! Plans: a quota chosen per call ([`Under`](crate::Under)), and the limiter's default
//! quota, which [`set_quota`](TokenBucketLimiter::set_quota) changes while
//! other threads spend.
//!
//! # What a bucket holds when its quota changes
//!
//! A bucket's word is `full_at`, the instant it is full again; it does not
//! record the quota it was spent under (that would cost bytes per key). A
//! call under any quota reads the same word: the **time until full is
//! kept**, and the quota in force turns it into tokens. A bucket lacking
//! `d` ns of refill holds `capacity - d / interval` tokens under a quota, so
//! after a change it holds at most the new capacity, refills at the new
//! rate, and over any span after the change admits at most
//! `new capacity + new rate * span`: from the change on it is exactly a
//! bucket of the new quota. A full bucket (`full_at <= now`) is full under
//! every quota, so eviction stays exact with mixed quotas, and Redis keeps
//! the same rule with the same word (its TTL is the time until full).

use super::{BucketHandle, TokenBucketLimiter};
use crate::bucket::{Bucket, SpendError};
use crate::decision::Decision;
use crate::error::Denial;
use crate::gcra::Quota;
use crate::limiter::Limiter;
use crate::time::At;
use crate::under::Under;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// # Changing the default quota
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Replaces the default quota, for every later call that does not name
    /// its own (keyed calls, handles, waits), while other threads spend.
    /// Buckets are kept: each keeps its time until full, which the new
    /// quota turns into tokens (see [`Under`]'s rule). Spending calls take
    /// no lock to read the quota.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 4);
    /// assert!(limiter.allow_n("k", 0.0, 2)); // 2 s of refill missing
    /// // An incident: halve everyone's rate and burst.
    /// limiter.set_quota(Quota::new(0.5, 2).unwrap());
    /// assert_eq!(limiter.remaining("k", 0.0), Ok(1)); // 2 s = 1 token at 0.5/s
    /// assert_eq!(limiter.remaining("k", 2.0), Ok(2)); // full at 2 s, as before
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.quota.store(quota);
    }
}

/// # A handle's calls under a chosen quota
impl BucketHandle {
    /// The calls of this handle under `quota` instead of the limiter's
    /// default one.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let handle = limiter.bucket("sk_pro_1");
    /// let pro = Quota::new(20.0, 100).unwrap();
    /// assert!(handle.under(&pro).allow_n(0.0, 100));
    /// assert_eq!(handle.under(&pro).remaining(0.0), Ok(0));
    /// ```
    ///
    /// The view is also a [`Limiter<()>`](crate::Limiter), for code
    /// written over any limiter (`limiter.allow(&(), at)`).
    #[must_use]
    pub fn under(&self, quota: &Quota) -> Under<'_, Self> {
        Under::new(self, *quota)
    }
}

/// # A handle's view under a quota: the calls without the key
///
/// As on the handle itself, the key (`()`) is left out; the [`Limiter`]
/// calls stay available through the trait.
impl Under<'_, BucketHandle> {
    /// [`Limiter::allow`] on the handle's bucket under this quota.
    #[must_use]
    #[inline(always)]
    pub fn allow(&self, at: impl Into<At>) -> bool {
        Limiter::allow(self, &(), at)
    }

    /// [`Limiter::allow_n`] on the handle's bucket under this quota.
    #[must_use]
    #[inline(always)]
    pub fn allow_n(&self, at: impl Into<At>, cost: u64) -> bool {
        Limiter::allow_n(self, &(), at, cost)
    }

    /// [`Limiter::check`] on the handle's bucket under this quota.
    ///
    /// # Errors
    ///
    /// The [`Denial`]s listed on [`Limiter::check`].
    #[inline(always)]
    pub fn check(&self, at: impl Into<At>, cost: u64) -> Result<Decision, Denial> {
        Limiter::check(self, &(), at, cost)
    }

    /// [`Limiter::remaining`] on the handle's bucket under this quota.
    ///
    /// # Errors
    ///
    /// [`Denial::InvalidTimestamp`] for an instant out of range.
    pub fn remaining(&self, at: impl Into<At>) -> Result<u64, Denial> {
        Limiter::remaining(self, &(), at)
    }
}

/// # Undoing a lock-out: resets
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Refills `key`'s bucket: the next calls see it full, as if the key
    /// had never been seen, whatever quota and spends came before. Returns
    /// whether the key had a bucket.
    ///
    /// The operator's undo of a lock-out: a quota set by mistake leaves
    /// active keys' buckets empty for as long as that quota takes to
    /// refill them, and reverting the quota does not help (a bucket keeps
    /// its time until full). Handles and the threads that cache the key
    /// see the reset at once (they share the bucket). A spend racing the
    /// reset either comes first (and is erased with the rest) or sees the
    /// full bucket; none is lost half-way.
    ///
    /// # Locking behaviour
    ///
    /// Takes the key's shard's write lock (and the side map's, for a key
    /// with a handle or a hot-key cache entry), as a keyed call does.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// limiter.set_quota(Quota::new(1e-9, 3).unwrap()); // a mistake: 32 years a token
    /// assert!(limiter.allow_n("k", 0.0, 3));
    /// limiter.set_quota(Quota::new(1.0, 3).unwrap()); // reverted...
    /// assert_eq!(limiter.remaining("k", 1e6), Ok(0)); // ...still empty
    /// assert!(limiter.reset("k"));
    /// assert_eq!(limiter.remaining("k", 0.0), Ok(3));
    /// assert!(!limiter.reset("never-seen"));
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.buckets.hash(key);
        self.buckets
            .update(hash, key, |bucket| self.reset_entry(key, bucket))
            .is_some()
    }

    /// Refills every bucket (see [`reset`](Self::reset)); returns how many
    /// buckets there were. Calls that run meanwhile are decided before or
    /// after their key's reset.
    ///
    /// # Locking behaviour
    ///
    /// Takes each shard's write lock in turn, as [`sweep`](Self::sweep)
    /// does.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let handle = limiter.bucket("a");
    /// assert!(handle.allow(0.0));
    /// assert!(limiter.allow("b", 0.0));
    /// assert_eq!(limiter.reset_all(), 2);
    /// assert!(handle.allow(0.0));
    /// assert!(limiter.allow("b", 0.0));
    /// ```
    pub fn reset_all(&self) -> usize {
        // Keys without a bucket start full again too (see `Pace::restart`):
        // forgotten before the buckets are reset, and again after, in case
        // a sweep step removed a bucket meanwhile.
        self.occupancy.pace.forget_removed();
        let mut buckets = 0;
        self.buckets.retain(|key, bucket| {
            self.reset_entry(key, bucket);
            buckets += 1;
            true
        });
        self.occupancy.pace.forget_removed();
        buckets
    }

    /// Resets the bucket of `key`'s entry, held under its shard's write
    /// lock, or the moved bucket the entry stands for (in the lock order of
    /// `life`). Under that lock no sweep can retire the moved
    /// bucket, and a map entry is never retired in place.
    fn reset_entry<Q>(&self, key: &Q, bucket: &Bucket)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Err(SpendError::Moved) = bucket.reset() {
            let reset = self.moved.read(key, |moved| moved.bucket.reset());
            debug_assert!(
                matches!(reset, Some(Ok(()))),
                "a MOVED entry without its bucket"
            );
        }
    }
}

/// # Undoing a lock-out on a handle's bucket
impl BucketHandle {
    /// Refills this handle's bucket, as
    /// [`TokenBucketLimiter::reset`] does for its key.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 2).bucket("k");
    /// assert!(handle.allow_n(0.0, 2));
    /// handle.reset();
    /// assert_eq!(handle.remaining(0.0), Ok(2));
    /// ```
    pub fn reset(&self) {
        // A handle's bucket is pinned, so never retired, and moves no more.
        let reset = self.bucket.reset();
        debug_assert!(reset.is_ok(), "a handle's bucket was retired");
    }
}

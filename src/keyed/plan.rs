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
use crate::gcra::Quota;
use crate::under::Under;
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
    /// use keyrate::{Limiter, Quota, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let handle = limiter.bucket("sk_pro_1");
    /// let pro = Quota::new(20.0, 100).unwrap();
    /// assert!(handle.under(&pro).allow_n(&(), 0.0, 100));
    /// ```
    #[must_use]
    pub fn under(&self, quota: &Quota) -> Under<'_, Self> {
        Under::new(self, *quota)
    }
}

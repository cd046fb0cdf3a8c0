//! Plans: a quota chosen per call ([`Under`]), and the limiter's default
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

use super::calls::{allow_at, check_at, clock_nanos, remaining_at};
use super::{BucketHandle, TokenBucketLimiter};
use crate::error::Denial;
use crate::gcra::Quota;
use crate::time::nanos_from_secs as secs;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// A limiter or a [`BucketHandle`] under a quota of the caller's choice:
/// the same calls as on the limiter or the handle, spending from the same
/// buckets, with this quota instead of the default one.
///
/// Made by [`TokenBucketLimiter::under`] and [`BucketHandle::under`]. Costs
/// nothing to make (a reference and a copy of the quota); make one per call
/// or keep one per plan.
///
/// # When a key's quota changes
///
/// A bucket records no quota: its word is the instant it is full again. A
/// call under any quota reads that word, so the **time until full is
/// kept** and the quota in force turns it into tokens: after a change the
/// bucket holds at most the new capacity and admits, over any span, at most
/// `new capacity + new rate * span`. A full bucket is full under every
/// quota, so eviction is unchanged. Redis keeps the same rule.
///
/// # Examples
///
/// ```
/// use keyrate::{Quota, TokenBucketLimiter};
///
/// let free = Quota::new(1.0, 5).unwrap();
/// let pro = Quota::new(20.0, 100).unwrap();
/// let limiter = TokenBucketLimiter::with_quota(free);
/// assert_eq!((0..10).filter(|_| limiter.allow("sk_free_1", 0.0)).count(), 5);
/// let under_pro = limiter.under(&pro);
/// assert_eq!((0..200).filter(|_| under_pro.allow("sk_pro_1", 0.0)).count(), 100);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Under<'a, T> {
    target: &'a T,
    quota: Quota,
}

impl<'a, T> Under<'a, T> {
    /// `target`'s calls under `quota`.
    pub(crate) fn new(target: &'a T, quota: Quota) -> Self {
        Under { target, quota }
    }

    /// What the calls go to, and under which quota.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn parts(&self) -> (&'a T, &Quota) {
        (self.target, &self.quota)
    }
}

/// # Making an `Under`, and changing the default quota
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// The calls of this limiter under `quota` instead of the default one.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let burst_of_3 = Quota::new(1.0, 3).unwrap();
    /// assert_eq!(limiter.under(&burst_of_3).check("k", 0.0, 3), Ok(0));
    /// ```
    #[must_use]
    pub fn under(&self, quota: &Quota) -> Under<'_, Self> {
        Under::new(self, *quota)
    }

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
    /// assert_eq!(limiter.remaining("k", 0.0), Some(1)); // 2 s = 1 token at 0.5/s
    /// assert_eq!(limiter.remaining("k", 2.0), Some(2)); // full at 2 s, as before
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.quota.store(quota);
    }
}

/// # Keyed calls under a chosen quota
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> Under<'_, TokenBucketLimiter<K, S>> {
    /// The quota these calls use.
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// [`TokenBucketLimiter::allow`] under this quota.
    #[must_use]
    pub fn allow<Q>(&self, key: &Q, timestamp: f64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.allow_n(key, timestamp, 1)
    }

    /// [`TokenBucketLimiter::allow_n`] under this quota.
    #[must_use]
    pub fn allow_n<Q>(&self, key: &Q, timestamp: f64, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let quota = &self.quota;
        allow_at(
            secs(timestamp),
            |now| self.target.charge(key, now, cost, quota),
            |now, decided| self.target.observer.decided(key, now, cost, decided),
        )
    }

    /// [`TokenBucketLimiter::check`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::check`], with this quota's capacity.
    pub fn check<Q>(&self, key: &Q, timestamp: f64, cost: u64) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let quota = &self.quota;
        check_at(
            secs(timestamp),
            quota,
            |now| self.target.charge(key, now, cost, quota),
            |now, decided| self.target.observer.decided(key, now, cost, decided),
        )
    }

    /// [`TokenBucketLimiter::remaining`] under this quota.
    #[must_use]
    pub fn remaining<Q>(&self, key: &Q, timestamp: f64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        remaining_at(secs(timestamp), &self.quota, || self.target.word(key))
    }

    /// [`TokenBucketLimiter::allow_now`] under this quota.
    #[must_use]
    pub fn allow_now<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.allow_n_now(key, 1)
    }

    /// [`TokenBucketLimiter::allow_n_now`] under this quota.
    #[must_use]
    pub fn allow_n_now<Q>(&self, key: &Q, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let quota = &self.quota;
        allow_at(
            clock_nanos(&*self.target.clock),
            |now| self.target.charge(key, now, cost, quota),
            |now, decided| self.target.observer.decided(key, now, cost, decided),
        )
    }

    /// [`TokenBucketLimiter::check_now`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::check_now`], with this quota's capacity.
    pub fn check_now<Q>(&self, key: &Q, cost: u64) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let quota = &self.quota;
        check_at(
            clock_nanos(&*self.target.clock),
            quota,
            |now| self.target.charge(key, now, cost, quota),
            |now, decided| self.target.observer.decided(key, now, cost, decided),
        )
    }

    /// [`TokenBucketLimiter::remaining_now`] under this quota.
    #[must_use]
    pub fn remaining_now<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        remaining_at(clock_nanos(&*self.target.clock), &self.quota, || {
            self.target.word(key)
        })
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
    /// assert_eq!(handle.under(&pro).check(0.0, 100), Ok(0));
    /// ```
    #[must_use]
    pub fn under(&self, quota: &Quota) -> Under<'_, Self> {
        Under::new(self, *quota)
    }
}

/// # Handle calls under a chosen quota
impl Under<'_, BucketHandle> {
    /// The quota these calls use.
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// [`BucketHandle::allow`] under this quota.
    #[must_use]
    pub fn allow(&self, timestamp: f64) -> bool {
        self.allow_n(timestamp, 1)
    }

    /// [`BucketHandle::allow_n`] under this quota.
    #[must_use]
    pub fn allow_n(&self, timestamp: f64, cost: u64) -> bool {
        allow_at(
            secs(timestamp),
            |now| self.target.charge(now, cost, &self.quota),
            |now, decided| self.target.tally.decided(now, cost, decided),
        )
    }

    /// [`BucketHandle::check`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`BucketHandle::check`], with this quota's capacity.
    pub fn check(&self, timestamp: f64, cost: u64) -> Result<u64, Denial> {
        check_at(
            secs(timestamp),
            &self.quota,
            |now| self.target.charge(now, cost, &self.quota),
            |now, decided| self.target.tally.decided(now, cost, decided),
        )
    }

    /// [`BucketHandle::remaining`] under this quota.
    #[must_use]
    pub fn remaining(&self, timestamp: f64) -> Option<u64> {
        remaining_at(secs(timestamp), &self.quota, || self.target.word())
    }

    /// [`BucketHandle::allow_now`] under this quota.
    #[must_use]
    pub fn allow_now(&self) -> bool {
        self.allow_n_now(1)
    }

    /// [`BucketHandle::allow_n_now`] under this quota.
    #[must_use]
    pub fn allow_n_now(&self, cost: u64) -> bool {
        allow_at(
            clock_nanos(&*self.target.clock),
            |now| self.target.charge(now, cost, &self.quota),
            |now, decided| self.target.tally.decided(now, cost, decided),
        )
    }

    /// [`BucketHandle::check_now`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`BucketHandle::check_now`], with this quota's capacity.
    pub fn check_now(&self, cost: u64) -> Result<u64, Denial> {
        check_at(
            clock_nanos(&*self.target.clock),
            &self.quota,
            |now| self.target.charge(now, cost, &self.quota),
            |now, decided| self.target.tally.decided(now, cost, decided),
        )
    }

    /// [`BucketHandle::remaining_now`] under this quota.
    #[must_use]
    pub fn remaining_now(&self) -> Option<u64> {
        remaining_at(clock_nanos(&*self.target.clock), &self.quota, || {
            self.target.word()
        })
    }
}

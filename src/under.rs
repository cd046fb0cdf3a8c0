//! [`Under`]: any limiter's calls under a quota of the caller's choice,
//! written once for every backend.

use crate::decision::Decision;
use crate::gcra::Quota;
use crate::limiter::{AsyncLimiter, Limiter};
use crate::time::At;
use std::future::Future;

/// A limiter under a quota of the caller's choice: the same calls, on
/// the same buckets, with this quota instead of the default one.
///
/// Made by each backend's `under(&quota)` (for example
/// [`TokenBucketLimiter::under`](crate::TokenBucketLimiter::under)), or by
/// [`Under::new`] over any limiter.
/// Costs nothing to make (a reference and a copy of the quota); make one
/// per call or keep one per plan.
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
/// use keyrate::{Limiter, Quota, TokenBucketLimiter};
///
/// let free = Quota::new(1.0, 5).unwrap();
/// let pro = Quota::new(20.0, 100).unwrap();
/// let limiter = TokenBucketLimiter::with_quota(free);
/// assert_eq!((0..10).filter(|_| limiter.allow("sk_free_1", 0.0)).count(), 5);
/// let under_pro = limiter.under(&pro);
/// assert_eq!((0..200).filter(|_| under_pro.allow("sk_pro_1", 0.0)).count(), 100);
/// ```
#[derive(Debug)]
pub struct Under<'a, L> {
    target: &'a L,
    quota: Quota,
}

impl<L> Clone for Under<'_, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L> Copy for Under<'_, L> {}

impl<'a, L> Under<'a, L> {
    /// `target`'s calls under `quota`: what each backend's `under` makes,
    /// for code generic over [`Limiter`] or [`AsyncLimiter`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Limiter, Quota, TokenBucketLimiter, Under};
    ///
    /// fn burst<L: Limiter<str>>(limiter: &L, plan: &Quota) -> usize {
    ///     let under = Under::new(limiter, *plan);
    ///     (0..10).filter(|_| under.allow("k", 0.0)).count()
    /// }
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// assert_eq!(burst(&limiter, &Quota::new(1.0, 4).unwrap()), 4);
    /// ```
    #[must_use]
    pub fn new(target: &'a L, quota: Quota) -> Self {
        Under { target, quota }
    }
}

impl<L: Limiter<Q>, Q: ?Sized> Limiter<Q> for Under<'_, L> {
    type Error = L::Error;

    #[inline]
    fn quota(&self) -> Quota {
        self.quota
    }

    #[inline]
    fn check_under(
        &self,
        key: &Q,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> Result<Decision, Self::Error> {
        self.target.check_under(key, at, cost, quota)
    }

    #[inline(always)]
    fn allow(&self, key: &Q, at: impl Into<At>) -> bool {
        self.target.allow_under(key, at, 1, &self.quota)
    }

    #[inline(always)]
    fn allow_n(&self, key: &Q, at: impl Into<At>, cost: u64) -> bool {
        self.target.allow_under(key, at, cost, &self.quota)
    }

    #[inline(always)]
    fn allow_under(&self, key: &Q, at: impl Into<At>, cost: u64, quota: &Quota) -> bool {
        self.target.allow_under(key, at, cost, quota)
    }

    #[inline]
    fn remaining_under(&self, key: &Q, at: At, quota: &Quota) -> Result<u64, Self::Error> {
        self.target.remaining_under(key, at, quota)
    }
}

impl<L: AsyncLimiter<Q>, Q: ?Sized + Sync> AsyncLimiter<Q> for Under<'_, L> {
    type Error = L::Error;

    fn quota(&self) -> Quota {
        self.quota
    }

    fn check_under(
        &self,
        key: &Q,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        self.target.check_under(key, at, cost, quota)
    }

    fn remaining_under(
        &self,
        key: &Q,
        at: At,
        quota: &Quota,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send {
        self.target.remaining_under(key, at, quota)
    }
}

//! The in-memory backend of the one front end ([`Limiter`]): the keyed
//! limiter and a handle each write `check_under` and `remaining_under`
//! once, over one spend (`spend`); `allow` and `allow_n` ask it only
//! whether the call was admitted, building no `Decision`. Every other call
//! is the trait's.

use super::spend::remaining_at;
use super::{BucketHandle, TokenBucketLimiter};
use crate::bucket::MOVED;
use crate::decision::Decision;
use crate::error::Denial;
use crate::gcra::Quota;
use crate::limiter::{AsyncLimiter, Limiter};
use crate::time::At;
use crate::under::Under;
use std::borrow::Borrow;
use std::future::{ready, Future};
use std::hash::{BuildHasher, Hash};

impl<K, S, Q> Limiter<Q> for TokenBucketLimiter<K, S>
where
    K: Hash + Eq + Borrow<Q> + 'static,
    S: BuildHasher + Clone,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    type Error = Denial;

    #[inline(always)]
    fn quota(&self) -> Quota {
        self.quota.load()
    }

    #[inline(always)]
    fn check_under(&self, key: &Q, at: At, cost: u64, quota: &Quota) -> Result<Decision, Denial> {
        self.spend_under(key, at, cost, quota)
            .map(|(now, word)| Decision::new(word, now, quota))
    }

    #[inline(always)]
    fn allow(&self, key: &Q, at: impl Into<At>) -> bool {
        Limiter::allow_n(self, key, at, 1)
    }

    #[inline(always)]
    fn allow_n(&self, key: &Q, at: impl Into<At>, cost: u64) -> bool {
        // The default quota in place while it was never replaced (see
        // `LiveQuota::current`): no copy of its words.
        let mut loaded = None;
        self.admit(key, at, cost, self.quota.current(&mut loaded))
    }

    #[inline(always)]
    fn allow_under(&self, key: &Q, at: impl Into<At>, cost: u64, quota: &Quota) -> bool {
        self.admit(key, at, cost, quota)
    }

    fn remaining_under(&self, key: &Q, at: At, quota: &Quota) -> Result<u64, Denial> {
        remaining_at(at.nanos(&*self.clock), quota, || self.word(key))
    }
}

/// The in-memory limiter never waits: each future is ready, and the call
/// is decided when it is made.
impl<K, S, Q> AsyncLimiter<Q> for TokenBucketLimiter<K, S>
where
    K: Hash + Eq + Borrow<Q> + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    type Error = Denial;

    #[inline]
    fn quota(&self) -> Quota {
        self.quota.load()
    }

    #[inline]
    fn check_under(
        &self,
        key: &Q,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, Denial>> + Send {
        ready(Limiter::check_under(self, key, at, cost, quota))
    }

    fn remaining_under(
        &self,
        key: &Q,
        at: At,
        quota: &Quota,
    ) -> impl Future<Output = Result<u64, Denial>> + Send {
        ready(Limiter::remaining_under(self, key, at, quota))
    }
}

/// # Calls without importing the trait
///
/// The seed's form, `limiter.allow("key1", 0.0)`, works with nothing but
/// the limiter in scope: these are [`Limiter`]'s calls, under the same
/// names (see the trait for what each does).
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// [`Limiter::allow`]: spends one token from `key`'s bucket at `at`, if
    /// it holds one.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// assert!(limiter.allow("k", 0.0));
    /// assert!(!limiter.allow("k", 0.5));
    /// assert!(limiter.allow("k", 1.0));
    /// assert!(!limiter.allow("k", f64::NAN));
    /// ```
    #[must_use]
    #[inline(always)]
    pub fn allow<Q>(&self, key: &Q, at: impl Into<At>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Limiter::allow(self, key, at)
    }

    /// [`Limiter::allow_n`]: spends `cost` tokens at `at`, if the bucket
    /// holds that many.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert!(limiter.allow_n("k", 0.0, 3));
    /// assert!(!limiter.allow_n("k", 0.0, 1));
    /// assert!(!limiter.allow_n("k", 100.0, 4));
    /// ```
    #[must_use]
    #[inline(always)]
    pub fn allow_n<Q>(&self, key: &Q, at: impl Into<At>, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Limiter::allow_n(self, key, at, cost)
    }

    /// [`Limiter::check`]: spends `cost` tokens, or says why not.
    ///
    /// # Errors
    ///
    /// The [`Denial`]s listed on [`Limiter::check`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Denial, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert_eq!(limiter.check("k", 0.0, 2).map(|d| d.remaining()), Ok(1));
    /// assert_eq!(
    ///     limiter.check("k", 0.0, 2).unwrap_err(),
    ///     Denial::InsufficientTokens { retry_after: Duration::from_secs(1) }
    /// );
    /// assert!(matches!(limiter.check("k", 0.0, 9), Err(Denial::ExceedsCapacity { .. })));
    /// assert_eq!(limiter.check("k", -1.0, 1).unwrap_err(), Denial::InvalidTimestamp);
    /// ```
    #[inline(always)]
    pub fn check<Q>(&self, key: &Q, at: impl Into<At>, cost: u64) -> Result<Decision, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Limiter::check(self, key, at, cost)
    }

    /// [`Limiter::remaining`]: the whole tokens `key` holds at `at`,
    /// spending nothing and creating no bucket.
    ///
    /// # Errors
    ///
    /// [`Denial::InvalidTimestamp`] for an instant out of range.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 3);
    /// assert_eq!(limiter.remaining("k", 0.0), Ok(3));
    /// assert!(limiter.allow_n("k", 0.0, 2));
    /// assert_eq!(limiter.remaining("k", 1.5), Ok(2));
    /// assert!(limiter.remaining("k", f64::INFINITY).is_err());
    /// ```
    pub fn remaining<Q>(&self, key: &Q, at: impl Into<At>) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Limiter::remaining(self, key, at)
    }

    /// These calls under `quota` instead of the
    /// default one (import [`Limiter`] to call them).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Limiter, Quota, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let burst_of_3 = Quota::new(1.0, 3).unwrap();
    /// assert!(limiter.under(&burst_of_3).allow_n("k", 0.0, 3));
    /// ```
    #[must_use]
    pub fn under(&self, quota: &Quota) -> Under<'_, Self> {
        Under::new(self, *quota)
    }

    /// The word of `key`'s bucket, wherever it lives; for a key without
    /// one, the word it would start from (read after the lookup found it
    /// absent, see `life::start_word`).
    pub(super) fn word<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.buckets
            .read(key, |bucket| match bucket.word() {
                MOVED => self.moved.read(key, |moved| moved.bucket.word()),
                word => Some(word),
            })
            .flatten()
            .unwrap_or_else(|| self.start_word().as_u64())
    }
}

/// A handle is one key's bucket: its key is `()`.
impl Limiter<()> for BucketHandle {
    type Error = Denial;

    #[inline(always)]
    fn quota(&self) -> Quota {
        self.quota.load()
    }

    #[inline(always)]
    fn check_under(&self, _: &(), at: At, cost: u64, quota: &Quota) -> Result<Decision, Denial> {
        self.spend_under(at, cost, quota)
            .map(|(now, word)| Decision::new(word, now, quota))
    }

    #[inline(always)]
    fn allow(&self, _: &(), at: impl Into<At>) -> bool {
        Limiter::allow_n(self, &(), at, 1)
    }

    #[inline(always)]
    fn allow_n(&self, _: &(), at: impl Into<At>, cost: u64) -> bool {
        let mut loaded = None;
        let quota = self.quota.current(&mut loaded);
        self.spend_under(at.into(), cost, quota).is_ok()
    }

    fn remaining_under(&self, _: &(), at: At, quota: &Quota) -> Result<u64, Denial> {
        remaining_at(at.nanos(&*self.clock), quota, || self.word())
    }
}

/// A handle never waits either.
impl AsyncLimiter<()> for BucketHandle {
    type Error = Denial;

    fn quota(&self) -> Quota {
        self.quota.load()
    }

    fn check_under(
        &self,
        key: &(),
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, Denial>> + Send {
        ready(Limiter::check_under(self, key, at, cost, quota))
    }

    fn remaining_under(
        &self,
        key: &(),
        at: At,
        quota: &Quota,
    ) -> impl Future<Output = Result<u64, Denial>> + Send {
        ready(Limiter::remaining_under(self, key, at, quota))
    }
}

/// # Calls on the handle's bucket
///
/// [`Limiter`]'s calls with the key left out (it is the handle's).
impl BucketHandle {
    /// [`Limiter::allow`] on this bucket.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let handle = limiter.bucket("k");
    /// assert!(handle.allow(0.0));
    /// assert!(!handle.allow(0.0));
    /// ```
    #[must_use]
    #[inline(always)]
    pub fn allow(&self, at: impl Into<At>) -> bool {
        Limiter::allow(self, &(), at)
    }

    /// [`Limiter::allow_n`] on this bucket.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 3).bucket("k");
    /// assert!(handle.allow_n(0.0, 3));
    /// assert!(!handle.allow_n(0.0, 1));
    /// ```
    #[must_use]
    #[inline(always)]
    pub fn allow_n(&self, at: impl Into<At>, cost: u64) -> bool {
        Limiter::allow_n(self, &(), at, cost)
    }

    /// [`Limiter::check`] on this bucket.
    ///
    /// # Errors
    ///
    /// The [`Denial`]s listed on [`Limiter::check`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 3).bucket("k");
    /// assert_eq!(handle.check(0.0, 1).map(|d| d.remaining()), Ok(2));
    /// ```
    #[inline(always)]
    pub fn check(&self, at: impl Into<At>, cost: u64) -> Result<Decision, Denial> {
        Limiter::check(self, &(), at, cost)
    }

    /// [`Limiter::remaining`] on this bucket.
    ///
    /// # Errors
    ///
    /// [`Denial::InvalidTimestamp`] for an instant out of range.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 3).bucket("k");
    /// assert_eq!(handle.remaining(0.0), Ok(3));
    /// ```
    pub fn remaining(&self, at: impl Into<At>) -> Result<u64, Denial> {
        Limiter::remaining(self, &(), at)
    }
}

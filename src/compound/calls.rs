//! The compound calls every backend answers, written once: [`Compound`]
//! (answered in the calling thread: [`CompoundLimiter`], the blocking
//! Redis limiter) and [`AsyncCompound`] (awaited: `CompoundLimiter`,
//! which never waits, and `RedisLimiter`, which the tower layer takes).

use super::limiter::CompoundLimiter;
use super::outcome::{CompoundDecision, CompoundDenial};
use super::policy::Policy;
use crate::time::At;
use std::borrow::Borrow;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

/// Why a compound call was not admitted, whatever the backend: a
/// [`CompoundDenial`] (the backend decided), or a failure of the backend
/// (Redis down, fail-closed), which has none.
///
/// # Examples
///
/// ```
/// use keyrate::{CompoundDenial, CompoundRefusal};
/// use std::time::Duration;
///
/// let denial = CompoundDenial::InsufficientTokens {
///     retry_after: Duration::from_secs(1),
///     scope: 1,
///     quota: 0,
/// };
/// assert_eq!(CompoundRefusal::binding(&denial), Some((1, 0)));
/// ```
pub trait CompoundRefusal: std::error::Error + Send + Sync + 'static {
    /// The denial, if the backend decided the call.
    fn denial(&self) -> Option<&CompoundDenial>;

    /// The wait after which the same call would be admitted, if waiting
    /// can help.
    fn retry_after(&self) -> Option<Duration> {
        self.denial().and_then(CompoundDenial::retry_after)
    }

    /// The `(scope, quota)` that bound a denial by a quota.
    fn binding(&self) -> Option<(usize, usize)> {
        self.denial().and_then(CompoundDenial::binding)
    }
}

impl CompoundRefusal for CompoundDenial {
    fn denial(&self) -> Option<&CompoundDenial> {
        Some(self)
    }
}

/// A compound limiter answered in the calling thread:
/// [`CompoundLimiter`], or the blocking Redis limiter. Code written
/// against it runs unchanged on either.
///
/// A call charges `cost` to every quota of every `(key, policy)` scope,
/// all or nothing (see [`CompoundLimiter`] for the rule); its instant is
/// `impl Into<`[`At`]`>`, as for [`Limiter`](crate::Limiter). The names
/// differ from [`Limiter`](crate::Limiter)'s (`check_policy`, not
/// `check`), so that a Redis limiter, which answers both, needs no
/// disambiguation with both traits in scope.
///
/// # Examples
///
/// ```
/// use keyrate::{Compound, CompoundLimiter, Policy, Quota};
///
/// fn admitted<L: Compound>(limiter: &L, scopes: &[(&str, &Policy)], n: u64) -> u64 {
///     (0..n).filter(|_| limiter.check_scopes(scopes, 0.0, 1).is_ok()).count() as u64
/// }
///
/// let key = Policy::from(Quota::new(1.0, 5).unwrap());
/// let org = Policy::from(Quota::new(1.0, 3).unwrap());
/// let limiter = CompoundLimiter::new();
/// assert_eq!(admitted(&limiter, &[("k", &key), ("org", &org)], 10), 3);
/// assert_eq!(limiter.remaining_policy("k", &key, 0.0), Ok(2));
/// ```
pub trait Compound<Q: ?Sized = str> {
    /// Why a call was not admitted: [`CompoundDenial`] in memory.
    type Error: CompoundRefusal;

    /// Charges `cost` to every `(key, policy)` scope at `at`, all or
    /// nothing.
    ///
    /// # Errors
    ///
    /// The backend's refusal; a denial spent nothing.
    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> Result<CompoundDecision, Self::Error>;

    /// The least whole tokens `key` holds at `at` over the quotas of
    /// `policy`, spending nothing.
    ///
    /// # Errors
    ///
    /// [`CompoundDenial::InvalidTimestamp`] for a bad instant, and a
    /// backend's failure.
    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> Result<u64, Self::Error>;

    /// [`check_scopes`](Self::check_scopes) with one scope.
    ///
    /// # Errors
    ///
    /// As [`check_scopes`](Self::check_scopes).
    fn check_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
        cost: u64,
    ) -> Result<CompoundDecision, Self::Error> {
        self.check_scopes(&[(key, policy)], at, cost)
    }
}

/// A compound limiter that may await its backend: `RedisLimiter`, and
/// [`CompoundLimiter`] (which never waits), so that async code such as
/// the tower layer is written once for both.
///
/// The calls of [`Compound`], returning `Send` futures.
///
/// # Examples
///
/// ```
/// use keyrate::{AsyncCompound, CompoundLimiter, Policy, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let policy = Policy::new([Quota::new(1.0, 5).unwrap(), Quota::new(1.0, 2).unwrap()]).unwrap();
/// let limiter = CompoundLimiter::new();
/// let decision = limiter.check_policy("k", &policy, 0.0, 2).await.unwrap();
/// assert_eq!((decision.remaining(), decision.quota()), (0, 1));
/// # }
/// ```
pub trait AsyncCompound<Q: ?Sized + Sync = str>: Sync {
    /// Why a call was not admitted.
    type Error: CompoundRefusal;

    /// [`Compound::check_scopes`], awaited.
    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> impl Future<Output = Result<CompoundDecision, Self::Error>> + Send;

    /// [`Compound::remaining_policy`], awaited.
    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// [`Compound::check_policy`], awaited.
    fn check_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
        cost: u64,
    ) -> impl Future<Output = Result<CompoundDecision, Self::Error>> + Send {
        let at = at.into();
        async move { self.check_scopes(&[(key, policy)], at, cost).await }
    }
}

/// # The calls, through the traits
impl<K, S, Q> Compound<Q> for CompoundLimiter<K, S>
where
    K: Hash + Eq + Borrow<Q> + 'static,
    S: BuildHasher + Clone,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    type Error = CompoundDenial;

    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> Result<CompoundDecision, CompoundDenial> {
        CompoundLimiter::check_scopes(self, scopes, at, cost)
    }

    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> Result<u64, CompoundDenial> {
        CompoundLimiter::remaining(self, key, policy, at)
    }
}

impl<K, S, Q> AsyncCompound<Q> for CompoundLimiter<K, S>
where
    K: Hash + Eq + Borrow<Q> + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    type Error = CompoundDenial;

    fn check_scopes(
        &self,
        scopes: &[(&Q, &Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> impl Future<Output = Result<CompoundDecision, CompoundDenial>> + Send {
        std::future::ready(CompoundLimiter::check_scopes(self, scopes, at, cost))
    }

    fn remaining_policy(
        &self,
        key: &Q,
        policy: &Policy,
        at: impl Into<At>,
    ) -> impl Future<Output = Result<u64, CompoundDenial>> + Send {
        std::future::ready(CompoundLimiter::remaining(self, key, policy, at))
    }
}

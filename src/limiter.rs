//! The one front end: the calls every backend answers, written once.
//!
//! A backend implements two methods, [`check_under`](Limiter::check_under)
//! and [`remaining_under`](Limiter::remaining_under), and names its default
//! quota; `allow`, `allow_n`, `check`, `remaining`, the waits and the
//! quota-bound view [`Under`] are the traits' own, the same on every
//! backend. In-process backends ([`TokenBucketLimiter`](crate::TokenBucketLimiter),
//! [`BucketHandle`](crate::BucketHandle), `BlockingRedisLimiter`) implement
//! [`Limiter`]; the ones that await ([`TokenBucketLimiter`](crate::TokenBucketLimiter)
//! too, and `RedisLimiter`) implement [`AsyncLimiter`], which the tower
//! layer takes.

use crate::decision::{Decision, Refusal};
#[cfg(doc)]
use crate::error::Denial;
use crate::gcra::Quota;
use crate::time::{At, Now};
use std::future::Future;
use std::time::Duration;

/// What to do after a refusal, given how much of the maximum wait is
/// left: `Ok(sleep)` to sleep and try again; `Err` to give up now.
fn next_sleep<E: Refusal>(refusal: E, left: Duration) -> Result<Duration, E> {
    match refusal.retry_after() {
        // A wait longer than what is left would end in a denial anyway:
        // give up now rather than sleep for nothing.
        Some(retry_after) if retry_after <= left => Ok(retry_after),
        // Over the maximum wait, more than the capacity, a clock out of
        // range, a backend failure: waiting cannot help.
        _ => Err(refusal),
    }
}

/// A rate limiter answered in the calling thread: the in-memory limiter,
/// a handle, or the blocking Redis limiter.
///
/// `Q` is the key type a call names (`str` for string keys; `()` for a
/// [`BucketHandle`](crate::BucketHandle), which is one key's bucket).
///
/// # Calls
///
/// Every call takes its instant as `impl Into<`[`At`]`>`: `f64` seconds
/// on the caller's timeline, an exact [`Duration`] since its epoch, or
/// [`Now`] for the backend's clock. A decision is `Ok(`[`Decision`]`)` or
/// `Err(Self::Error)`, the same shape on every backend; a denial writes
/// nothing.
///
/// | call | returns |
/// |---|---|
/// | [`allow`](Self::allow), [`allow_n`](Self::allow_n) | whether the call was admitted (and spent) |
/// | [`check`](Self::check) | the [`Decision`], or why not |
/// | [`remaining`](Self::remaining) | whole tokens held, spending nothing |
/// | [`wait_blocking`](Self::wait_blocking) | sleeps until admitted or `max_wait` |
/// | `under(&quota)` (each backend's, or [`Under::new`](crate::Under::new)) | the same calls under another quota |
///
/// # Examples
///
/// Code written once for every backend:
///
/// ```
/// use keyrate::{Limiter, Now, TokenBucketLimiter};
///
/// fn admit_burst<L: Limiter<str>>(limiter: &L, key: &str, n: u64) -> u64 {
///     (0..n).filter(|_| limiter.allow(key, 0.0)).count() as u64
/// }
///
/// let limiter = TokenBucketLimiter::new(1.0, 3);
/// assert_eq!(admit_burst(&limiter, "k", 10), 3);
/// assert_eq!(Limiter::remaining(&limiter, "k", 2.0), Ok(2));
/// ```
pub trait Limiter<Q: ?Sized = str> {
    /// Why a call was not admitted: [`Denial`] in memory.
    type Error: Refusal;

    /// The default quota, used by every call not made [`Under`](crate::Under)
    /// another.
    fn quota(&self) -> Quota;

    /// Spends `cost` tokens from `key`'s bucket at `at` under `quota`, if
    /// it holds that many: the one call each backend writes. Prefer
    /// [`check`](Self::check) and [`Under`](crate::Under).
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    fn check_under(
        &self,
        key: &Q,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> Result<Decision, Self::Error>;

    /// The whole tokens `key` holds at `at` under `quota`, spending
    /// nothing. Prefer [`remaining`](Self::remaining).
    ///
    /// # Errors
    ///
    /// As [`remaining`](Self::remaining).
    fn remaining_under(&self, key: &Q, at: At, quota: &Quota) -> Result<u64, Self::Error>;

    /// Spends one token from `key`'s bucket at `at`, if it holds one.
    /// Returns whether the call is admitted. A denied call changes nothing;
    /// so does an invalid instant (denied).
    #[must_use]
    #[inline(always)]
    fn allow(&self, key: &Q, at: impl Into<At>) -> bool {
        self.check(key, at, 1).is_ok()
    }

    /// Spends `cost` tokens from `key`'s bucket at `at`, if it holds that
    /// many. Cost 0 is always admitted (at a valid instant) and changes
    /// nothing; a cost above the capacity is never admitted.
    #[must_use]
    #[inline(always)]
    fn allow_n(&self, key: &Q, at: impl Into<At>, cost: u64) -> bool {
        self.check(key, at, cost).is_ok()
    }

    /// [`allow_n`](Self::allow_n) under `quota`: what
    /// [`under(&quota)`](crate::Under) calls. A backend may answer it
    /// without building the [`Decision`] that
    /// [`check_under`](Self::check_under) returns.
    #[must_use]
    #[inline(always)]
    fn allow_under(&self, key: &Q, at: impl Into<At>, cost: u64, quota: &Quota) -> bool {
        self.check_under(key, at.into(), cost, quota).is_ok()
    }

    /// Spends `cost` tokens like [`allow_n`](Self::allow_n), and says why a
    /// denied call was denied; an admitted one returns its [`Decision`]
    /// (the tokens left, the time until full).
    ///
    /// # Errors
    ///
    /// [`Refusal::denial`] is
    /// - [`Denial::InsufficientTokens`] with the exact wait until this cost
    ///   would be admitted;
    /// - [`Denial::ExceedsCapacity`] when `cost > capacity`;
    /// - [`Denial::InvalidTimestamp`] for an instant out of range;
    /// - [`Denial::LimiterFull`] for a new key at the bucket cap;
    ///
    /// or `None` when a backend could not decide (Redis down, fail-closed).
    #[inline(always)]
    fn check(&self, key: &Q, at: impl Into<At>, cost: u64) -> Result<Decision, Self::Error> {
        self.check_under(key, at.into(), cost, &self.quota())
    }

    /// The whole tokens `key` holds at `at`, spending nothing (for a
    /// `RateLimit` header). A key never seen holds the capacity; nothing
    /// is created.
    ///
    /// # Errors
    ///
    /// [`Denial::InvalidTimestamp`] for an instant out of range, and a
    /// backend's failure.
    #[inline]
    fn remaining(&self, key: &Q, at: impl Into<At>) -> Result<u64, Self::Error> {
        self.remaining_under(key, at.into(), &self.quota())
    }

    /// Blocks the thread until `key`'s bucket holds `cost` tokens, then
    /// spends them at [`Now`]. Sleeps exactly as long as each denial says
    /// (no polling); tries again only if another caller took the refill.
    /// Never call it from an async task: it blocks the worker.
    ///
    /// # Errors
    ///
    /// The refusal at once when waiting cannot help (a cost above the
    /// capacity, a backend failure), or when the wait it reports would end
    /// more than `max_wait` after the call.
    fn wait_blocking(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Self::Error> {
        let start = std::time::Instant::now();
        loop {
            let refusal = match self.check(key, Now, cost) {
                Ok(decision) => return Ok(decision),
                Err(refusal) => refusal,
            };
            let left = max_wait.saturating_sub(start.elapsed());
            std::thread::sleep(next_sleep(refusal, left)?);
        }
    }
}

/// A rate limiter that may await its backend: `RedisLimiter`, and the
/// in-memory limiter (which never waits), so that async code such as the
/// tower layer is written once for both.
///
/// The same calls as [`Limiter`], returning futures; the same
/// [`Decision`] and errors. Its futures are `Send`. A type that
/// implements both traits (the in-memory limiter) answers both the same;
/// with both traits in scope, name the one you mean
/// (`AsyncLimiter::check(&limiter, ...)`).
pub trait AsyncLimiter<Q: ?Sized + Sync = str>: Sync {
    /// Why a call was not admitted.
    type Error: Refusal;

    /// The default quota.
    fn quota(&self) -> Quota;

    /// [`Limiter::check_under`], awaited.
    fn check_under(
        &self,
        key: &Q,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send;

    /// [`Limiter::remaining_under`], awaited.
    fn remaining_under(
        &self,
        key: &Q,
        at: At,
        quota: &Quota,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// [`Limiter::allow`], awaited.
    fn allow(&self, key: &Q, at: impl Into<At>) -> impl Future<Output = bool> + Send {
        let decided = self.check(key, at, 1);
        async move { decided.await.is_ok() }
    }

    /// [`Limiter::allow_n`], awaited.
    fn allow_n(&self, key: &Q, at: impl Into<At>, cost: u64) -> impl Future<Output = bool> + Send {
        let decided = self.check(key, at, cost);
        async move { decided.await.is_ok() }
    }

    /// [`Limiter::check`], awaited.
    fn check(
        &self,
        key: &Q,
        at: impl Into<At>,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        let quota = self.quota();
        let at = at.into();
        async move { self.check_under(key, at, cost, &quota).await }
    }

    /// [`Limiter::remaining`], awaited.
    fn remaining(
        &self,
        key: &Q,
        at: impl Into<At>,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send {
        let quota = self.quota();
        let at = at.into();
        async move { self.remaining_under(key, at, &quota).await }
    }

    /// Waits until `key`'s bucket holds `cost` tokens, then spends them
    /// at [`Now`] (feature `tokio`). Sleeps with [`tokio::time::sleep`]
    /// exactly as long as each denial says.
    ///
    /// **Cancellation-safe**: only the attempt that succeeds spends, so a
    /// dropped future has spent nothing.
    ///
    /// # Errors
    ///
    /// As [`Limiter::wait_blocking`]; `max_wait` is measured on tokio's
    /// clock.
    #[cfg(feature = "tokio")]
    fn wait(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        async move {
            let start = tokio::time::Instant::now();
            loop {
                let refusal = match self.check(key, Now, cost).await {
                    Ok(decision) => return Ok(decision),
                    Err(refusal) => refusal,
                };
                let left = max_wait.saturating_sub(start.elapsed());
                tokio::time::sleep(next_sleep(refusal, left)?).await;
            }
        }
    }
}

//! The concurrency front end the tower layer takes: one trait, written
//! once for the in-memory limiter and the Redis one.

use super::{ConcurrencyDenial, ConcurrencyLimiter, Permit};
use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

/// A concurrency limiter answered asynchronously: the in-memory
/// [`ConcurrencyLimiter`] or the
/// [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter), as
/// [`AsyncLimiter`](crate::AsyncLimiter) is for rates. The
/// [`ConcurrencyLimitLayer`](crate::layer::ConcurrencyLimitLayer) takes
/// any, so that it is written once.
///
/// `Q` is the key type a call names.
///
/// # Examples
///
/// Code written once for every backend:
///
/// ```
/// use keyrate::{AsyncConcurrencyLimiter, ConcurrencyLimiter};
/// use std::time::Duration;
///
/// async fn open_stream<L: AsyncConcurrencyLimiter<str>>(limiter: &L, key: &str) -> Option<L::Permit> {
///     limiter.acquire_under(key, limiter.max(), Duration::ZERO).await.ok()
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = ConcurrencyLimiter::new(1);
/// let first = open_stream(&limiter, "k").await;
/// assert!(first.is_some());
/// assert!(open_stream(&limiter, "k").await.is_none());
/// # });
/// ```
pub trait AsyncConcurrencyLimiter<Q: ?Sized + Sync = str>: Sync {
    /// What a caller holds while it may proceed: dropping it gives the
    /// permit back.
    type Permit: Send + 'static;
    /// Why no permit was given.
    type Error: fmt::Display + Send;

    /// The default limit: the permits a key may hold at once under the
    /// calls that name none.
    fn max(&self) -> u32;

    /// One of `key`'s permits if it holds fewer than `max`: at once, or
    /// waiting up to `max_wait` where the backend can wait (the in-memory
    /// limiter with feature `tokio`, first come first served); with
    /// `Duration::ZERO`, or where it cannot, refused at once.
    ///
    /// # Errors
    ///
    /// The backend's refusal: [`concurrency_denial`](Self::concurrency_denial)
    /// tells a limit's refusal from a failure.
    fn acquire_under(
        &self,
        key: &Q,
        max: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Self::Permit, Self::Error>> + Send;

    /// The limit's refusal inside `error`, or `None` if the backend
    /// failed to decide (Redis unreachable: the layer answers 503).
    fn concurrency_denial(error: &Self::Error) -> Option<&ConcurrencyDenial>;
}

impl<K, S, Q> AsyncConcurrencyLimiter<Q> for ConcurrencyLimiter<K, S>
where
    K: Hash + Eq + Borrow<Q> + Send + Sync,
    S: BuildHasher + Clone + Send + Sync,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    type Permit = Permit;
    type Error = ConcurrencyDenial;

    fn max(&self) -> u32 {
        ConcurrencyLimiter::max(self)
    }

    async fn acquire_under(
        &self,
        key: &Q,
        max: u32,
        max_wait: Duration,
    ) -> Result<Permit, ConcurrencyDenial> {
        #[cfg(feature = "tokio")]
        if !max_wait.is_zero() {
            return ConcurrencyLimiter::acquire_under(self, key, max, max_wait).await;
        }
        #[cfg(not(feature = "tokio"))]
        let _ = max_wait;
        self.try_acquire_under(key, max)
    }

    fn concurrency_denial(error: &ConcurrencyDenial) -> Option<&ConcurrencyDenial> {
        Some(error)
    }
}

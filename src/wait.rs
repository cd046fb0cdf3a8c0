//! Waiting until a cost can be admitted: async (feature `tokio`) and
//! blocking.
//!
//! A wait never polls in a loop: each denial carries the exact time until
//! the cost would be admitted, so the waiter sleeps for exactly that long
//! and tries once more. It tries again only if another caller spent the
//! refilled tokens first. Tokens are spent only by the final, admitted
//! attempt, so abandoning a wait (dropping the future) spends nothing.

use crate::error::Denial;
use crate::keyed::{BucketHandle, TokenBucketLimiter, Under};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

/// What to do after a denial, given how much of the maximum wait is left.
///
/// `Ok(sleep)` to sleep and try again; `Err(denial)` to give up now.
fn next_sleep(denial: Denial, left: Duration) -> Result<Duration, Denial> {
    match denial.retry_after() {
        // A wait longer than what is left would end in a denial anyway:
        // give up now rather than sleep for nothing.
        Some(retry_after) if retry_after <= left => Ok(retry_after),
        // Over the maximum wait, more than the capacity, or a clock out
        // of range: waiting cannot help.
        _ => Err(denial),
    }
}

/// The blocking loop shared by keyed calls and handles.
fn wait_blocking_with(
    max_wait: Duration,
    mut attempt: impl FnMut() -> Result<u64, Denial>,
) -> Result<u64, Denial> {
    let start = std::time::Instant::now();
    loop {
        let denial = match attempt() {
            Ok(remaining) => return Ok(remaining),
            Err(denial) => denial,
        };
        let left = max_wait.saturating_sub(start.elapsed());
        std::thread::sleep(next_sleep(denial, left)?);
    }
}

/// The async loop shared by keyed calls and handles.
#[cfg(feature = "tokio")]
async fn wait_with(
    max_wait: Duration,
    mut attempt: impl FnMut() -> Result<u64, Denial>,
) -> Result<u64, Denial> {
    let start = tokio::time::Instant::now();
    loop {
        // The only spend happens here, synchronously: a future dropped while
        // it sleeps below has spent nothing.
        let denial = match attempt() {
            Ok(remaining) => return Ok(remaining),
            Err(denial) => denial,
        };
        let left = max_wait.saturating_sub(start.elapsed());
        tokio::time::sleep(next_sleep(denial, left)?).await;
    }
}

impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Waits until `key`'s bucket holds `cost` tokens, then spends them at
    /// the limiter's clock reading; returns the whole tokens left.
    ///
    /// Sleeps (with [`tokio::time::sleep`]) for exactly the time each denial
    /// reports, so a wait costs one wake-up per attempt, not a busy loop.
    /// If another caller spends the refilled tokens first, it sleeps again.
    ///
    /// **Cancellation-safe**: tokens are spent only by the attempt that
    /// succeeds, so dropping the future (say, in a `tokio::select!` that
    /// picked another branch) spends nothing.
    ///
    /// # Errors
    ///
    /// - [`Denial::InsufficientTokens`] as soon as the wait it reports would
    ///   end after `max_wait` has passed since the call (measured on tokio's
    ///   clock); `max_wait` of zero makes this [`check_now`](Self::check_now).
    /// - [`Denial::ExceedsCapacity`] and [`Denial::InvalidTimestamp`] at
    ///   once: waiting cannot help.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ManualClock, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = TokenBucketLimiter::new(100.0, 1); // a token every 10 ms
    /// assert_eq!(limiter.wait("k", 1, Duration::ZERO).await, Ok(0));
    /// assert_eq!(limiter.wait("k", 1, Duration::from_secs(1)).await, Ok(0)); // ~10 ms
    ///
    /// let clock = ManualClock::new(); // time moves only when told
    /// let slow = TokenBucketLimiter::new(0.01, 1).with_clock(clock); // a token every 100 s
    /// assert_eq!(slow.wait("k", 1, Duration::ZERO).await, Ok(0));
    /// // The next token is 100 s away, more than the 1 s allowed: denied at once.
    /// let denial = slow.wait("k", 1, Duration::from_secs(1)).await.unwrap_err();
    /// assert_eq!(denial.retry_after(), Some(Duration::from_secs(100)));
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn wait<Q>(&self, key: &Q, cost: u64, max_wait: Duration) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        wait_with(max_wait, || self.check_now(key, cost)).await
    }

    /// Blocks the thread until `key`'s bucket holds `cost` tokens, then
    /// spends them at the limiter's clock reading; returns the whole tokens
    /// left. The blocking twin of `wait` (feature `tokio`), for threads
    /// outside an async runtime.
    ///
    /// Sleeps (with [`std::thread::sleep`]) for exactly the time each denial
    /// reports. Never call it from an async task: it blocks the worker.
    ///
    /// # Errors
    ///
    /// - [`Denial::InsufficientTokens`] as soon as the wait it reports would
    ///   end after `max_wait` has passed since the call;
    /// - [`Denial::ExceedsCapacity`] and [`Denial::InvalidTimestamp`] at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Denial, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// let limiter = TokenBucketLimiter::new(100.0, 1); // a token every 10 ms
    /// assert_eq!(limiter.wait_blocking("k", 1, Duration::ZERO), Ok(0));
    /// assert_eq!(limiter.wait_blocking("k", 1, Duration::from_secs(1)), Ok(0)); // ~10 ms
    /// assert!(matches!(
    ///     limiter.wait_blocking("k", 2, Duration::from_secs(1)),
    ///     Err(Denial::ExceedsCapacity { .. }) // at once
    /// ));
    /// ```
    pub fn wait_blocking<Q>(&self, key: &Q, cost: u64, max_wait: Duration) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        wait_blocking_with(max_wait, || self.check_now(key, cost))
    }
}

impl BucketHandle {
    /// Waits until the bucket holds `cost` tokens, then spends them at the
    /// limiter's clock reading; returns the whole tokens left.
    ///
    /// The handle's twin of [`TokenBucketLimiter::wait`], with the same
    /// guarantees: exact sleeps, and a dropped future spends nothing.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::wait`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let handle = TokenBucketLimiter::new(100.0, 1).bucket("k");
    /// assert_eq!(handle.wait(1, Duration::ZERO).await, Ok(0));
    /// assert_eq!(handle.wait(1, Duration::from_secs(1)).await, Ok(0)); // ~10 ms
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn wait(&self, cost: u64, max_wait: Duration) -> Result<u64, Denial> {
        wait_with(max_wait, || self.check_now(cost)).await
    }

    /// Blocks the thread until the bucket holds `cost` tokens, then spends
    /// them; returns the whole tokens left.
    ///
    /// The handle's twin of [`TokenBucketLimiter::wait_blocking`].
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::wait_blocking`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    /// use std::time::Duration;
    ///
    /// let handle = TokenBucketLimiter::new(100.0, 1).bucket("k");
    /// assert_eq!(handle.wait_blocking(1, Duration::ZERO), Ok(0));
    /// assert_eq!(handle.wait_blocking(1, Duration::from_secs(1)), Ok(0)); // ~10 ms
    /// assert!(handle.wait_blocking(2, Duration::from_secs(1)).is_err()); // at once
    /// ```
    pub fn wait_blocking(&self, cost: u64, max_wait: Duration) -> Result<u64, Denial> {
        wait_blocking_with(max_wait, || self.check_now(cost))
    }
}

/// # Waiting under a chosen quota
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> Under<'_, TokenBucketLimiter<K, S>> {
    /// [`TokenBucketLimiter::wait`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::wait`], with this quota's capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = TokenBucketLimiter::new(1.0, 1);
    /// let pro = Quota::new(100.0, 1).unwrap(); // a token every 10 ms
    /// assert_eq!(limiter.under(&pro).wait("k", 1, Duration::ZERO).await, Ok(0));
    /// assert_eq!(limiter.under(&pro).wait("k", 1, Duration::from_secs(1)).await, Ok(0)); // ~10 ms
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn wait<Q>(&self, key: &Q, cost: u64, max_wait: Duration) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        wait_with(max_wait, || self.check_now(key, cost)).await
    }

    /// [`TokenBucketLimiter::wait_blocking`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::wait_blocking`], with this quota's capacity.
    pub fn wait_blocking<Q>(&self, key: &Q, cost: u64, max_wait: Duration) -> Result<u64, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        wait_blocking_with(max_wait, || self.check_now(key, cost))
    }
}

/// # A handle waiting under a chosen quota
impl Under<'_, BucketHandle> {
    /// [`BucketHandle::wait`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::wait`], with this quota's capacity.
    #[cfg(feature = "tokio")]
    pub async fn wait(&self, cost: u64, max_wait: Duration) -> Result<u64, Denial> {
        wait_with(max_wait, || self.check_now(cost)).await
    }

    /// [`BucketHandle::wait_blocking`] under this quota.
    ///
    /// # Errors
    ///
    /// As [`TokenBucketLimiter::wait_blocking`], with this quota's capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Quota, TokenBucketLimiter};
    /// use std::time::Duration;
    ///
    /// let handle = TokenBucketLimiter::new(1.0, 1).bucket("k");
    /// let pro = Quota::new(100.0, 1).unwrap(); // a token every 10 ms
    /// assert_eq!(handle.under(&pro).wait_blocking(1, Duration::ZERO), Ok(0));
    /// assert_eq!(handle.under(&pro).wait_blocking(1, Duration::from_secs(1)), Ok(0));
    /// ```
    pub fn wait_blocking(&self, cost: u64, max_wait: Duration) -> Result<u64, Denial> {
        wait_blocking_with(max_wait, || self.check_now(cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_up_when_the_wait_exceeds_what_is_left() {
        let short = Denial::InsufficientTokens {
            retry_after: Duration::from_millis(5),
        };
        assert_eq!(
            next_sleep(short, Duration::from_millis(5)),
            Ok(Duration::from_millis(5))
        );
        assert_eq!(next_sleep(short, Duration::from_millis(4)), Err(short));
        let never = Denial::ExceedsCapacity {
            cost: 3,
            capacity: 2,
        };
        assert_eq!(next_sleep(never, Duration::MAX), Err(never));
        assert_eq!(
            next_sleep(Denial::InvalidTimestamp, Duration::MAX),
            Err(Denial::InvalidTimestamp)
        );
    }
}

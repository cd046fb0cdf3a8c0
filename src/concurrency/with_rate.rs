//! A permit and a token together, or neither.

use super::{ConcurrencyDenial, ConcurrencyLimiter, Permit};
use crate::decision::Decision;
use crate::error::Denial;
use crate::limiter::Limiter;
use crate::time::At;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// # Rate and concurrency together
impl<K: Hash + Eq, S: BuildHasher + Clone> ConcurrencyLimiter<K, S> {
    /// Takes one of `key`'s permits and spends `cost` tokens of the same
    /// key from `rate` (an in-memory rate limiter, or a view of one under
    /// a plan's quota) at `at`: both, or neither.
    ///
    /// The permit is taken first, so a refused permit spends no token; a
    /// refused token gives the permit straight back (for that instant the
    /// key counted it: a racing take may have been refused meanwhile).
    ///
    /// # Errors
    ///
    /// The permit's refusals, as [`try_acquire`](Self::try_acquire);
    /// [`ConcurrencyDenial::RateLimited`] with the rate limiter's
    /// [`Denial`] when the token was refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConcurrencyDenial, ConcurrencyLimiter, TokenBucketLimiter};
    ///
    /// let streams = ConcurrencyLimiter::new(1);
    /// let rate = TokenBucketLimiter::new(1.0, 2);
    /// let (permit, decision) = streams.try_acquire_with("k", &rate, 0.0, 1).unwrap();
    /// assert_eq!(decision.remaining(), 1);
    /// // At its limit: refused, and no token spent.
    /// assert!(matches!(
    ///     streams.try_acquire_with("k", &rate, 0.0, 1),
    ///     Err(ConcurrencyDenial::AtLimit { .. })
    /// ));
    /// assert_eq!(rate.remaining("k", 0.0), Ok(1));
    /// drop(permit);
    /// // Out of tokens: refused, and no permit held.
    /// assert!(matches!(
    ///     streams.try_acquire_with("k", &rate, 0.0, 2),
    ///     Err(ConcurrencyDenial::RateLimited(_))
    /// ));
    /// assert_eq!(streams.held("k"), 0);
    /// ```
    pub fn try_acquire_with<Q, L>(
        &self,
        key: &Q,
        rate: &L,
        at: impl Into<At>,
        cost: u64,
    ) -> Result<(Permit, Decision), ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        L: Limiter<Q, Error = Denial>,
    {
        let permit = self.try_acquire(key)?;
        match rate.check(key, at, cost) {
            Ok(decision) => Ok((permit, decision)),
            Err(denial) => {
                drop(permit);
                let refused = Err(ConcurrencyDenial::RateLimited(denial));
                self.counters.count(&refused);
                refused
            }
        }
    }
}

//! Waiting for a permit, first come first served per key: in a thread
//! (`acquire_blocking`) or a task (`acquire`, feature `tokio`).

use super::slot::{Joined, Slot, Waiter};
use super::{ConcurrencyDenial, ConcurrencyLimiter, Permit};
use crate::sync::Arc;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
#[cfg(not(loom))]
use std::time::{Duration, Instant};

/// A place in a key's queue, or the permit it was handed. Dropped before
/// it is turned into a [`Permit`], it leaves the queue, and a permit
/// handed to it meanwhile goes on to the next waiter: a caller that gives
/// up holds nothing and costs nobody their place.
#[derive(Debug)]
pub(crate) struct Queued {
    slot: Arc<Slot>,
    waiter: Arc<Waiter>,
    /// Turned into a permit: nothing to undo on drop.
    done: bool,
}

/// Where a caller that waits stands.
#[derive(Debug)]
pub(crate) enum Entered {
    /// A permit was free and no one queued.
    Taken(Permit),
    /// In the queue.
    Queued(Queued),
}

impl Queued {
    /// Whether a permit was handed to this place (it then holds it).
    pub(crate) fn granted(&self) -> bool {
        self.waiter.granted()
    }

    /// Records `wake` as the one to wake, then says whether the permit
    /// already came.
    #[cfg_attr(loom, allow(dead_code))] // the models do not park
    pub(crate) fn register(&self, wake: super::slot::Wake) -> bool {
        self.waiter.register(wake)
    }

    /// The permit handed to this place. Only after [`granted`](Self::granted).
    pub(crate) fn into_permit(mut self) -> Permit {
        debug_assert!(self.granted());
        self.done = true;
        Permit::new(Arc::clone(&self.slot))
    }

    /// Gives up the place: `Some` permit if one was handed to it before it
    /// left (the caller may keep it), `None` if it left the queue.
    pub(crate) fn cancel(mut self) -> Option<Permit> {
        self.done = true;
        self.slot
            .leave(&self.waiter)
            .then(|| Permit::new(Arc::clone(&self.slot)))
    }

    /// The permits held now.
    #[cfg(not(loom))]
    fn held(&self) -> u32 {
        self.slot.held()
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.done && self.slot.leave(&self.waiter) {
            // Handed a permit nobody will use: the next waiter gets it.
            self.slot.release();
        }
    }
}

/// # Waiting for a permit
///
/// A waiter is served in arrival order per key: no later waiter of the
/// same key, and no [`try_acquire`](ConcurrencyLimiter::try_acquire)
/// (which is refused while callers queue), takes a permit before it. A
/// released permit goes straight to the waiter at the head of the queue
/// when the key then holds fewer than that waiter's limit.
impl<K: Hash + Eq, S: BuildHasher + Clone> ConcurrencyLimiter<K, S> {
    /// Takes a free permit at once, or queues behind the callers already
    /// waiting for `key`.
    pub(crate) fn enter<Q>(&self, key: &Q, max: u32) -> Result<Entered, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if max == 0 {
            // No wait can help.
            return Err(ConcurrencyDenial::AtLimit { held: 0, max });
        }
        let waiter = Arc::new(Waiter::new(max));
        loop {
            let (found, created) = self.slot(key);
            let outcome = found.map(|slot| {
                let joined = slot.join(&waiter);
                (slot, joined)
            });
            if created {
                self.pace();
            }
            let (slot, joined) = outcome?;
            match joined {
                Joined::Taken => return Ok(Entered::Taken(Permit::new(slot))),
                Joined::Queued => {
                    return Ok(Entered::Queued(Queued {
                        slot,
                        waiter,
                        done: false,
                    }))
                }
                // Removed by the sweep since we found it: look again.
                Joined::Retired => continue,
            }
        }
    }

    /// Takes one of `key`'s permits, waiting up to `max_wait` in the
    /// calling thread for one to be given back, after the callers already
    /// waiting for the key.
    ///
    /// # Errors
    ///
    /// [`ConcurrencyDenial::TimedOut`] after `max_wait` without a permit
    /// (the caller then holds nothing and leaves the queue);
    /// [`ConcurrencyDenial::LimiterFull`] at the cap on keys, at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConcurrencyDenial, ConcurrencyLimiter};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// let limiter = Arc::new(ConcurrencyLimiter::new(1));
    /// let held = limiter.try_acquire("k").unwrap();
    /// let waiter = {
    ///     let limiter = Arc::clone(&limiter);
    ///     std::thread::spawn(move || limiter.acquire_blocking("k", Duration::from_secs(60)).is_ok())
    /// };
    /// while limiter.stats().waiting == 0 {
    ///     std::thread::yield_now();
    /// }
    /// drop(held); // handed to the waiter
    /// assert!(waiter.join().unwrap());
    /// assert!(matches!(
    ///     limiter.acquire_blocking("k", Duration::ZERO),
    ///     Ok(_) | Err(ConcurrencyDenial::TimedOut { .. })
    /// ));
    /// ```
    #[cfg(not(loom))]
    pub fn acquire_blocking<Q>(
        &self,
        key: &Q,
        max_wait: Duration,
    ) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_blocking_under(key, self.max(), max_wait)
    }

    /// [`acquire_blocking`](Self::acquire_blocking) under the limit `max`
    /// (a plan's) instead of the default. `max` 0 is refused at once with
    /// [`ConcurrencyDenial::AtLimit`]: no wait can help.
    ///
    /// # Errors
    ///
    /// As [`acquire_blocking`](Self::acquire_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let limiter = keyrate::ConcurrencyLimiter::new(1);
    /// let _p = limiter.acquire_blocking_under("k", 2, Duration::ZERO).unwrap();
    /// let _q = limiter.acquire_blocking_under("k", 2, Duration::ZERO).unwrap();
    /// assert!(limiter.acquire_blocking_under("k", 2, Duration::from_millis(1)).is_err());
    /// ```
    #[cfg(not(loom))]
    pub fn acquire_blocking_under<Q>(
        &self,
        key: &Q,
        max: u32,
        max_wait: Duration,
    ) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let result = self.wait_blocking(key, max, max_wait);
        self.counters.count(&result);
        result
    }

    #[cfg(not(loom))]
    fn wait_blocking<Q>(
        &self,
        key: &Q,
        max: u32,
        max_wait: Duration,
    ) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let queued = match self.enter(key, max)? {
            Entered::Taken(permit) => return Ok(permit),
            Entered::Queued(queued) => queued,
        };
        let _waiting = self.counters.waiting();
        let deadline = Instant::now().checked_add(max_wait);
        loop {
            if queued.register(super::slot::Wake::Thread(std::thread::current())) {
                return Ok(queued.into_permit());
            }
            let now = Instant::now();
            match deadline {
                Some(deadline) if now >= deadline => {
                    let held = queued.held();
                    return queued.cancel().ok_or(ConcurrencyDenial::TimedOut {
                        held,
                        max,
                        waited: max_wait,
                    });
                }
                Some(deadline) => std::thread::park_timeout(deadline - now),
                None => std::thread::park(),
            }
        }
    }

    /// Takes one of `key`'s permits, waiting up to `max_wait` for one to
    /// be given back, after the callers already waiting for the key
    /// (feature `tokio`; the wait runs on tokio's timer).
    ///
    /// Cancel-safe: dropping the future leaves the queue, holding
    /// nothing; a permit handed to it meanwhile goes to the next waiter.
    ///
    /// # Errors
    ///
    /// As [`acquire_blocking`](Self::acquire_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::ConcurrencyLimiter;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = ConcurrencyLimiter::new(1);
    /// let held = limiter.acquire("k", Duration::from_secs(1)).await.unwrap();
    /// assert!(limiter.acquire("k", Duration::from_millis(10)).await.is_err()); // timed out
    /// drop(held);
    /// let _again = limiter.acquire("k", Duration::ZERO).await.unwrap();
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire<Q>(&self, key: &Q, max_wait: Duration) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_under(key, self.max(), max_wait).await
    }

    /// [`acquire`](Self::acquire) under the limit `max` (a plan's)
    /// instead of the default. `max` 0 is refused at once.
    ///
    /// # Errors
    ///
    /// As [`acquire_blocking`](Self::acquire_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = keyrate::ConcurrencyLimiter::new(1);
    /// let _p = limiter.acquire_under("k", 2, Duration::ZERO).await.unwrap();
    /// let _q = limiter.acquire_under("k", 2, Duration::ZERO).await.unwrap();
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_under<Q>(
        &self,
        key: &Q,
        max: u32,
        max_wait: Duration,
    ) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let result = self.wait(key, max, max_wait).await;
        self.counters.count(&result);
        result
    }

    #[cfg(feature = "tokio")]
    async fn wait<Q>(
        &self,
        key: &Q,
        max: u32,
        max_wait: Duration,
    ) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        use std::task::Poll;
        let queued = match self.enter(key, max)? {
            Entered::Taken(permit) => return Ok(permit),
            Entered::Queued(queued) => queued,
        };
        let _waiting = self.counters.waiting();
        let arrived = tokio::time::timeout(
            max_wait,
            std::future::poll_fn(|cx| {
                match queued.register(super::slot::Wake::Task(cx.waker().clone())) {
                    true => Poll::Ready(()),
                    false => Poll::Pending,
                }
            }),
        )
        .await;
        if arrived.is_ok() {
            return Ok(queued.into_permit());
        }
        let held = queued.held();
        queued.cancel().ok_or(ConcurrencyDenial::TimedOut {
            held,
            max,
            waited: max_wait,
        })
    }
}

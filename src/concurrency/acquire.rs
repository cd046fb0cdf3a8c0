//! Taking a permit: through the key's entry under its shard's read lock,
//! or by creating the entry; and the key's slot for callers that wait.

use super::slot::{Slot, Take};
use super::{ConcurrencyDenial, ConcurrencyLimiter, Permit};
use crate::sync::Arc;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// # Taking a permit at once
impl<K: Hash + Eq, S: BuildHasher + Clone> ConcurrencyLimiter<K, S> {
    /// Takes one of `key`'s permits if it holds fewer than the default
    /// limit ([`max`](Self::max)) and no caller is waiting for one.
    ///
    /// # Errors
    ///
    /// [`ConcurrencyDenial::AtLimit`] when the key holds its limit (or
    /// callers are queued for it), [`ConcurrencyDenial::LimiterFull`] when
    /// a key holding nothing meets the cap of
    /// [`with_max_keys`](Self::with_max_keys). A refusal holds nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(1);
    /// let permit = limiter.try_acquire("k").unwrap();
    /// assert!(limiter.try_acquire("k").is_err());
    /// drop(permit);
    /// assert!(limiter.try_acquire("k").is_ok());
    /// ```
    pub fn try_acquire<Q>(&self, key: &Q) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_acquire_under(key, self.max())
    }

    /// [`try_acquire`](Self::try_acquire) under the limit `max` instead of
    /// the default: a plan's own limit, per call. A key's calls may use
    /// different limits; each call is admitted while the key holds fewer
    /// than its own. `max` 0 refuses every call (a suspended plan).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConcurrencyDenial, ConcurrencyLimiter};
    ///
    /// let limiter = ConcurrencyLimiter::new(1); // the free plan's limit
    /// let pro = 3;
    /// let permits: Vec<_> = (0..3).map(|_| limiter.try_acquire_under("sk_pro_1", pro).unwrap()).collect();
    /// assert_eq!(
    ///     limiter.try_acquire_under("sk_pro_1", pro).unwrap_err(),
    ///     ConcurrencyDenial::AtLimit { held: 3, max: 3 }
    /// );
    /// assert_eq!(
    ///     limiter.try_acquire_under("suspended", 0).unwrap_err(),
    ///     ConcurrencyDenial::AtLimit { held: 0, max: 0 }
    /// );
    /// # drop(permits);
    /// ```
    pub fn try_acquire_under<Q>(&self, key: &Q, max: u32) -> Result<Permit, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let result = self.take(key, max).map(Permit::new);
        self.counters.count(&result);
        result
    }

    /// The permits `key` holds now.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = keyrate::ConcurrencyLimiter::new(2);
    /// let _p = limiter.try_acquire("k").unwrap();
    /// assert_eq!(limiter.held("k"), 1);
    /// assert_eq!(limiter.held("other"), 0);
    /// ```
    #[must_use]
    pub fn held<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.slots.read(key, |slot| slot.held()).unwrap_or(0)
    }

    /// Takes a permit of `key` under `max`: the key's slot, its count
    /// already raised.
    pub(super) fn take<Q>(&self, key: &Q, max: u32) -> Result<Arc<Slot>, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if max == 0 {
            return Err(ConcurrencyDenial::AtLimit { held: 0, max });
        }
        loop {
            // Fast path: the key's entry, under its shard's read lock. The
            // slot's `Arc` is cloned only for a permit taken, so a refusal
            // writes nothing shared but the lock.
            let found = self.slots.read(key, |slot| taken(slot, slot.try_take(max)));
            let outcome = match found {
                Some(outcome) => outcome,
                None => self.create(key, max)?,
            };
            match outcome {
                Taken::Yes(slot) => return Ok(slot),
                Taken::No { held } => return Err(ConcurrencyDenial::AtLimit { held, max }),
                // Retired: removed from the map since; look again.
                Taken::Retired => continue,
            }
        }
    }

    /// Creates `key`'s entry (unless another thread just did) and takes a
    /// permit from it, under the shard's write lock.
    #[cold]
    fn create<Q>(&self, key: &Q, max: u32) -> Result<Taken, ConcurrencyDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut tried = false;
        let outcome = self.slots.try_write(
            self.slots.hash(key),
            key,
            || {
                tried = true;
                self.new_slot()
            },
            |slot| taken(slot, slot.try_take(max)),
            || self.creation_undone(),
        );
        if tried {
            // Outside the shard lock: a sweep step takes shards' write
            // locks. A creation refused at the cap paces it too.
            self.pace();
        }
        outcome.ok_or(ConcurrencyDenial::LimiterFull {
            max_keys: self.sweeper.max_keys,
        })
    }

    /// `key`'s slot, created if absent, for a caller that waits on it
    /// outside the shard's lock (the sweep may then retire it: see
    /// [`Slot::try_retire`]); and whether a creation was tried, which the
    /// caller counts toward the sweep with [`pace`](Self::pace) once it
    /// has joined the slot (a step taken before would find the new slot
    /// idle and retire it).
    pub(super) fn slot<Q>(&self, key: &Q) -> (Result<Arc<Slot>, ConcurrencyDenial>, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(slot) = self.slots.read(key, Arc::clone) {
            return (Ok(slot), false);
        }
        let mut tried = false;
        let slot = self.slots.try_write(
            self.slots.hash(key),
            key,
            || {
                tried = true;
                self.new_slot()
            },
            |slot| Arc::clone(slot),
            || self.creation_undone(),
        );
        let slot = slot.ok_or(ConcurrencyDenial::LimiterFull {
            max_keys: self.sweeper.max_keys,
        });
        (slot, tried)
    }

    /// Counts a creation (or a refusal at the cap) toward the automatic
    /// sweep, and takes a step when one is due. Outside any shard lock.
    pub(super) fn pace(&self) {
        let removed = self.sweeper.pace(&self.slots);
        self.counters.removed(removed);
    }

    /// Takes back a creation [`new_slot`](Self::new_slot) counted whose
    /// entry never made it into the map (the key's `Clone` or `Hash`
    /// panicked while it was inserted): its place under the cap, and its
    /// count in `keys_created`.
    #[cold]
    fn creation_undone(&self) {
        self.sweeper.release(1);
        self.counters.uncreated();
    }

    /// A new slot for a key absent from the map (the caller holds its
    /// shard's write lock), counted; `None` at the cap.
    fn new_slot(&self) -> Option<Arc<Slot>> {
        if !self.sweeper.reserve() {
            return None;
        }
        self.counters.created();
        Some(Arc::new(Slot::new()))
    }
}

/// A take's outcome, with the slot's `Arc` for a permit.
pub(super) enum Taken {
    Yes(Arc<Slot>),
    No { held: u32 },
    Retired,
}

#[inline]
fn taken(slot: &Arc<Slot>, take: Take) -> Taken {
    match take {
        Take::Taken => Taken::Yes(Arc::clone(slot)),
        Take::Full { held } => Taken::No { held },
        Take::Retired => Taken::Retired,
    }
}

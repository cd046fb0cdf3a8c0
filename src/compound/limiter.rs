//! The in-memory compound limiter: its configuration and its calls.

use super::decide;
use super::hot::HotCells;
use super::outcome::{CompoundDecision, CompoundDenial};
#[cfg(loom)]
use super::policy::MAX_QUOTAS;
use super::stats::{CompoundCounters, CompoundStats};
use super::store::Store;
use crate::keyed::DefaultHasher;
use crate::time::{At, Clock};
use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// A keyed limiter whose calls charge several quotas per key, and several
/// keys per call, all or nothing.
///
/// A call of cost `c` on scopes `(key, policy)` is admitted iff every
/// quota's bucket of every scope holds `c` tokens at the call's instant;
/// then `c` is spent from every one of them. A denial spends nothing and
/// writes no bucket; its wait is the first instant at which every bucket
/// holds `c` again, and it names the quota that binds it. Each quota's
/// bucket follows the single-quota rules exactly (see
/// [`Quota`](crate::Quota) and the crate's semantics: whole-nanosecond
/// intervals, backwards time, cost 0, bad instants).
///
/// Concurrent calls are exact: every outcome is that of some sequential
/// order of the same calls (a key's words are written under one lock; a
/// denial served from a thread's cache is decided on a read of its
/// buckets at one instant, writing nothing; a call takes its keys' locks
/// in one global order, so calls never deadlock). A thread that keeps
/// calling one key caches its bucket (see
/// [`with_hot_key_cache`](Self::with_hot_key_cache)).
///
/// # Examples
///
/// ```
/// use keyrate::{CompoundDenial, CompoundLimiter, Policy, Quota};
///
/// let plan = Policy::new([Quota::new(20.0, 40).unwrap(), Quota::new(0.5, 100).unwrap()]).unwrap();
/// let org = Policy::from(Quota::new(100.0, 50).unwrap());
/// let limiter = CompoundLimiter::new();
///
/// let scopes = [("sk_live_1", &plan), ("org_7", &org)];
/// assert!(limiter.check_scopes(&scopes, 0.0, 40).is_ok());
/// // The plan's burst is spent: nothing is charged to the org.
/// let denial = limiter.check_scopes(&scopes, 0.0, 10).unwrap_err();
/// assert_eq!(denial.binding(), Some((0, 0)));
/// assert_eq!(limiter.remaining("org_7", &org, 0.0), Ok(10));
/// ```
pub struct CompoundLimiter<K = String, S = DefaultHasher> {
    pub(super) store: Store<K, S>,
    /// Read by calls at [`Now`](crate::Now) only.
    pub(super) clock: std::sync::Arc<dyn Clock>,
    pub(super) counters: CompoundCounters,
    /// This limiter's face on the per-thread caches of hot cells.
    pub(super) hot: HotCells,
}

impl<K, S> fmt::Debug for CompoundLimiter<K, S>
where
    K: Hash + Eq,
    S: BuildHasher + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Counts only: keys are secrets.
        f.debug_struct("CompoundLimiter")
            .field("keys", &self.store.len())
            .field("max_keys", &self.store.max_keys())
            .finish()
    }
}

/// # Calls
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> CompoundLimiter<K, S> {
    /// Charges `cost` to `key` under every quota of `policy`, all or
    /// nothing: [`check_scopes`](Self::check_scopes) with one scope.
    ///
    /// # Errors
    ///
    /// A [`CompoundDenial`]; nothing was spent.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundDenial, CompoundLimiter, Policy, Quota};
    /// use std::time::Duration;
    ///
    /// // 2/s burst 4, and 5 a minute (one every 12 s).
    /// let minute = Quota::with_interval(Duration::from_secs(12), 5).unwrap();
    /// let policy = Policy::new([Quota::new(2.0, 4).unwrap(), minute]).unwrap();
    /// let limiter = CompoundLimiter::new();
    /// assert!(limiter.check("k", &policy, 0.0, 4).is_ok());
    /// assert!(limiter.check("k", &policy, 1.0, 1).is_ok()); // the minute's last
    /// assert_eq!(
    ///     limiter.check("k", &policy, 1.0, 2),
    ///     Err(CompoundDenial::InsufficientTokens {
    ///         retry_after: Duration::from_secs(23), // 2 tokens of 12 s, 1 s refilled
    ///         scope: 0,
    ///         quota: 1,
    ///     })
    /// );
    /// ```
    pub fn check<Q>(
        &self,
        key: &Q,
        policy: &crate::Policy,
        at: impl Into<At>,
        cost: u64,
    ) -> Result<CompoundDecision, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_scopes(&[(key, policy)], at, cost)
    }

    /// Charges `cost` to every `(key, policy)` scope, all or nothing: the
    /// call is admitted iff every quota of every scope holds `cost`, and
    /// then spends it from every one.
    ///
    /// # Errors
    ///
    /// A [`CompoundDenial`]; nothing was spent. Checked in this order:
    /// no scope, a key named twice, a bad instant, a cost above some
    /// quota's capacity, a new key over the cap, then the buckets. A key
    /// seen for the first time gets a full bucket even when the call is
    /// denied by another scope (a full bucket is what a missing one
    /// means, and the sweep removes it).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundDenial, CompoundLimiter, Policy, Quota};
    ///
    /// let key = Policy::from(Quota::new(1.0, 5).unwrap());
    /// let global = Policy::from(Quota::new(1.0, 6).unwrap());
    /// let limiter = CompoundLimiter::new();
    /// assert!(limiter.check_scopes(&[("a", &key), ("global", &global)], 0.0, 5).is_ok());
    /// // "b" has 5, but the global key has 1 left: denied, "b" keeps its 5.
    /// let denial = limiter.check_scopes(&[("b", &key), ("global", &global)], 0.0, 2);
    /// assert_eq!(denial.unwrap_err().binding(), Some((1, 0)));
    /// assert_eq!(limiter.remaining("b", &key, 0.0), Ok(5));
    /// assert_eq!(
    ///     limiter.check_scopes(&[("a", &key), ("a", &key)], 0.0, 1),
    ///     Err(CompoundDenial::DuplicateKey { first: 0, second: 1 })
    /// );
    /// ```
    pub fn check_scopes<Q>(
        &self,
        scopes: &[(&Q, &crate::Policy)],
        at: impl Into<At>,
        cost: u64,
    ) -> Result<CompoundDecision, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let result = self.decide(scopes, at.into(), cost);
        self.counters.decided(cost, result.as_ref());
        result
    }

    /// This limiter's counters: decisions by outcome, and denials by the
    /// `(scope, quota)` that bound them (see [`CompoundStats`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    ///
    /// let policy = Policy::new([Quota::new(1.0, 9).unwrap(), Quota::new(1.0, 1).unwrap()]).unwrap();
    /// let limiter = CompoundLimiter::new();
    /// assert!(limiter.check("k", &policy, 0.0, 2).is_err());
    /// assert_eq!(limiter.stats().denied_exceeds_capacity, 1);
    /// assert_eq!(limiter.stats().denied_by(0, 1), 1);
    /// ```
    #[must_use]
    pub fn stats(&self) -> CompoundStats {
        self.counters.read()
    }

    /// [`check_scopes`](Self::check_scopes), uncounted.
    fn decide<Q>(
        &self,
        scopes: &[(&Q, &crate::Policy)],
        at: At,
        cost: u64,
    ) -> Result<CompoundDecision, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if scopes.is_empty() {
            return Err(CompoundDenial::NoScopes);
        }
        for second in 1..scopes.len() {
            let key = scopes[second].0;
            if let Some(first) = scopes[..second].iter().position(|&(k, _)| k == key) {
                return Err(CompoundDenial::DuplicateKey { first, second });
            }
        }
        let now = at
            .nanos(&*self.clock)
            .ok_or(CompoundDenial::InvalidTimestamp)?;
        decide::check_costs(scopes.iter().map(|&(_, policy)| policy), cost)?;
        #[cfg(loom)]
        let one_scope_path = !crate::flaw::flawed(crate::flaw::Flaw::CompoundCheckThenSpend);
        #[cfg(not(loom))]
        let one_scope_path = true;
        if let (&[(key, policy)], true) = (scopes, one_scope_path) {
            return self.charge_one(key, policy, now, cost);
        }
        self.charge_scopes(scopes, now, cost)
    }

    /// The least whole tokens `key` holds at `at` over the quotas of
    /// `policy`. Reads only: a key with no bucket holds every capacity.
    ///
    /// # Errors
    ///
    /// [`CompoundDenial::InvalidTimestamp`] for a bad instant.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    ///
    /// let policy = Policy::new([Quota::new(1.0, 3).unwrap(), Quota::new(1.0, 9).unwrap()]).unwrap();
    /// let limiter = CompoundLimiter::new();
    /// assert_eq!(limiter.remaining("k", &policy, 0.0), Ok(3));
    /// let _ = limiter.check("k", &policy, 0.0, 2).unwrap();
    /// assert_eq!(limiter.remaining("k", &policy, 0.0), Ok(1));
    /// assert!(limiter.remaining("k", &policy, f64::NAN).is_err());
    /// ```
    pub fn remaining<Q>(
        &self,
        key: &Q,
        policy: &crate::Policy,
        at: impl Into<At>,
    ) -> Result<u64, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = at
            .into()
            .nanos(&*self.clock)
            .ok_or(CompoundDenial::InvalidTimestamp)?;
        let words = self
            .store
            .words(key)
            .unwrap_or_else(|| self.store.absent_words());
        Ok(decide::least_remaining(&words, policy, now))
    }

    /// Removes the buckets that are full at `at` and that no call holds;
    /// returns how many it removed (none for a bad instant). A removed
    /// key behaves as before at and after the instant its bucket was full
    /// from. With the automatic sweep on (one timeline for every key), a
    /// key without a bucket starts full from the latest such instant of
    /// the buckets removed, so a call stamped earlier finds it no fuller
    /// than it was; with it off, sweeps keep nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    ///
    /// let policy = Policy::from(Quota::new(1.0, 2).unwrap());
    /// let limiter = CompoundLimiter::new();
    /// let _ = limiter.check("k", &policy, 0.0, 2).unwrap();
    /// assert_eq!(limiter.sweep(1.0), 0); // 1 token short
    /// assert_eq!(limiter.sweep(2.0), 1);
    /// assert!(limiter.is_empty());
    /// ```
    pub fn sweep(&self, at: impl Into<At>) -> usize {
        match at.into().nanos(&*self.clock) {
            Some(now) => self.store.sweep(now),
            None => 0,
        }
    }

    /// The words of `key`'s bucket, if it has one (for the loom models).
    #[cfg(loom)]
    pub(crate) fn words<Q>(&self, key: &Q) -> Option<[u64; MAX_QUOTAS]>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.store.words_u64(key)
    }

    /// Whether this thread caches `key`'s cell (for the loom models).
    #[cfg(loom)]
    pub(crate) fn cached<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.hot.holds::<K, Q>(self.store.hash(key), key)
    }
}

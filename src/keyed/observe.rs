//! What the limiter tells about its traffic: counters and top offenders
//! (the recording itself is in `crate::observe`).

use super::TokenBucketLimiter;
use crate::bucket::Bucket;
use crate::observe::{Cell, Observer, Offenders, Stats, DEFAULT_OFFENDER_WINDOW};
use crate::time::Nanos;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

/// A limiter's observer: on or off, with epochs of `window` (by default
/// [`DEFAULT_OFFENDER_WINDOW`]).
pub(super) fn new_observer<K: Hash + Eq, S: BuildHasher>(
    on: bool,
    offenders: bool,
    window: Option<u64>,
    hasher: S,
) -> Arc<Observer<K, S>> {
    let default = Nanos::saturating_from_duration(DEFAULT_OFFENDER_WINDOW).as_u64();
    Arc::new(Observer::new(
        on,
        offenders,
        window.unwrap_or(default),
        hasher,
    ))
}

impl<K: Hash + Eq, S: BuildHasher> Observer<K, S> {
    /// A new bucket of word `start`, counted.
    pub(super) fn created(&self, start: Nanos) -> Bucket {
        self.counters.add(Cell::Created, 1);
        Bucket::with_word(start.as_u64())
    }
}

/// # Observability: counters and the keys denied most
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Turns the counters on (the default) or off, with the offenders'
    /// sketch if [`with_top_offenders`](Self::with_top_offenders) asked for
    /// it. Call it when making the limiter: it starts both afresh.
    ///
    /// With them on, every decision adds to counters that only the calling
    /// thread writes (one stripe per thread, summed by
    /// [`stats`](Self::stats)). Off, [`stats`](Self::stats) reads all zeros
    /// and no key is listed.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Stats, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1).with_stats(false);
    /// assert!(limiter.allow("k", 0.0));
    /// assert_eq!(limiter.stats(), Stats::default());
    /// assert!(limiter.top_offenders(10).top.is_empty());
    /// ```
    #[must_use]
    pub fn with_stats(self, on: bool) -> Self {
        let (offenders, window) = (self.observer.wants_offenders, self.observer.window_nanos);
        self.observed(on, offenders, window)
    }

    /// Tracks the keys denied most (off by default): every denial for want
    /// of tokens ([`Denial::InsufficientTokens`](crate::Denial::InsufficientTokens))
    /// is then counted in the calling thread's sketch of offenders, read by
    /// [`top_offenders`](Self::top_offenders). Call it when making the
    /// limiter: it starts the counters afresh.
    ///
    /// The sketch writes only the calling thread's memory, but it hashes the
    /// denied key on every denial: on a key hammered from two threads it
    /// measured about 0.6x the throughput of counters alone (README,
    /// "Observability"), which is why it is opt-in.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1).with_top_offenders(true);
    /// for _ in 0..5 {
    ///     let _ = limiter.allow("abuser", 0.0);
    /// }
    /// assert_eq!(limiter.top_offenders(1).top, vec![("abuser".to_string(), 4)]);
    /// ```
    #[must_use]
    pub fn with_top_offenders(self, on: bool) -> Self {
        let (stats, window) = (self.observer.counters.is_on(), self.observer.window_nanos);
        self.observed(stats, on, window)
    }

    /// Sets the epoch length of the offenders' window (by default
    /// [`DEFAULT_OFFENDER_WINDOW`], one minute): denials are counted per
    /// epoch of the calls' timestamps, and
    /// [`top_offenders`](Self::top_offenders) merges the latest two epochs,
    /// so it covers the last one to two `window`s. Call it when making the
    /// limiter: it starts the counters afresh.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    /// use std::time::Duration;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1)
    ///     .with_top_offenders(true)
    ///     .with_offender_window(Duration::from_secs(10));
    /// for t in [0.0, 0.0, 15.0, 15.0, 25.0, 25.0] {
    ///     let _ = limiter.allow("k", t);
    /// }
    /// // Epochs [10 s, 20 s) and [20 s, 30 s): the denial at 0 s has aged out.
    /// assert_eq!(limiter.top_offenders(1).top, vec![("k".to_string(), 2)]);
    /// ```
    #[must_use]
    pub fn with_offender_window(self, window: Duration) -> Self {
        let window = Nanos::saturating_from_duration(window).as_u64();
        let (on, offenders) = (
            self.observer.counters.is_on(),
            self.observer.wants_offenders,
        );
        self.observed(on, offenders, window.max(1))
    }

    /// This limiter with a fresh observer: counters `on`, the offenders'
    /// sketch if `offenders` (and `on`), epochs of `window` ns.
    fn observed(mut self, on: bool, offenders: bool, window: u64) -> Self {
        let hasher = self.observer.hasher().clone();
        self.observer = new_observer(on, offenders, Some(window), hasher);
        self
    }

    /// The counters since the limiter was made: decisions by outcome,
    /// buckets created and evicted, sweeps. Sums one stripe per thread;
    /// calls in flight may or may not be counted yet.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 2);
    /// assert!(limiter.allow("a", 0.0));
    /// assert!(!limiter.allow_n("a", 0.0, 5));
    /// assert_eq!(limiter.sweep(10.0), 1);
    /// let stats = limiter.stats();
    /// assert_eq!(stats.admitted, 1);
    /// assert_eq!(stats.denied_exceeds_capacity, 1);
    /// assert_eq!((stats.buckets_created, stats.buckets_evicted, stats.sweeps), (1, 1, 1));
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.observer.counters.read()
    }

    /// The `n` keys denied most in the recent window (see
    /// [`with_offender_window`](Self::with_offender_window)), most first,
    /// with approximate counts and their error bound (see [`Offenders`]):
    /// each count is within `denials / OFFENDER_SLOTS` of the truth.
    ///
    /// Denials of keyed calls and of [`BucketHandle`](crate::BucketHandle)s
    /// both count, when they are for want of tokens
    /// ([`Denial::InsufficientTokens`](crate::Denial::InsufficientTokens)):
    /// only a key that has a bucket, and spent it, gets one. Denials that
    /// spend nothing (a cost above the capacity, a new key at the cap, an
    /// invalid timestamp) do not count, so a flood of one-shot random keys
    /// cannot push a real offender out of the list.
    ///
    /// The keys are returned as they are (they are the caller's); the
    /// list's `Debug` shows fingerprints, and
    /// [`Offenders::labelled`] makes the list to export.
    ///
    /// # Locking behaviour
    ///
    /// Takes each thread's sketch lock in turn, which a thread takes only
    /// when a key enters its sketch; never a map lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::TokenBucketLimiter;
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1).with_top_offenders(true);
    /// for key in ["a", "b", "b", "c", "c", "c"] {
    ///     let _ = limiter.allow(key, 0.0);
    /// }
    /// let top = limiter.top_offenders(2).top;
    /// assert_eq!(top, vec![("c".to_string(), 2), ("b".to_string(), 1)]);
    /// ```
    #[must_use]
    pub fn top_offenders(&self, n: usize) -> Offenders<K>
    where
        K: Clone,
    {
        match &self.observer.offenders {
            Some(offenders) => offenders.read(n),
            None => Offenders {
                top: Vec::new(),
                max_error: 0,
                denials: 0,
            },
        }
    }
}

//! What a limiter tells about itself: decision counters and the keys it
//! denies most, recorded per thread so that observing a call writes no
//! memory shared with other threads.

mod counters;
mod label;
mod offenders;
#[cfg(feature = "tower")]
mod responses;
mod slot;

pub use counters::Stats;
pub(crate) use counters::{Cell, Counters, Striped};
#[cfg(feature = "tower")]
pub(crate) use label::Shown;
pub use label::{KeyLabels, MAX_KEY_LABEL_LEN, MIN_LABEL_SECRET_LEN};
pub(crate) use offenders::OffenderSketch;
pub use offenders::{Offenders, OFFENDER_SLOTS};
#[cfg(feature = "tower")]
pub use responses::Responses;
#[cfg(feature = "tower")]
pub(crate) use responses::{ResponseCounts, Status};

use crate::error::Denial;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// The default window of [`TokenBucketLimiter::top_offenders`](crate::TokenBucketLimiter::top_offenders):
/// epochs of one minute, so the window covers the last one to two minutes.
pub const DEFAULT_OFFENDER_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// A limiter's counters and offender sketches (both absent when off), and
/// the hasher that identifies keys in the sketches.
pub(crate) struct Observer<K, S> {
    pub(crate) counters: Counters,
    pub(crate) offenders: Option<OffenderSketch<K>>,
    /// Whether the offenders' sketch was asked for (it runs only with the
    /// counters on).
    pub(crate) wants_offenders: bool,
    hasher: S,
    /// The offender sketches' epoch length, in nanoseconds.
    pub(crate) window_nanos: u64,
}

impl<K: Hash + Eq, S: BuildHasher> Observer<K, S> {
    pub(crate) fn new(on: bool, wants_offenders: bool, window_nanos: u64, hasher: S) -> Self {
        Observer {
            counters: Counters::new(on),
            offenders: (on && wants_offenders).then(|| OffenderSketch::new(window_nanos)),
            wants_offenders,
            hasher,
            window_nanos,
        }
    }

    /// The hasher that identifies keys in the sketches.
    pub(crate) fn hasher(&self) -> &S {
        &self.hasher
    }

    /// Records a decided call on `key` (`now`: its validated timestamp):
    /// counts it, and an offence in the offenders' sketch.
    ///
    /// An offence is a denial for want of tokens
    /// ([`Denial::InsufficientTokens`]), which only a key that has a
    /// bucket, and has spent it, can get. Other denials spend nothing and
    /// need no bucket (a cost above the capacity, a new key at the cap, a
    /// bad timestamp): a flood of one-shot random keys could get them for
    /// free, and would push real offenders out of the sketch.
    #[inline(always)]
    pub(crate) fn decided<Q>(
        &self,
        key: &Q,
        now: Option<u64>,
        cost: u64,
        result: Result<(), &Denial>,
    ) where
        K: std::borrow::Borrow<Q>,
        Q: Hash + ToOwned<Owned = K> + ?Sized,
    {
        if !self.counters.is_on() {
            return;
        }
        let slot = slot::index();
        let offence = self.counters.decided_at(slot, cost, result);
        if let (true, Some(now), Some(offenders)) = (offence, now, &self.offenders) {
            offenders.record(slot, self.hasher.hash_one(key), now, || key.to_owned());
        }
    }

    /// What a handle on `key`'s bucket records into; `None` when off.
    pub(crate) fn for_handle(self: &Arc<Self>, key: K) -> HandleTally
    where
        K: Clone + Send + Sync + 'static,
        S: Send + Sync + 'static,
    {
        if !self.counters.is_on() {
            return HandleTally(None);
        }
        let hash = self.hasher.hash_one(&key);
        HandleTally(Some(Arc::new(KeyTally {
            observer: Arc::clone(self),
            key,
            hash,
        })))
    }
}

/// Records a handle's decisions into its limiter's observer.
trait RecordDecision: Send + Sync {
    fn decided(&self, now: Option<u64>, cost: u64, result: Result<(), &Denial>);
}

/// A handle's key, copied once when the handle is made, and its hash.
struct KeyTally<K, S> {
    observer: Arc<Observer<K, S>>,
    key: K,
    hash: u64,
}

impl<K, S> RecordDecision for KeyTally<K, S>
where
    K: Hash + Eq + Clone + Send + Sync,
    S: BuildHasher + Send + Sync,
{
    #[inline]
    fn decided(&self, now: Option<u64>, cost: u64, result: Result<(), &Denial>) {
        let observer = &self.observer;
        let slot = slot::index();
        let offence = observer.counters.decided_at(slot, cost, result);
        if let (true, Some(now), Some(offenders)) = (offence, now, &observer.offenders) {
            offenders.record(slot, self.hash, now, || self.key.clone());
        }
    }
}

/// Where a [`BucketHandle`](crate::BucketHandle) records its decisions;
/// nothing when the limiter's stats are off.
#[derive(Clone)]
pub(crate) struct HandleTally(Option<Arc<dyn RecordDecision>>);

impl HandleTally {
    #[inline]
    pub(crate) fn decided(&self, now: Option<u64>, cost: u64, result: Result<(), &Denial>) {
        if let Some(tally) = &self.0 {
            tally.decided(now, cost, result);
        }
    }
}

impl fmt::Debug for HandleTally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "On" } else { "Off" })
    }
}

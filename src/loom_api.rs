//! Crate internals for the loom models in `loom_tests/`.
//!
//! Compiled only under `cfg(loom)` and hidden from the docs: it is not part
//! of keyrate's API. The models drive the real bucket and the real decision
//! through these thin wrappers, so a model checks the code that ships.
//! They speak plain `u64` nanoseconds, the crate's `Nanos` inside.

use crate::bucket;
use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::time::Nanos;

/// The word of a retired (evicted) bucket.
pub const RETIRED: u64 = bucket::RETIRED;

/// The pure decision (`gcra::decide`): the new word, or why the call is denied.
pub fn decide(full_at: u64, now: u64, cost: u64, quota: &Quota) -> Result<u64, Denial> {
    gcra::decide(Nanos::new(full_at), Nanos::new(now), cost, quota).map(Nanos::as_u64)
}

/// Whole tokens a bucket with word `full_at` holds at `now`.
pub fn tokens_at(full_at: u64, now: u64, quota: &Quota) -> u64 {
    gcra::tokens_at(Nanos::new(full_at), Nanos::new(now), quota)
}

/// Whether a bucket with word `full_at` is full at `now`.
pub fn is_full(full_at: u64, now: u64) -> bool {
    gcra::is_full(Nanos::new(full_at), Nanos::new(now))
}

/// Why a spend on a [`Bucket`] did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpendError {
    /// A plain denial; the word was not written.
    Denied(Denial),
    /// The bucket was retired before the spend could land.
    Retired,
    /// The entry's bucket moved to a handle's `Arc`.
    Moved,
}

/// The real bucket (its atomic word is a loom atomic under `cfg(loom)`).
#[derive(Debug)]
pub struct Bucket(bucket::Bucket);

impl Bucket {
    /// A new bucket, full at every timestamp (word 0).
    pub fn new() -> Self {
        Bucket(bucket::Bucket::new())
    }

    /// A bucket holding `word`.
    pub fn with_word(word: u64) -> Self {
        Bucket(bucket::Bucket::with_word(word))
    }

    /// The real compare-and-swap spend.
    pub fn spend(&self, now: u64, cost: u64, quota: &Quota) -> Result<u64, SpendError> {
        self.0
            .spend(Nanos::new(now), cost, quota)
            .map(Nanos::as_u64)
            .map_err(|err| match err {
                bucket::SpendError::Denied(denial) => SpendError::Denied(denial),
                bucket::SpendError::Retired => SpendError::Retired,
                bucket::SpendError::Moved => SpendError::Moved,
            })
    }

    /// The real reset: compare-and-swap to 0 (full) unless a marker.
    pub fn reset(&self) -> Result<(), SpendError> {
        self.0.reset().map_err(|err| match err {
            bucket::SpendError::Denied(denial) => SpendError::Denied(denial),
            bucket::SpendError::Retired => SpendError::Retired,
            bucket::SpendError::Moved => SpendError::Moved,
        })
    }

    /// The current word (possibly [`RETIRED`]).
    pub fn word(&self) -> u64 {
        self.0.word()
    }

    /// The real retirement: compare-and-swap to [`RETIRED`] if full at `now`.
    pub fn try_retire(&self, now: u64) -> bool {
        self.0.retire_if_full(Nanos::new(now)).is_some()
    }
}

impl Default for Bucket {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a caller that waits for a concurrency permit stands (the real
/// `ConcurrencyLimiter` queue): a permit taken at once, or a place in the
/// key's queue.
#[derive(Debug)]
pub enum Entered {
    /// A permit was free and no one queued.
    Taken(crate::Permit),
    /// Queued behind the callers already waiting.
    Queued(Queued),
}

/// A place in a key's queue (the real one `acquire` waits in).
#[derive(Debug)]
pub struct Queued(crate::concurrency::Queued);

impl Queued {
    /// Whether a released permit was handed to this place.
    pub fn granted(&self) -> bool {
        self.0.granted()
    }

    /// The permit handed to this place; only after `granted`.
    pub fn into_permit(self) -> crate::Permit {
        self.0.into_permit()
    }

    /// Leaves the queue (a caller giving up): the permit, if one was
    /// handed over first.
    pub fn cancel(self) -> Option<crate::Permit> {
        self.0.cancel()
    }
}

/// The real first step of `acquire` / `acquire_blocking`: find the key's
/// slot (an `Arc`, used outside the shard lock), then take a free permit
/// or queue for one.
pub fn enter(
    limiter: &crate::ConcurrencyLimiter,
    key: &str,
    max: u32,
) -> Result<Entered, crate::ConcurrencyDenial> {
    limiter.enter(key, max).map(|entered| match entered {
        crate::concurrency::Entered::Taken(permit) => Entered::Taken(permit),
        crate::concurrency::Entered::Queued(queued) => Entered::Queued(Queued(queued)),
    })
}

pub use crate::flaw::{with_flaw, with_shards, Flaw};

/// The shard that holds `key` in a map of `shards` shards (see
/// [`with_shards`]).
pub fn shard_of<Q: std::hash::Hash + ?Sized>(key: &Q, shards: usize) -> usize {
    crate::store::shard_of(key, shards)
}

/// Where a limiter's automatic sweep is: the shard its next step sweeps,
/// and the steps the current pass has taken.
pub fn sweep_position<K, S>(limiter: &crate::TokenBucketLimiter<K, S>) -> (usize, usize)
where
    K: std::hash::Hash + Eq + 'static,
    S: std::hash::BuildHasher + Clone,
{
    limiter.sweep_position()
}

/// The words of `key`'s compound bucket (quota `i` at index `i`), if it
/// has one.
pub fn compound_words<S>(limiter: &crate::CompoundLimiter<String, S>, key: &str) -> Option<[u64; 8]>
where
    S: std::hash::BuildHasher + Clone,
{
    limiter.words(key)
}

/// Whether the calling (model) thread's cache of hot compound cells holds
/// `key`'s cell for `limiter`: a model checks that its calls take the
/// cached path it means to check.
pub fn compound_cached<S>(limiter: &crate::CompoundLimiter<String, S>, key: &str) -> bool
where
    S: std::hash::BuildHasher + Clone,
{
    limiter.cached(key)
}

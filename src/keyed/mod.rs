//! The per-key limiter: a sharded map from keys to buckets.

mod build;
mod calls;
mod handle;
mod life;
mod map_path;
mod observe;
mod occupancy;
mod plan;
mod spend;
mod sweep;

use crate::bucket::Bucket;
use crate::hot::HotKeys;
use crate::live_quota::LiveQuota;
use crate::observe::Observer;
use crate::store::Map;
use crate::time::Clock;
pub use handle::BucketHandle;
use life::Moved;
use occupancy::Occupancy;
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// The default hasher: foldhash, seeded per limiter.
///
/// Keys arrive from the network, so the hasher must resist HashDoS; foldhash
/// is seeded from a per-process random value and costs a few nanoseconds on
/// a 40-byte key (SipHash, std's default, costs about four times as much).
pub type DefaultHasher = foldhash::fast::RandomState;

/// A per-key token-bucket rate limiter, shared by reference between threads.
///
/// Each key has its own bucket of up to `capacity` tokens, refilled at
/// `rate` tokens per second; a call of cost `n` is admitted if the bucket
/// holds at least `n` tokens, and then spends them. A new key starts full.
/// Timestamps are `f64` seconds on any timeline the caller chooses, rounded
/// to whole nanoseconds. Use one timeline for every key (one clock, or Unix
/// time): the automatic sweep (on by default) evicts idle buckets that are
/// full at the timestamp of the call that triggers it (and at the start of
/// the sweep's previous pass), and a key without a bucket starts full
/// from the latest instant an evicted bucket was full from: a call
/// stamped earlier than a sweep (another thread read the clock first) is
/// then never given tokens its evicted bucket did not hold, but a key on
/// a timeline far behind the others' would find its new bucket short of
/// tokens. With per-key timelines, turn the sweep off
/// ([`with_auto_sweep`](Self::with_auto_sweep)) and [`sweep`](Self::sweep)
/// yourself.
///
/// All methods take `&self`: share the limiter with an [`Arc`](std::sync::Arc)
/// or a `static`.
///
/// # Locking behaviour
///
/// Buckets live in a map of 256 shards, each a hashbrown table behind its
/// own read-write lock (the shape of a `DashMap`). A call holds
/// its key's shard's write lock while it updates the key's word in place
/// (taking the lock costs the same shared write as a read lock would, and
/// saves a compare-and-swap); [`remaining`](Self::remaining) takes the read
/// lock. A key that one thread keeps calling is cached by that thread and
/// then spent with one compare-and-swap and no lock at all (see
/// [`with_hot_key_cache`](Self::with_hot_key_cache)), as is a
/// [`BucketHandle`]. Under a lock, only the key type's own `Hash`, `Eq`
/// and `Drop` run (the map hashes, compares and drops keys under its
/// locks); as long as those do not call the limiter, no method can
/// deadlock another.
///
/// # Examples
///
/// ```
/// use keyrate::TokenBucketLimiter;
///
/// let limiter = TokenBucketLimiter::new(1.0, 3);
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 0.0));
/// assert!(!limiter.allow("key1", 0.0));
/// assert!(limiter.allow("key1", 2.0));
/// ```
pub struct TokenBucketLimiter<K = String, S = DefaultHasher> {
    /// The default quota, for calls that do not name their own; shared
    /// with handles, replaced by `set_quota`.
    quota: std::sync::Arc<LiveQuota>,
    /// Each key's bucket, inline: one word per entry. An entry whose word is
    /// `MOVED` has moved its bucket to `moved`.
    buckets: Map<K, Bucket, S>,
    /// The buckets of keys that have had a [`BucketHandle`], behind an
    /// `Arc` the handles share. Lock order: `buckets` first, then `moved`
    /// (see `life`).
    moved: Map<K, Moved, S>,
    /// Bucket accounting for the cap and the automatic sweep.
    occupancy: Occupancy,
    /// This limiter's buckets in the per-thread hot-key caches.
    hot: HotKeys,
    /// Read by calls at `Now` only.
    clock: std::sync::Arc<dyn Clock>,
    /// Counters and offender sketches (see `observe`); shared with handles.
    observer: std::sync::Arc<Observer<K, S>>,
}

impl<K, S> fmt::Debug for TokenBucketLimiter<K, S>
where
    K: Hash + Eq,
    S: BuildHasher + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucketLimiter")
            .field("quota", &self.quota.load())
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

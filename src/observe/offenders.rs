//! The keys denied most often in a recent window: per-thread space-saving
//! sketches over a rotating pair of epochs, merged on read.
//!
//! Each thread slot (see `slot`) has its own sketch of
//! [`OFFENDER_SLOTS`](crate::OFFENDER_SLOTS) counters per epoch. An
//! offence (a denial for want of tokens, see `Observer::decided`)
//! hashes its key with the limiter's hasher and looks the hash up among the
//! current epoch's counters: a key already there costs a load and a store
//! on memory only this thread writes. A key not there takes a free counter,
//! or the one with the fewest denials (space-saving: it inherits that count
//! plus one), and only then is the key copied, under the sketch's lock,
//! which a read also takes. Memory is therefore bounded by the number of
//! threads, whatever keys arrive.
//!
//! Time is cut into epochs of one window each (by the calls' timestamps);
//! a sketch keeps the current epoch and the one before, and a read merges
//! the sketches of the latest two epochs seen by any thread: the window
//! covers the last one to two epoch lengths.

use super::label::{KeyLabels, Shown};
use super::slot;
use crate::sync::unmodeled::{AtomicU64, AtomicUsize, Relaxed};
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::OnceLock;

/// Counters per thread and epoch in the offenders sketch: the error bound
/// of [`TokenBucketLimiter::top_offenders`](crate::TokenBucketLimiter::top_offenders)
/// is the window's denials divided by this.
pub const OFFENDER_SLOTS: usize = 32;

/// The keys denied most often in a recent window, with approximate counts.
///
/// Returned by [`TokenBucketLimiter::top_offenders`](crate::TokenBucketLimiter::top_offenders).
/// A denial counts when it is for want of tokens
/// ([`Denial::InsufficientTokens`](crate::Denial::InsufficientTokens)),
/// which only a key that has a bucket, and has spent it, can get: denials
/// that spend nothing (a cost above the capacity, a new key at the cap)
/// would let a flood of random one-shot keys push real offenders out of
/// the list for free.
///
/// # Keys
///
/// `top` holds the keys themselves: they are the caller's. Its `Debug`
/// shows each key as its fingerprint (see [`KeyLabels`]), never the raw
/// key, and [`labelled`](Self::labelled) makes the list to export
/// (metrics, logs) under a [`KeyLabels`] policy.
///
/// # Error bound
///
/// Each count differs from the key's true number of denials in the window
/// by at most `max_error`, and `max_error` is at most
/// `denials / OFFENDER_SLOTS` (space-saving's bound, summed over the
/// per-thread sketches). So a key denied more than `max_error` times is
/// always among the keys counted, and a key denied more than
/// `2 * max_error` times more than another is listed ahead of it. Keys
/// are identified by their 64-bit hash
/// under the limiter's hasher: two keys with the same hash (for a seeded
/// hasher, a chance of about `2^-64` per pair) count as one.
///
/// # Examples
///
/// ```
/// use keyrate::TokenBucketLimiter;
///
/// let limiter = TokenBucketLimiter::new(1.0, 1).with_top_offenders(true);
/// for _ in 0..10 {
///     let _ = limiter.allow("abuser", 0.0);
/// }
/// let _ = limiter.allow("polite", 0.0);
/// let offenders = limiter.top_offenders(5);
/// assert_eq!(offenders.top, vec![("abuser".to_string(), 9)]);
/// assert_eq!(offenders.denials, 9);
/// assert_eq!(offenders.max_error, 0); // the sketch never filled up
/// assert!(!format!("{offenders:?}").contains("abuser")); // a fingerprint
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Offenders<K> {
    /// The keys with the most denials, most first, each with its
    /// approximate count of denials in the window.
    pub top: Vec<(K, u64)>,
    /// The most by which any count in `top` can differ from the true
    /// count, up or down; at most `denials / OFFENDER_SLOTS`.
    pub max_error: u64,
    /// Denials counted in the window, over all keys.
    pub denials: u64,
}

impl<K> Offenders<K> {
    /// The list to export: each key shown by `labels` (its `Display` text
    /// labelled), keys that get the same label counted as one (their
    /// counts added), most first.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{KeyLabels, TokenBucketLimiter};
    ///
    /// let limiter = TokenBucketLimiter::new(1.0, 1).with_top_offenders(true);
    /// for key in ["sk_live_aaaaaaaa", "sk_live_aaaaaaaa", "sk_live_bbbbbbbb"] {
    ///     let _ = limiter.allow(key, 0.0);
    ///     let _ = limiter.allow(key, 0.0);
    /// }
    /// let offenders = limiter.top_offenders(10);
    /// let exported = offenders.labelled(&KeyLabels::fingerprint());
    /// assert!(exported.top[0].0.starts_with('#')); // no character of the key
    /// let tagged = offenders.labelled(&KeyLabels::fingerprint().with_type_tags(["sk_live_"]));
    /// assert!(tagged.top[0].0.starts_with("sk_live_#"));
    /// assert_eq!(exported.top[0].1, 3);
    /// let by_customer = offenders.labelled(&KeyLabels::with(|_| "acme".to_owned()));
    /// assert_eq!(by_customer.top, vec![("acme".to_owned(), 4)]);
    /// ```
    #[must_use]
    pub fn labelled(&self, labels: &KeyLabels) -> Offenders<String>
    where
        K: fmt::Display,
    {
        let mut merged: Vec<(String, u64)> = Vec::with_capacity(self.top.len());
        for (key, count) in &self.top {
            let label = labels.label(&key.to_string());
            match merged.iter_mut().find(|(l, _)| *l == label) {
                Some((_, total)) => *total += count,
                None => merged.push((label, *count)),
            }
        }
        merged.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
        Offenders {
            top: merged,
            max_error: self.max_error,
            denials: self.denials,
        }
    }
}

impl<K: Hash + fmt::Debug> fmt::Debug for Offenders<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let top: Vec<_> = self
            .top
            .iter()
            .map(|(key, count)| (Shown(key), count))
            .collect();
        f.debug_struct("Offenders")
            .field("top", &top)
            .field("max_error", &self.max_error)
            .field("denials", &self.denials)
            .finish()
    }
}

/// A hash that marks a free counter; real hashes of 0 are stored as 1.
const FREE: u64 = 0;

/// One epoch's space-saving counters.
struct Sketch {
    /// The key hash each counter counts, `FREE` if none. Written only
    /// under the stripe's lock.
    hash: [AtomicU64; OFFENDER_SLOTS],
    /// Denials counted (including those inherited from the key it replaced).
    count: [AtomicU64; OFFENDER_SLOTS],
}

impl Sketch {
    fn new() -> Self {
        Sketch {
            hash: Default::default(),
            count: Default::default(),
        }
    }

    /// The counter of `hash`, trying `hint` first.
    #[inline]
    fn find(&self, hash: u64, hint: usize) -> Option<usize> {
        // Relaxed: `hash` is written only by this stripe's writer (or under
        // the lock that every writer of an overflow stripe holds).
        if self.hash[hint].load(Relaxed) == hash {
            return Some(hint);
        }
        self.hash.iter().position(|h| h.load(Relaxed) == hash)
    }

    fn clear(&self) {
        for (hash, count) in self.hash.iter().zip(&self.count) {
            hash.store(FREE, Relaxed);
            count.store(0, Relaxed);
        }
    }
}

/// The keys of a stripe's counters, and their space-saving errors:
/// `keys[epoch & 1][i]` goes with `sketches[epoch & 1]`'s counter `i`.
type Keys<K> = [[Option<(K, u64)>; OFFENDER_SLOTS]; 2];

fn no_keys<K>() -> [Option<(K, u64)>; OFFENDER_SLOTS] {
    std::array::from_fn(|_| None)
}

/// One thread slot's sketches: the current epoch's and the one before.
struct Stripe<K> {
    /// The epoch that `sketches[epoch & 1]` counts; `sketches[!epoch & 1]`
    /// counts the epoch before. Written under `keys`' lock.
    epoch: AtomicU64,
    /// Where `epoch` ends, in nanoseconds: a denial at or after it rotates
    /// the epochs. Written under `keys`' lock.
    end: AtomicU64,
    /// The counter that matched last: a key hammering this thread is
    /// found at the first try.
    hint: AtomicUsize,
    sketches: [Sketch; 2],
    keys: Mutex<Box<Keys<K>>>,
}

impl<K> Stripe<K> {
    fn new() -> Self {
        Stripe {
            epoch: AtomicU64::new(0),
            end: AtomicU64::new(0),
            hint: AtomicUsize::new(0),
            sketches: [Sketch::new(), Sketch::new()],
            keys: Mutex::new(Box::new([no_keys(), no_keys()])),
        }
    }

    /// Counts a denial of the key hashed `hash` at `now`; `key` copies the
    /// key if it enters the sketch. `exclusive`: the caller is this
    /// stripe's only writer, and may count a known key without the lock.
    #[inline]
    fn record(&self, hash: u64, now: u64, window: u64, key: impl FnOnce() -> K, exclusive: bool) {
        // Relaxed throughout the unlocked path: the only writer of every
        // word it reads is this thread (see `slot`).
        if exclusive && now < self.end.load(Relaxed) {
            let epoch = self.epoch.load(Relaxed);
            let sketch = &self.sketches[(epoch & 1) as usize];
            if let Some(i) = sketch.find(hash, self.hint.load(Relaxed)) {
                let count = &sketch.count[i];
                count.store(count.load(Relaxed) + 1, Relaxed);
                self.hint.store(i, Relaxed);
                return;
            }
        }
        let mut keys = self.keys.lock();
        self.rotate(&mut keys, now, window);
        let epoch = self.epoch.load(Relaxed);
        let sketch = &self.sketches[(epoch & 1) as usize];
        let keys = &mut keys[(epoch & 1) as usize];
        let i = match sketch.find(hash, self.hint.load(Relaxed)) {
            Some(i) => {
                sketch.count[i].store(sketch.count[i].load(Relaxed) + 1, Relaxed);
                i
            }
            None => {
                // A free counter, else the smallest: the newcomer inherits
                // its count as its error (space-saving).
                let i = (0..OFFENDER_SLOTS)
                    .min_by_key(|&i| {
                        let free = sketch.hash[i].load(Relaxed) == FREE;
                        (!free, sketch.count[i].load(Relaxed))
                    })
                    .unwrap_or(0);
                let error = sketch.count[i].load(Relaxed);
                keys[i] = Some((key(), error));
                sketch.count[i].store(error + 1, Relaxed);
                sketch.hash[i].store(hash, Relaxed);
                i
            }
        };
        self.hint.store(i, Relaxed);
    }

    /// Moves to the epoch of `now` if it is past the current one.
    fn rotate(&self, keys: &mut Keys<K>, now: u64, window: u64) {
        if now < self.end.load(Relaxed) {
            return;
        }
        let old = self.epoch.load(Relaxed);
        let new = now / window;
        if new > old {
            // The sketch that becomes current held the epoch before `old`
            // (or anything, after a gap of more than one epoch).
            for epoch in [new, new - 1] {
                let side = (epoch & 1) as usize;
                if epoch != old {
                    self.sketches[side].clear();
                    keys[side] = no_keys();
                }
            }
            self.epoch.store(new, Relaxed);
        }
        self.end
            .store(new.saturating_add(1).saturating_mul(window), Relaxed);
    }
}

/// A stripe, allocated at its thread's first denial, on cache lines of its
/// own (padded, so that a neighbouring allocation cannot share them).
type LazyStripe<K> = CachePadded<OnceLock<Box<CachePadded<Stripe<K>>>>>;

/// A limiter's offender sketches, one per thread slot plus a shared one.
pub(crate) struct OffenderSketch<K> {
    /// Allocated at a thread's first denial; the last one is shared by
    /// threads without a stripe of their own.
    stripes: Box<[LazyStripe<K>]>,
    /// The epoch length in nanoseconds.
    window: u64,
}

impl<K: Hash + Eq> OffenderSketch<K> {
    pub(crate) fn new(window_nanos: u64) -> Self {
        OffenderSketch {
            stripes: (0..=slot::stripes())
                .map(|_| CachePadded::new(OnceLock::new()))
                .collect(),
            window: window_nanos.max(1),
        }
    }

    /// Counts a denial at `now`, by the thread in slot `index` (see
    /// `slot::index`), of the key that `hash` stands for; `key` copies it,
    /// called only if it enters the sketch.
    #[inline]
    pub(crate) fn record(&self, index: usize, hash: u64, now: u64, key: impl FnOnce() -> K) {
        let hash = if hash == FREE { 1 } else { hash };
        let last = self.stripes.len() - 1;
        let index = index.min(last);
        let stripe = self.stripes[index].get_or_init(|| Box::new(CachePadded::new(Stripe::new())));
        stripe.record(hash, now, self.window, key, index < last);
    }

    /// Merges every thread's sketches of the latest two epochs.
    pub(crate) fn read(&self, n: usize) -> Offenders<K>
    where
        K: Clone,
    {
        let stripes = || self.stripes.iter().filter_map(|s| s.get());
        // Relaxed: the epochs only choose which sketches count as recent.
        let latest = stripes().map(|s| s.epoch.load(Relaxed)).max();
        let mut merged: HashMap<K, u64> = HashMap::new();
        let (mut denials, mut max_error) = (0, 0);
        for stripe in stripes() {
            // The lock orders every key and hash written under it before
            // this read; counts of known keys may still be rising.
            let keys = stripe.keys.lock();
            let epoch = stripe.epoch.load(Relaxed);
            for e in [Some(epoch), epoch.checked_sub(1)].into_iter().flatten() {
                if latest.is_some_and(|latest| e + 1 < latest) {
                    continue;
                }
                let side = (e & 1) as usize;
                let sketch = &stripe.sketches[side];
                let mut smallest = u64::MAX;
                for (i, slot) in keys[side].iter().enumerate() {
                    let count = sketch.count[i].load(Relaxed);
                    match slot {
                        Some((key, _)) if sketch.hash[i].load(Relaxed) != FREE => {
                            *merged.entry(key.clone()).or_insert(0) += count;
                            denials += count;
                            smallest = smallest.min(count);
                        }
                        _ => smallest = 0,
                    }
                }
                // A full sketch misses keys denied at most `smallest` times,
                // and overcounts a listed key by at most as much.
                max_error += smallest;
            }
        }
        let mut top: Vec<(K, u64)> = merged.into_iter().collect();
        top.sort_unstable_by_key(|&(_, count)| std::cmp::Reverse(count));
        top.truncate(n);
        Offenders {
            top,
            max_error,
            denials,
        }
    }
}

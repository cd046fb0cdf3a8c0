//! Removing idle keys (those holding no permit, with no one waiting), by
//! hand or by the automatic sweep, and the cap on keys.

use super::slot::{Slot, Visit};
use super::ConcurrencyLimiter;
use crate::guard::Tally;
// Table buckets a step visits: a few hundred entries at most, as in the
// buckets' sweep.
use crate::pace::SWEEP_SLICE;
use crate::store::{Cursor, Map};
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering};
use std::hash::{BuildHasher, Hash};

/// Creations of new entries between two steps of the automatic sweep.
/// Under loom, every creation takes a step, so that the models race the
/// sweep's real protocol against every call.
#[cfg(not(loom))]
const SWEEP_EVERY: usize = 16;
#[cfg(loom)]
const SWEEP_EVERY: usize = 1;

/// The automatic sweep's pacing and position, and the cap.
///
/// A step every [`SWEEP_EVERY`] creations visits the next
/// [`SWEEP_SLICE`] table buckets of the current shard, shard after shard.
/// A pass over the map takes one step per shard (256) while each shard's
/// table has at most 256 buckets (up to about 57,000 entries in all), and
/// one more per further 256 buckets: so it spans `16 x max(256, buckets /
/// 256)` creations, 4,096 while the map is below that size
/// (a step skipped because another is running only lengthens it).
///
/// The second-chance rule ([`Slot::visit`]): every take marks its slot
/// used; a pass that finds an idle slot marked clears the mark, and one
/// that finds it idle and unmarked removes it. So an entry is removed only
/// if no permit was taken on it since the previous pass visited it (it was
/// idle for a whole pass at least), and a key taken at least once between
/// two passes is never removed, however many other keys come and go.
///
/// The bound: an idle entry was taken since the pass before the current
/// one visited it, so the entries are the keys holding permits or waited
/// for, plus at most the keys taken within the last three passes. A pass
/// lasts 4,096 creations while the map is small, and a key taken
/// once creates one entry, so under a flood of keys that each take and
/// give back one permit the idle entries stay at most `3 x 4,096 =
/// 12,288` (a pass leaves the creations of up to two passes, and the
/// current pass adds its own); keys in steady use are kept on top.
pub(super) struct Sweeper {
    /// Entries held when capped (else not kept), plus places reserved by
    /// creations in flight; at most `max_keys`.
    keys: AtomicUsize,
    /// Creations (and refusals at the cap) so far, for pacing.
    created: AtomicUsize,
    /// Where the next step starts: a shard and a place in it. Taken with
    /// `try_lock`: a step that finds another running skips.
    position: Mutex<(usize, Cursor)>,
    pub(super) max_keys: usize,
}

impl Sweeper {
    pub(super) fn new() -> Self {
        Sweeper {
            keys: AtomicUsize::new(0),
            created: AtomicUsize::new(0),
            position: Mutex::new((0, Cursor::default())),
            max_keys: usize::MAX,
        }
    }

    fn capped(&self) -> bool {
        self.max_keys != usize::MAX
    }

    /// Reserves a place for a new entry; false at the cap.
    pub(super) fn reserve(&self) -> bool {
        if !self.capped() {
            return true;
        }
        // Relaxed: the counter alone decides; the read-modify-write makes
        // racing reservations see each other, so at most `max_keys` pass.
        let before = self.keys.fetch_add(1, Ordering::Relaxed);
        if before < self.max_keys {
            return true;
        }
        self.release(1);
        false
    }

    /// Gives back `n` places.
    pub(super) fn release(&self, n: usize) {
        if self.capped() && n > 0 {
            // Relaxed: see `reserve`.
            self.keys.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Counts a creation (or a refusal at the cap), and takes a sweep
    /// step when one is due; returns the entries it removed.
    pub(super) fn pace<K: Hash + Eq, S: BuildHasher + Clone>(
        &self,
        slots: &Map<K, Arc<Slot>, S>,
    ) -> usize {
        // Relaxed: the count only paces the sweep; it decides nothing.
        let count = self.created.fetch_add(1, Ordering::Relaxed) + 1;
        // Under loom SWEEP_EVERY is 1: every creation steps.
        #[allow(clippy::modulo_one)]
        let off_beat = count % SWEEP_EVERY != 0;
        if off_beat {
            return 0;
        }
        // A step already running serves for this one.
        let Ok(mut position) = self.position.try_lock() else {
            return 0;
        };
        let (shard, at) = *position;
        // Places given back however the slice ends (a key's `Drop` may
        // panic on eviction).
        let removed = Tally::new(|n| self.release(n));
        let next = slots.retain_slice(shard, at, SWEEP_SLICE, |_, slot| {
            let retire = slot.visit() == Visit::Retired;
            removed.add(retire);
            !retire
        });
        *position = match next {
            Ok(at) => (shard, at),
            Err(_) => ((shard + 1) % slots.shard_count(), Cursor::default()),
        };
        drop(position);
        removed.settle()
    }
}

/// # Housekeeping
impl<K: Hash + Eq, S: BuildHasher + Clone> ConcurrencyLimiter<K, S> {
    /// Removes every idle key (holding no permit, with no caller waiting);
    /// returns how many. An idle key is indistinguishable from one never
    /// seen, so this changes no decision. The automatic sweep does the
    /// same a slice at a time, paced by new keys, but removes only the
    /// keys idle since its previous pass.
    ///
    /// Each idle slot is retired (its word set to a final marker, from 0
    /// only, with a compare-and-swap) before its entry is removed, so a
    /// caller that found the slot before it was removed and takes a permit
    /// on it meanwhile either wins (the slot is then not idle and stays)
    /// or finds it retired and looks the key up again.
    ///
    /// # Locking behaviour
    ///
    /// Takes each shard's write lock in turn.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = keyrate::ConcurrencyLimiter::new(1);
    /// let held = limiter.try_acquire("a").unwrap();
    /// drop(limiter.try_acquire("b").unwrap());
    /// assert_eq!(limiter.sweep(), 1); // "b"
    /// assert_eq!(limiter.len(), 1);
    /// drop(held);
    /// assert_eq!(limiter.sweep(), 1); // "a"
    /// assert!(limiter.is_empty());
    /// ```
    pub fn sweep(&self) -> usize {
        let removed = Tally::new(|n| self.sweeper.release(n));
        self.slots.retain(|_, slot| {
            let retire = slot.try_retire();
            removed.add(retire);
            !retire
        });
        let removed = removed.settle();
        self.counters.removed(removed);
        removed
    }
}

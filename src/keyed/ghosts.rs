//! Ghosts of evicted keys: a small sample of the keys the automatic sweep
//! evicted, so that it can tell when the keys it evicts come back (its
//! passes are then too short for the traffic) from a stream of keys that
//! are each seen once (its passes should then stay short).
//!
//! A key is watched when its hash says so (one in [`SAMPLE`], by bits that
//! neither the shards, hashbrown nor the hot-key cache use): when the sweep
//! evicts a watched key, its fingerprint and the pass number go into one
//! of [`SLOTS`] slots (direct-mapped, the newest wins); when a watched key
//! gets a new bucket, its slot says whether it was evicted within the
//! last [`HORIZON`] passes. The sweep's pacing reads the two counts once a
//! pass. Nothing here decides what is evicted, so every access is
//! `Relaxed` and uses `unmodeled` atomics: loom has nothing to check, and
//! the models keep the pacing they had.

use crate::sync::unmodeled::{AtomicU32, AtomicUsize, Relaxed};

/// One key in this many is watched. Rare enough that a million keys
/// evicted between two calls of each fill the slots about once over
/// (a watched key's ghost then survives with odds of about 2 in 5, plenty
/// to see that most new buckets are returning keys); common enough that a
/// pass of 8192 creations watches about 32 of them.
const SAMPLE: u64 = 256;

/// Ghost slots: 16 KiB per limiter.
const SLOTS: usize = 4096;

/// Bits of a slot that hold the pass number (the rest hold the key's
/// fingerprint).
const PASS_BITS: u32 = 12;
const PASS_MASK: u32 = (1 << PASS_BITS) - 1;

/// How many passes back an eviction still counts: a key that comes back
/// later than this is a new key for the pacing. Below `2^PASS_BITS`, so
/// that a pass number's wrap cannot make an old ghost look recent.
const HORIZON: u32 = 256;

/// The sampled evictions and returns (see the module docs).
pub(super) struct Ghosts {
    /// Per slot: a watched key's fingerprint above `PASS_BITS` bits of the
    /// pass number that evicted it; 0 when never written (a watched key
    /// whose fingerprint is 0 then looks evicted in a pass numbered 0
    /// modulo 4096: a rare and harmless false return).
    slots: Box<[AtomicU32]>,
    /// The pass the automatic sweep is in: passes ended so far (wrapping).
    pass: AtomicU32,
    /// Watched keys given a new bucket since the pacing last read this.
    watched: AtomicUsize,
    /// Of those, the keys evicted within the last `HORIZON` passes.
    returned: AtomicUsize,
}

/// Where a watched key's ghost lives, and the fingerprint that tells it
/// from the other keys of that slot; `None` for a key that is not watched.
/// Under loom no key is watched: the model's map hashes every key to 0,
/// and the models keep the pacing they were written for.
fn ghost_of(hash: u64) -> Option<(usize, u32)> {
    // Bits 32..40: not the shard's (49..57), hashbrown's tag (57..64),
    // the hot-key sets' (8..13) or tags (24..32).
    if cfg!(loom) || (hash >> 32) % SAMPLE != 0 {
        return None;
    }
    let slot = hash as usize % SLOTS;
    // The 20 bits above the slot's.
    let fingerprint = (hash >> 12) as u32 & ((1 << (32 - PASS_BITS)) - 1);
    Some((slot, fingerprint << PASS_BITS))
}

impl Ghosts {
    pub(super) fn new() -> Self {
        Ghosts {
            slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            pass: AtomicU32::new(0),
            watched: AtomicUsize::new(0),
            returned: AtomicUsize::new(0),
        }
    }

    /// The sweep evicted the key whose hash is `hash`.
    pub(super) fn evicted(&self, hash: u64) {
        if let Some((slot, fingerprint)) = ghost_of(hash) {
            // Relaxed, here and below: a ghost only paces the sweep
            // (module docs); a stale pass number misdates it by one pass.
            let tag = self.pass.load(Relaxed) & PASS_MASK;
            self.slots[slot].store(fingerprint | tag, Relaxed);
        }
    }

    /// The key whose hash is `hash` got a new bucket.
    #[inline]
    pub(super) fn created(&self, hash: u64) {
        if let Some((slot, fingerprint)) = ghost_of(hash) {
            self.created_watched(slot, fingerprint);
        }
    }

    #[cold]
    #[inline(never)]
    fn created_watched(&self, slot: usize, fingerprint: u32) {
        // Relaxed: counts for the pacing only (module docs).
        self.watched.fetch_add(1, Relaxed);
        let ghost = self.slots[slot].load(Relaxed);
        let age = self.pass.load(Relaxed).wrapping_sub(ghost) & PASS_MASK;
        if ghost & !PASS_MASK == fingerprint && age < HORIZON {
            self.returned.fetch_add(1, Relaxed);
        }
    }

    /// Ends a pass: returns the watched keys given a new bucket during it,
    /// and how many of them the sweep had evicted within the last
    /// `HORIZON` passes. Called by the sweep step that ends the pass.
    pub(super) fn end_pass(&self) -> (usize, usize) {
        // Relaxed: counts for the pacing only; the swaps lose none.
        self.pass.fetch_add(1, Relaxed);
        (
            self.watched.swap(0, Relaxed),
            self.returned.swap(0, Relaxed),
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A hash that is watched, in slot `slot`, with fingerprint `fp`.
    fn watched(slot: u64, fp: u64) -> u64 {
        (fp << 12) | slot
    }

    #[test]
    fn a_key_evicted_recently_counts_as_a_return() {
        let ghosts = Ghosts::new();
        let key = watched(7, 0xabcde);
        assert!(ghost_of(key).is_some());
        assert!(ghost_of(key | 1 << 32).is_none(), "not watched");
        ghosts.evicted(key);
        ghosts.created(key);
        assert_eq!(ghosts.end_pass(), (1, 1));
        for _ in 2..HORIZON {
            assert_eq!(ghosts.end_pass(), (0, 0));
        }
        ghosts.created(key);
        assert_eq!(ghosts.end_pass(), (1, 1), "evicted HORIZON - 1 passes ago");
        ghosts.created(key);
        assert_eq!(ghosts.end_pass(), (1, 0), "evicted too long ago");
        ghosts.evicted(key);
        ghosts.created(watched(7, 0xabcdf));
        assert_eq!(ghosts.end_pass(), (1, 0), "another key of the slot");
        ghosts.created(key | 1 << 32);
        assert_eq!(ghosts.end_pass(), (0, 0), "not watched");
    }
}

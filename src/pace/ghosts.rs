//! Ghosts of evicted keys: a small sample of the keys the automatic sweep
//! evicted, so that it can tell when the keys it evicts come back (its
//! passes are then too short for the traffic) from a stream of keys that
//! are each seen once (its passes should then stay short).
//!
//! The sweep records one eviction in [`SAMPLE`], picked at random, so that
//! only those keys are hashed again (a key's hash is not kept in the map):
//! the key's fingerprint and the pass number go into one of [`SLOTS`]
//! slots (direct-mapped, the newest wins). Every new bucket's key (whose
//! hash the creation has) is looked up in its slot: a match evicted
//! within the last [`HORIZON`] passes is a return. The returns are
//! compared with the creations counted one in [`SAMPLE`] (by bits of the
//! hash that neither the shards, hashbrown nor the hot-key cache use), so
//! that both counts are sampled at the same rate. The sweep's pacing reads
//! the two counts once a pass. Nothing here decides what is evicted, so
//! every access is `Relaxed` and uses `unmodeled` atomics: loom has
//! nothing to check, and the models keep the pacing they had.

use crate::sync::unmodeled::{AtomicU32, AtomicUsize, Relaxed};
use std::sync::OnceLock;

/// One eviction in this many is recorded, and one creation in this many
/// counted. Common enough that a pass at the floor (8,192 creations)
/// counts about 512 of them, and sees the keys it evicted come back
/// within a pass or two: at 256, the everyday workload's first sightings
/// (`examples/pacing.rs`, 10^6 keys) ran four to seven passes at the floor
/// before two returns were seen, each pass evicting 8,000 keys that came
/// back (a quarter of a percent of the calls each); at 64, one to five
/// (`BENCHMARKS.md`, fifteenth round). Rare enough that the hashes of
/// the keys recorded (a sixteenth of those a slice evicts, each a cold
/// read) cost the churn 3 instructions a call (559 against 556).
const SAMPLE: u64 = 16;

/// Ghost slots: 64 KiB per limiter, allocated on its first recorded
/// eviction (a limiter that never evicts, or has not yet, carries none).
/// Enough that the evictions recorded over a few passes of a million-key
/// map do not overwrite each other before their keys come back (with
/// 4,096 and one in 64 recorded, the everyday workload's re-creations at
/// 10^6 keys read 0.95% of the calls against 0.70, median of eight runs).
const SLOTS: usize = 1 << SLOT_BITS;
const SLOT_BITS: u32 = 14;

/// Bits of a slot that hold the pass number (the rest hold the key's
/// fingerprint).
const PASS_BITS: u32 = 12;
const PASS_MASK: u32 = (1 << PASS_BITS) - 1;

/// How many passes back an eviction still counts: a key that comes back
/// later than this is a new key for the pacing. Below `2^PASS_BITS`, so
/// that a pass number's wrap cannot make an old ghost look recent.
const HORIZON: u32 = 256;

/// The sampled evictions and returns (see the module docs).
pub(crate) struct Ghosts {
    /// Per slot: a recorded key's fingerprint above `PASS_BITS` bits of
    /// the pass number that evicted it; 0 when never written (and ignored:
    /// a key of fingerprint 0 evicted in a pass numbered 0 modulo 4096 is
    /// a return missed, rare and harmless). Allocated by the first
    /// [`evicted`](Self::evicted): until then no key can be a return.
    /// (A `OnceLock` under loom too: its one-time allocation does no
    /// modelled operation, so loom never switches threads inside it.)
    slots: OnceLock<Box<[AtomicU32]>>,
    /// The pass the automatic sweep is in: passes ended so far (wrapping).
    pass: AtomicU32,
    /// New buckets counted (one in [`SAMPLE`]) since the pacing last read
    /// this.
    watched: AtomicUsize,
    /// New buckets, all of them, whose key had a recorded ghost of the
    /// last `HORIZON` passes since the pacing last read this.
    returned: AtomicUsize,
}

/// Where a key's ghost lives, and the fingerprint that tells it from the
/// other keys of that slot.
fn ghost_of(hash: u64) -> (usize, u32) {
    let slot = hash as usize % SLOTS;
    // Bits 40..60: none of the slot's, nor the sample's (`counted`).
    let fingerprint = (hash >> 40) as u32 & ((1 << (32 - PASS_BITS)) - 1);
    (slot, fingerprint << PASS_BITS)
}

/// Whether a creation counts toward the returns' denominator: one key in
/// [`SAMPLE`], by bits 32..38 of its hash (not the shard's, 49..57,
/// hashbrown's tag, 57..64, the hot-key sets', 8..13, or tags, 24..32).
fn counted(hash: u64) -> bool {
    (hash >> 32) % SAMPLE == 0
}

impl Ghosts {
    pub(crate) fn new() -> Self {
        Ghosts {
            slots: OnceLock::new(),
            pass: AtomicU32::new(0),
            watched: AtomicUsize::new(0),
            returned: AtomicUsize::new(0),
        }
    }

    /// Records that the sweep evicted the key whose hash is `hash`. The
    /// sweep calls this for one eviction in [`SAMPLE`] (see
    /// [`Ghosts::sampled`]).
    pub(crate) fn evicted(&self, hash: u64) {
        let (slot, fingerprint) = ghost_of(hash);
        // Relaxed, here and below: a ghost only paces the sweep (module
        // docs); a stale pass number misdates it by one pass.
        let tag = self.pass.load(Relaxed) & PASS_MASK;
        let slots = self
            .slots
            .get_or_init(|| (0..SLOTS).map(|_| AtomicU32::new(0)).collect());
        slots[slot].store(fingerprint | tag, Relaxed);
    }

    /// Whether the sweep records this eviction: one in [`SAMPLE`], at
    /// random (`one_in` draws from the calling thread's dice). Under loom
    /// none is: the model's map hashes every key to 0, and the models keep
    /// the pacing they were written for.
    #[inline]
    pub(crate) fn sampled(one_in: impl FnOnce(usize) -> bool) -> bool {
        !cfg!(loom) && one_in(SAMPLE as usize)
    }

    /// The key whose hash is `hash` got a new bucket.
    #[inline]
    pub(crate) fn created(&self, hash: u64) {
        if cfg!(loom) {
            return;
        }
        if counted(hash) {
            self.counted();
        }
        // No eviction recorded yet: no ghost to match.
        let Some(slots) = self.slots.get() else {
            return;
        };
        let (slot, fingerprint) = ghost_of(hash);
        // Relaxed: counts for the pacing only (module docs).
        let ghost = slots[slot].load(Relaxed);
        if ghost & !PASS_MASK == fingerprint {
            self.returned(ghost);
        }
    }

    #[cold]
    #[inline(never)]
    fn counted(&self) {
        // Relaxed: counts for the pacing only (module docs).
        self.watched.fetch_add(1, Relaxed);
    }

    /// A new bucket's key matched the ghost `ghost`: a return if the
    /// ghost is recent.
    #[cold]
    #[inline(never)]
    fn returned(&self, ghost: u32) {
        // Relaxed: counts for the pacing only (module docs).
        let age = self.pass.load(Relaxed).wrapping_sub(ghost) & PASS_MASK;
        if ghost != 0 && age < HORIZON {
            self.returned.fetch_add(1, Relaxed);
        }
    }

    /// Ends a pass: returns the new buckets counted during it (one in
    /// [`SAMPLE`]) and the returns among all of them (each key's eviction
    /// recorded one time in [`SAMPLE`]): two samples at one rate. Called
    /// by the sweep step that ends the pass.
    pub(crate) fn end_pass(&self) -> (usize, usize) {
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

    /// A hash in slot `slot` with fingerprint `fp`, counted unless `other`
    /// (bit 32 set).
    fn hash(slot: u64, fp: u64, other: bool) -> u64 {
        (fp << 40) | slot | u64::from(other) << 32
    }

    #[test]
    fn a_key_evicted_recently_counts_as_a_return() {
        let ghosts = Ghosts::new();
        let key = hash(7, 0xabcde, false);
        assert!(counted(key));
        assert!(!counted(hash(7, 0xabcde, true)));
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
        ghosts.created(hash(7, 0xabcdf, false));
        assert_eq!(ghosts.end_pass(), (1, 0), "another key of the slot");
        ghosts.evicted(hash(9, 0x12345, true));
        ghosts.created(hash(9, 0x12345, true));
        assert_eq!(ghosts.end_pass(), (0, 1), "a return, not counted");
        ghosts.created(hash(11, 0, false));
        assert_eq!(ghosts.end_pass(), (1, 0), "a slot never written");
    }

    #[test]
    fn the_slots_come_with_the_first_eviction() {
        let ghosts = Ghosts::new();
        let key = hash(3, 0x54321, false);
        ghosts.created(key);
        assert!(ghosts.slots.get().is_none(), "a creation allocates nothing");
        assert_eq!(ghosts.end_pass(), (1, 0), "counted with no slots");
        ghosts.evicted(key);
        assert_eq!(ghosts.slots.get().map(|slots| slots.len()), Some(SLOTS));
        ghosts.created(key);
        assert_eq!(ghosts.end_pass(), (1, 1));
    }

    #[test]
    fn one_eviction_in_sample_is_recorded() {
        assert!(Ghosts::sampled(|n| n == SAMPLE as usize));
        assert!(!Ghosts::sampled(|_| false));
    }
}

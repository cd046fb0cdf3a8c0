//! Where a key's hash puts it in a thread's cache: its set and tag
//! byte, the ways a tag word flags, and its vote counters.

use super::imp::{SETS, VOTE_SETS};

/// The set of a key whose hash is `hash`. Bits above the ones hashbrown
/// and the map's shards use, so that the keys of one shard spread over
/// all sets.
#[inline]
pub(super) fn set_of(hash: u64) -> usize {
    (hash >> 8) as usize % SETS
}

/// The byte that stands for `hash` in its set's tags: bits that
/// neither [`set_of`], the map's shards nor hashbrown use.
#[inline]
pub(super) fn tag_of(hash: u64) -> u8 {
    (hash >> 24) as u8
}

/// The ways of a set whose tag byte in `tags` is `tag`: a bit mask with
/// the top bit of each such way's byte set, possibly with stray bits
/// above a true match (the classic zero-byte test), which the caller's
/// full comparison discards.
#[inline]
pub(super) fn ways_tagged(tags: u64, tag: u8) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let zero_where_equal = tags ^ (u64::from(tag) * ONES);
    zero_where_equal.wrapping_sub(ONES) & !zero_where_equal & HIGHS
}

/// The vote set and tag of `hash` in limiter `limiter`. Two keys that
/// share both only share votes, and a promotion looks the key up
/// again, so a clash misdirects votes, never a decision.
#[inline]
pub(super) fn vote_of(limiter: u64, hash: u64) -> (usize, u32) {
    let mixed = hash ^ limiter.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((mixed >> 16) as usize % VOTE_SETS, mixed as u32)
}

//! Unit tests of the cache's tag lookup.

use super::tags::{tag_of, ways_tagged};

/// Every way whose tag matches is a candidate, and the lowest candidate
/// (the one a probe tries first) is always a true match.
#[test]
fn tagged_ways_include_every_match() {
    let mut state = 0x243f_6a88_85a3_08d3_u64;
    for round in 0..200_000u64 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let tag = tag_of(state.rotate_left(17));
        let mut bytes = state.to_le_bytes();
        // Plant the tag in a few ways, and its neighbours in others.
        for (way, byte) in bytes.iter_mut().enumerate() {
            match (round >> (3 * way)) % 4 {
                0 => *byte = tag,
                1 => *byte = tag.wrapping_add(1),
                2 => *byte = tag.wrapping_sub(1),
                _ => {}
            }
        }
        let mask = ways_tagged(u64::from_le_bytes(bytes), tag);
        for (way, &byte) in bytes.iter().enumerate() {
            let flagged = mask >> (8 * way + 7) & 1 == 1;
            assert!(byte != tag || flagged, "way {way} missed: {bytes:?} {tag}");
            assert_eq!(mask >> (8 * way) & 0x7f, 0, "only top bits: {mask:x}");
        }
        if mask != 0 {
            assert_eq!(bytes[mask.trailing_zeros() as usize / 8], tag);
        }
    }
}

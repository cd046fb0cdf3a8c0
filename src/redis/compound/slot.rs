//! Redis Cluster hash slots, computed locally: a compound call whose
//! buckets fall in different slots is refused before any round trip
//! (one script can only touch one slot's keys on a cluster).

use crate::compound::CompoundDenial;

/// The slots of a Redis Cluster.
const SLOTS: u16 = 16_384;

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
/// Redis Cluster hashes key names with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc
}

/// The hash slot of the Redis key `name`: the CRC of its hash tag (what
/// lies between its first `{` and the first `}` after it, when that is
/// not empty), else of the whole name.
pub(super) fn slot(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let tag = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&len| len > 0)
            .map(|len| &rest[..len])
    });
    crc16(tag.unwrap_or(bytes)) % SLOTS
}

/// Refuses names that do not all share the first one's slot, naming the
/// first scope that leaves it.
pub(super) fn one_slot(names: &[String]) -> Result<(), CompoundDenial> {
    let Some(first) = names.first() else {
        return Ok(());
    };
    let slot0 = slot(first);
    match names.iter().position(|name| slot(name) != slot0) {
        Some(second) => Err(CompoundDenial::CrossSlot { first: 0, second }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_cluster_s() {
        // CRC-16/XMODEM's check value, and slots Redis documents.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag hashes the whole name; only the first tag counts.
        assert_eq!(slot("{}foo"), crc16(b"{}foo") % SLOTS);
        assert_eq!(slot("a{b}{c}"), slot("b"));
        assert_eq!(slot("{b"), crc16(b"{b") % SLOTS);
    }

    #[test]
    fn one_slot_names_the_scope_that_leaves() {
        let names = |all: &[&str]| all.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(one_slot(&names(&["x{t}a", "y{t}b"])), Ok(()));
        assert_eq!(one_slot(&names(&[])), Ok(()));
        assert_eq!(
            one_slot(&names(&["{t}a", "{t}b", "foo"])),
            Err(CompoundDenial::CrossSlot {
                first: 0,
                second: 2
            })
        );
    }
}

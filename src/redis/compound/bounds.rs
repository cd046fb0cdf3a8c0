//! The deny mirror's bounds for compound buckets: per bucket key, lower
//! bounds of its words as Redis last showed this limiter.
//!
//! Each word only grows (a spend pushes it later; a key expires only once
//! every word is full), so a call that the bounds of every one of its
//! scopes deny is denied by Redis too, with the same binding quota and,
//! when no other process spends these buckets, the same wait to the
//! nanosecond. A call with a scope whose bound is unknown or stale goes to
//! Redis. Bounds are used for the mirror's refresh period after the call
//! that showed them, forgotten by this limiter's resets, and never learnt
//! from an answer to a call sent before such a reset (the mirror's
//! floor), as single-quota bounds are (see `mirror.rs`). Unlike those,
//! compound calls in flight are not coalesced: calls on a hammered key
//! that the bounds admit all go to Redis.

use crate::compound::decide::{self, Words};
use crate::time::Nanos;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hash::BuildHasher;

/// How many shards the bounds are spread over (a power of two).
const SHARDS: usize = 16;

/// One key's words and the local instant the call that showed them was
/// sent.
#[derive(Debug, Clone, Copy)]
struct Bound {
    words: Words,
    seen: Nanos,
}

type Shard = RwLock<HashMap<Box<str>, Bound, foldhash::fast::RandomState>>;

/// The compound bounds of one limiter and its clones.
pub(in crate::redis) struct WordBounds {
    shards: Box<[Shard]>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
    /// How long after its call was sent a bound may deny.
    refresh: Nanos,
}

impl WordBounds {
    pub(in crate::redis) fn new(capacity: usize, refresh: Nanos) -> Self {
        WordBounds {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            hasher: foldhash::fast::RandomState::default(),
            refresh,
        }
    }

    fn shard(&self, key: &str) -> &Shard {
        &self.shards[(self.hasher.hash_one(key) as usize) & (SHARDS - 1)]
    }

    /// `key`'s words, if shown recently enough (at local instant `now`)
    /// to deny with.
    pub(in crate::redis) fn bound(&self, key: &str, now: Nanos) -> Option<Words> {
        let shard = self.shard(key).read();
        let bound = shard.get(key)?;
        (now < bound.seen.saturating_add(self.refresh)).then_some(bound.words)
    }

    /// Learns that `key` held `words` at `now`, from a call sent at local
    /// instant `sent`, unless a later call already showed others or a
    /// reset came after this call (`sent` below `floor`, read under the
    /// shard lock).
    pub(in crate::redis) fn learn(
        &self,
        key: &str,
        words: Words,
        now: Nanos,
        sent: Nanos,
        floor: impl Fn() -> Nanos,
    ) {
        let mut shard = self.shard(key).write();
        if sent < floor() {
            return;
        }
        if let Some(bound) = shard.get_mut(key) {
            if sent >= bound.seen {
                *bound = Bound { words, seen: sent };
            }
            return;
        }
        // Full words are kept too: a call is denied locally only when
        // every scope's words are known, and a scope with tokens is often
        // one of them. They are the first to go when the shard is full.
        if shard.len() >= self.per_shard {
            let refresh = self.refresh;
            shard.retain(|_, bound| {
                sent < bound.seen.saturating_add(refresh) && !decide::all_full(&bound.words, now)
            });
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(Box::from(key), Bound { words, seen: sent });
    }

    /// Forgets `key`'s words (the caller raised the floor first).
    pub(in crate::redis) fn forget(&self, key: &str) {
        self.shard(key).write().remove(key);
    }

    /// Forgets every key's words (the caller raised the floor first).
    pub(in crate::redis) fn forget_all(&self) {
        for shard in self.shards.iter() {
            shard.write().clear();
        }
    }
}

impl std::fmt::Debug for WordBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bounds: usize = self.shards.iter().map(|s| s.read().len()).sum();
        f.debug_struct("WordBounds")
            .field("bounds", &bounds)
            .finish_non_exhaustive()
    }
}

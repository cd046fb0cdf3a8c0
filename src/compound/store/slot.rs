//! A key's bucket in its map entry: its words inline ([`Slot::Inline`],
//! in a 16-byte slot), or a cell behind an `Arc` ([`Slot::Shared`]); and
//! the moves between the two, made under the shard's lock (see the
//! store's docs).

use super::super::cell::Cell;
use super::super::decide::Words;
use super::super::policy::MAX_QUOTAS;
use crate::sync::Arc;
use crate::time::Nanos;
use std::num::NonZeroU64;

/// Words a key's cell keeps in its map entry when its policy has at most
/// this many quotas: the entry is then 8 bytes more than a single-quota
/// limiter's (a 16-byte slot for its 8-byte word), with no allocation,
/// and a call through the map reads no memory beyond the entry and its
/// key.
pub(crate) const INLINE_WORDS: usize = 2;

/// A bucket's words inline in its map entry, the first kept as its value
/// plus one: it is then never zero, the niche in which [`Slot`] keeps
/// which of its two kinds it is, so that a slot is 16 bytes, not 24. A
/// word is at most a timestamp plus a spend (`gcra::step`), both below
/// 2^63, so the sum never saturates.
#[derive(Clone, Copy)]
pub(crate) struct InlineWords {
    first: NonZeroU64,
    second: Nanos,
}

impl InlineWords {
    /// A new bucket's words: all full.
    const FULL: InlineWords = InlineWords {
        first: NonZeroU64::MIN,
        second: Nanos::ZERO,
    };

    /// The words.
    #[inline]
    pub(crate) fn get(&self) -> [Nanos; INLINE_WORDS] {
        [Nanos::new(self.first.get() - 1), self.second]
    }

    /// Stores `words`.
    #[inline]
    pub(crate) fn set(&mut self, words: [Nanos; INLINE_WORDS]) {
        debug_assert!(words[0].as_u64() < u64::MAX, "a word past any instant");
        self.first = NonZeroU64::MIN.saturating_add(words[0].as_u64());
        self.second = words[1];
    }
}

/// A key's cell in its map entry: 16 bytes (checked below).
pub(crate) enum Slot {
    /// Its words in the entry, read and written only under the shard's
    /// lock: no call holds them anywhere else.
    Inline(InlineWords),
    /// Behind an `Arc`: for a thread's cache of hot cells and for calls of
    /// several scopes, which lock cells outside the map, and for policies
    /// of more quotas than fit inline. This bucket is never inline again
    /// (once the sweep removes it, the key's next bucket starts inline).
    /// The `Arc` is boxed: it is two words (a cell's length is in it), and
    /// the slot's niche leaves room for one beside it. A call through the
    /// map on a shared cell reads one more pointer; the words in the map,
    /// for most keys, are 8 bytes a key fewer.
    Shared(Box<Arc<Cell>>),
}

/// A key's cell as [`Store::with_cell`] hands it over, under its shard's
/// lock.
pub(crate) enum InMap<'a> {
    /// The entry's own words, [`INLINE_WORDS`] of them, for a policy of
    /// at most that many quotas (the words past the policy's stay as they
    /// are).
    Inline(&'a mut InlineWords),
    Shared(&'a Arc<Cell>),
}

impl InMap<'_> {
    /// The cell's `Arc`, when [`Store::with_cell`] was asked to share it.
    pub(crate) fn shared(self) -> Option<Arc<Cell>> {
        match self {
            InMap::Shared(cell) => Some(Arc::clone(cell)),
            InMap::Inline(_) => None,
        }
    }
}

impl Slot {
    /// A new key's bucket, every word `start` (full at and after it: the
    /// sweep's `Pace::restart`), as a call of `len` words that asks for it
    /// shared (`share`) or not needs it (see [`in_map`](Self::in_map)).
    pub(super) fn new(len: usize, share: bool, start: Nanos) -> Slot {
        if fits_inline(len, share) {
            let mut words = InlineWords::FULL;
            words.set([start; INLINE_WORDS]);
            Slot::Inline(words)
        } else {
            Slot::Shared(Box::new(Cell::with_words(len, [start; MAX_QUOTAS])))
        }
    }

    /// The bucket's words at one instant; the words past the cell's (a
    /// quota it has not held yet) are `start`, the word of a key without a
    /// bucket (`Pace::restart`). The caller holds the shard's lock (a
    /// shared cell is read, or locked if writers keep it busy: the one
    /// lock order).
    pub(super) fn words_now(&self, start: Nanos) -> Words {
        match self {
            Slot::Inline(words) => padded(words, start),
            Slot::Shared(cell) => {
                let mut words = cell.words_now();
                words[cell.len().min(MAX_QUOTAS)..].fill(start);
                words
            }
        }
    }

    /// The cell as a call of `len` words sees it: inline if it is and
    /// that fits and `share` is false, else shared (moved to an `Arc`, or
    /// lengthened, first if need be, its new words `start()`: see
    /// [`words_now`](Self::words_now); read only then).
    #[inline]
    pub(super) fn in_map(
        &mut self,
        len: usize,
        share: bool,
        start: impl FnOnce() -> Nanos,
    ) -> InMap<'_> {
        let inline = matches!(self, Slot::Inline(_)) && fits_inline(len, share);
        if !inline {
            return InMap::Shared(self.shared(len, start));
        }
        match self {
            Slot::Inline(words) => InMap::Inline(words),
            Slot::Shared(cell) => InMap::Shared(cell),
        }
    }

    /// The cell behind an `Arc` of at least `len` words: an inline cell
    /// moves there (no other call holds its words: they live under the
    /// shard's lock, which the caller holds), a short one is lengthened.
    /// Out of line: a call on inline words, the common one, then carries
    /// none of it.
    #[inline(never)]
    fn shared(&mut self, len: usize, start: impl FnOnce() -> Nanos) -> &Arc<Cell> {
        // One of the two at most: an inline cell moves to a cell of `len`
        // words at least, which needs no lengthening.
        match self {
            Slot::Inline(words) => {
                let cell = Cell::with_words(len.max(INLINE_WORDS), padded(words, start()));
                *self = Slot::Shared(Box::new(cell));
            }
            Slot::Shared(cell) if cell.len() < len => **cell = lengthened(cell, len, start()),
            Slot::Shared(_) => {}
        }
        match self {
            Slot::Shared(cell) => cell,
            Slot::Inline(_) => unreachable!("moved to an Arc above"),
        }
    }
}

/// Whether a call of `len` words that asks for the cell shared (`share`)
/// or not can use words inline in the entry.
fn fits_inline(len: usize, share: bool) -> bool {
    !share && len <= INLINE_WORDS
}

// The niche at work: a slot is two words, as `InlineWords` is. (Under
// loom an `Arc` is a model's, of another size.)
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Slot>() == 16);

/// Inline words as a whole cell's: the rest `start` (a key without a
/// bucket's word, see [`Slot::words_now`]).
fn padded(words: &InlineWords, start: Nanos) -> Words {
    let mut all = [start; MAX_QUOTAS];
    all[..INLINE_WORDS].copy_from_slice(&words.get());
    all
}

/// A copy of `cell` of `len` words, the new ones `start`; `cell` is
/// retired (its holders go back to the map, and find the copy).
fn lengthened(cell: &Cell, len: usize, start: Nanos) -> Arc<Cell> {
    // `cell` is in the map, under its shard's lock: never retired.
    let held = cell.len().min(MAX_QUOTAS);
    match cell.lock() {
        Ok(mut old) => {
            old.retire();
            let mut words = old.words;
            words[held..].fill(start);
            Cell::with_words(len, words)
        }
        Err(_) => Cell::with_words(len, [start; MAX_QUOTAS]),
    }
}

//! What a probe reads before the thread's cache itself (see `Quick`).

use super::imp::VOTE_ONE_IN;
use crate::dice::Dice;
use std::cell::Cell;

/// What a probe reads before the cache itself: whether the thread has
/// cached any bucket yet, and the dice that pick the misses that
/// vote. Plain data with no destructor, so reading it is one load of
/// thread-local memory: a miss on a thread that caches nothing (random
/// traffic over many keys) touches `CACHE`, with its borrow and its
/// destructor's registration check, only when it votes
/// (paired-harness callgrind, everyday at 10^4 keys: the probe's
/// miss took 42 instructions a call).
#[derive(Clone, Copy)]
struct Quick {
    /// Set when the thread's cache allocates its sets (its first
    /// promotion, see `HotKeys::insert`); never cleared.
    cached: bool,
    dice: Dice,
}

#[cfg(not(loom))]
std::thread_local! {
    static QUICK: Cell<Quick> = const { Cell::new(Quick { cached: false, dice: Dice::new() }) };
}

#[cfg(loom)]
loom::thread_local! {
    static QUICK: Cell<Quick> = Cell::new(Quick { cached: false, dice: Dice::new() });
}

/// Rolls the calling thread's dice: true for the misses that vote (see
/// `VOTE_ONE_IN`).
#[inline]
pub(super) fn votes() -> bool {
    QUICK
        .try_with(|quick| {
            let mut drawn = quick.get();
            let votes = drawn.dice.one_in(VOTE_ONE_IN);
            quick.set(drawn);
            votes
        })
        .unwrap_or(false)
}

/// Records that the calling thread's cache now holds buckets: from now on
/// every probe in this thread reads the cache's tags.
pub(super) fn mark_cached() {
    let _ = QUICK.try_with(|quick| {
        quick.set(Quick {
            cached: true,
            ..quick.get()
        });
    });
}

/// Whether the calling thread's cache holds buckets (see [`mark_cached`]).
#[inline]
pub(super) fn cached() -> bool {
    QUICK.try_with(|quick| quick.get().cached).unwrap_or(false)
}

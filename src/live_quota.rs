//! A default quota that can be replaced while other threads read it.
//!
//! A sequence lock over four atomic words: a read loads the version, the
//! words and the version again, writes nothing, and retries only if a
//! store ran meanwhile; stores (rare: an operator changing a plan) take a
//! lock among themselves. Every access is an atomic, so a read that races
//! a store sees torn words only to throw them away.
//!
//! Until the first store, the quota the limiter was made with is also
//! read in place ([`current`](LiveQuota::current)): one load of the
//! version, and no copy.

use crate::gcra::Quota;
use crate::sync::{fence, AtomicU64, Mutex, Ordering};
use std::fmt;

/// The default quota of a limiter, shared with its handles.
pub(crate) struct LiveQuota {
    /// Even while the words are stable; odd while a store writes them.
    /// Only grows.
    version: AtomicU64,
    /// `Quota::to_words` of the quota in force.
    words: [AtomicU64; 4],
    /// Lets one store at a time bump `version`.
    writer: Mutex<()>,
    /// The quota the limiter was made with, never written again: the one
    /// in force while `version` is 0 (no store has begun).
    initial: Quota,
}

impl LiveQuota {
    pub(crate) fn new(quota: Quota) -> Self {
        LiveQuota {
            version: AtomicU64::new(0),
            words: quota.to_words().map(AtomicU64::new),
            writer: Mutex::new(()),
            initial: quota,
        }
    }

    /// The quota in force, in place while no store has begun, else loaded
    /// into `slot`: a keyed call's default quota. Reading the four words
    /// and copying them out cost about 20 instructions a call
    /// (paired-harness callgrind); the version alone costs one load.
    #[inline(always)]
    pub(crate) fn current<'a>(&'a self, slot: &'a mut Option<Quota>) -> &'a Quota {
        // Relaxed: `initial` is written only before the limiter is shared,
        // so reading it needs nothing published by a store. Version 0
        // means no store had begun when this load ran: the call is then
        // ordered before every store, and the initial quota is the one in
        // force (as `load` returns the old quota to a read that finishes
        // before a store begins). A store that happens before this call
        // (the storing thread's own later calls, or any thread synchronised
        // with it) has left a version of 2 or more, which coherence makes
        // this load see: the call then reads the words.
        #[cfg(loom)]
        let skip = crate::flaw::flawed(crate::flaw::Flaw::QuotaInitialAlways);
        #[cfg(not(loom))]
        let skip = false;
        if skip || self.version.load(Ordering::Relaxed) == 0 {
            return &self.initial;
        }
        slot.insert(self.load())
    }

    #[inline]
    pub(crate) fn load(&self) -> Quota {
        loop {
            // Acquire pairs with the final Release store in `store`: the
            // words written before that store are visible to the loads
            // below.
            let before = self.version.load(Ordering::Acquire);
            // Relaxed: the version check below decides whether these
            // values are kept.
            let words = [0, 1, 2, 3].map(|i| self.words[i].load(Ordering::Relaxed));
            // The fence orders the word loads before the version's second
            // load; paired with the Release fence in `store`, a load that
            // saw any word of a store in progress sees its odd version (or
            // a later one) here.
            #[cfg(loom)]
            let skip = crate::flaw::flawed(crate::flaw::Flaw::QuotaReadWithoutFence);
            #[cfg(not(loom))]
            let skip = false;
            if !skip {
                fence(Ordering::Acquire);
            }
            let after = self.version.load(Ordering::Relaxed);
            if before == after && before % 2 == 0 {
                return Quota::from_words(words);
            }
            crate::sync::spin();
        }
    }

    pub(crate) fn store(&self, quota: Quota) {
        // A poisoned lock only means a store panicked; the version is even
        // again by construction (no panic can happen between the bumps).
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        // Relaxed: the writer lock orders stores among themselves.
        let version = self.version.load(Ordering::Relaxed);
        self.version.store(version + 1, Ordering::Relaxed);
        // Release fence: the odd version is ordered before the word stores
        // below, for any load that sees one of them (see `load`).
        fence(Ordering::Release);
        for (word, value) in self.words.iter().zip(quota.to_words()) {
            word.store(value, Ordering::Relaxed);
        }
        // Release: publishes the words with the even version.
        self.version.store(version + 2, Ordering::Release);
    }
}

impl fmt::Debug for LiveQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.load().fmt(f)
    }
}

//! One key's slot: the count of permits held, in one atomic word taken and
//! given back with compare-and-swap, and the queue of callers waiting for
//! a permit.

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use std::collections::VecDeque;
use std::sync::PoisonError;
#[cfg(feature = "tokio")]
use std::task::Waker;

/// The word of a slot the sweep has taken out of its map: final. A caller
/// holding the slot's `Arc` that finds it looks the key up again.
pub(crate) const RETIRED: u64 = u64::MAX;

/// Set while callers queue for a permit: a lock-free take is then refused,
/// so that it never overtakes a waiter, and a release serves the queue.
const QUEUED: u64 = 1 << 32;

/// Set by every take, cleared by the automatic sweep when it finds the
/// slot idle: the second-chance bit. A pass of the sweep retires an idle
/// slot only if the bit is clear, that is if no permit was taken since the
/// previous pass cleared it (see `sweep.rs`).
const USED: u64 = 1 << 33;

/// The bits that count the permits held.
const HELD: u64 = QUEUED - 1;

/// What the automatic sweep did with a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Visit {
    /// Permits held or callers queued, or taken since the previous pass
    /// (its second chance, now spent): kept.
    Kept,
    /// Idle since the previous pass: retired, for the caller to remove.
    Retired,
}

/// What a take on a slot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// One more permit is held.
    Taken,
    /// Refused: `held` permits are held, and `max` or more, or callers
    /// are queued ahead.
    Full {
        /// The permits held when refused.
        held: u32,
    },
    /// The slot was retired: look the key up again.
    Retired,
}

/// How a waiter is woken when a permit is handed to it.
#[derive(Debug)]
pub(crate) enum Wake {
    /// Not polled yet.
    Nobody,
    /// An async task.
    #[cfg(feature = "tokio")]
    Task(Waker),
    /// A thread parked in `acquire_blocking`.
    #[cfg(not(loom))]
    Thread(std::thread::Thread),
}

/// A caller queued for a permit of one slot.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The most permits the key may hold for this caller to be served.
    pub(crate) max: u32,
    /// Set once, by the release that hands this waiter its permit (and
    /// takes it off the queue), under the slot's queue lock.
    granted: AtomicBool,
    /// Who to wake.
    wake: Mutex<Wake>,
}

impl Waiter {
    pub(crate) fn new(max: u32) -> Self {
        Waiter {
            max,
            granted: AtomicBool::new(false),
            wake: Mutex::new(Wake::Nobody),
        }
    }

    /// Whether a permit was handed to this waiter (it then holds it).
    pub(crate) fn granted(&self) -> bool {
        // Acquire pairs with the Release in `grant`: the waiter that sees
        // its permit sees everything the releasing holder did before.
        self.granted.load(Ordering::Acquire)
    }

    /// Records who to wake, then says whether the permit already came:
    /// a grant between the check and the store is seen by the re-check.
    #[cfg_attr(loom, allow(dead_code))] // the models do not park
    pub(crate) fn register(&self, wake: Wake) -> bool {
        *self.wake.lock().unwrap_or_else(PoisonError::into_inner) = wake;
        self.granted()
    }

    fn grant(&self) {
        // Release: see `granted`.
        self.granted.store(true, Ordering::Release);
        let wake = std::mem::replace(
            &mut *self.wake.lock().unwrap_or_else(PoisonError::into_inner),
            Wake::Nobody,
        );
        match wake {
            Wake::Nobody => {}
            #[cfg(feature = "tokio")]
            Wake::Task(waker) => waker.wake(),
            #[cfg(not(loom))]
            Wake::Thread(thread) => thread.unpark(),
        }
    }
}

/// What joining a slot's queue did.
#[derive(Debug)]
pub(crate) enum Joined {
    /// A permit was free and no one queued: it is held now.
    Taken,
    /// Queued (possibly already granted, if the queue was served at once).
    Queued,
    /// The slot was retired: look the key up again.
    Retired,
}

/// One key's permits.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Bits 0-31: the permits held (`0..=u32::MAX`, never above the
    /// largest `max` a take was allowed under). Bit 32: [`QUEUED`], set
    /// while the queue is not empty. Bit 33: [`USED`], set by every take
    /// and cleared by the automatic sweep from an idle word. [`RETIRED`]
    /// (final) once the sweep removed the slot, which it does only from an
    /// idle word (0, or [`USED`] for `sweep`): no permit held and no one
    /// queued.
    word: AtomicU64,
    /// The callers waiting, first come first served. Locked only by
    /// waiters and by releases that find [`QUEUED`] set.
    queue: Mutex<VecDeque<Arc<Waiter>>>,
}

impl Slot {
    /// A slot with no permit held, counted as used: the sweep's next
    /// pass gives it its second chance, so that a caller that created it
    /// to wait on it (outside the shard lock) finds it there.
    pub(crate) fn new() -> Self {
        Slot {
            word: AtomicU64::new(USED),
            queue: Mutex::new(VecDeque::new()),
        }
    }

    /// The permits held now (0 once retired).
    pub(crate) fn held(&self) -> u32 {
        // Relaxed: a snapshot for reporting; it orders nothing.
        match self.word.load(Ordering::Relaxed) {
            RETIRED => 0,
            word => held(word),
        }
    }

    /// Takes a permit if fewer than `max` are held and no one is queued.
    /// Lock-free; a refusal loads the word once and writes nothing.
    #[inline]
    pub(crate) fn try_take(&self, max: u32) -> Take {
        // Relaxed: a stale value costs a failed compare-exchange below,
        // never a wrong decision.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            if current == RETIRED {
                return Take::Retired;
            }
            let held = held(current);
            if current & QUEUED != 0 || held >= max {
                return Take::Full { held };
            }
            #[cfg(loom)]
            if crate::flaw::flawed(crate::flaw::Flaw::PermitTakeCheckThenAdd) {
                // BROKEN (a model's twin): the check above, then an add.
                self.word.fetch_add(1, Ordering::Acquire);
                return Take::Taken;
            }
            // Acquire on success pairs with the Release of `release`: what
            // a holder did before giving its permit back happens before
            // what the next holder does with it (a permit guards work the
            // way a lock does). The compare-exchange, a read-modify-write,
            // sees the latest count, so two takes can never both move
            // `max - 1` to `max`. Relaxed on failure: we only retry.
            match self.word.compare_exchange_weak(
                current,
                (current + 1) | USED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Take::Taken,
                Err(actual) => current = actual,
            }
        }
    }

    /// Gives one permit back: the caller holds one. If callers are queued,
    /// serves them.
    #[inline]
    pub(crate) fn release(&self) {
        // Release pairs with the Acquire of the next take (see `try_take`).
        // The word is not RETIRED and counts this permit, so the
        // subtraction borrows nothing from the flag bits.
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::PermitReleaseByLoadThenStore) {
            // BROKEN (a model's twin): a load, then a store of one less.
            let before = self.word.load(Ordering::Relaxed);
            self.word.store(before.wrapping_sub(1), Ordering::Release);
            if before & QUEUED != 0 {
                self.serve();
            }
            return;
        }
        let before = self.word.fetch_sub(1, Ordering::Release);
        debug_assert!(before != RETIRED && held(before) > 0);
        if before & QUEUED != 0 {
            self.serve();
        }
    }

    /// Queues `waiter` behind the callers already queued, or takes a
    /// permit at once if one is free and no one is queued.
    pub(crate) fn join(&self, waiter: &Arc<Waiter>) -> Joined {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        // Relaxed: the compare-exchange below decides on the latest value.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            if current == RETIRED {
                return Joined::Retired;
            }
            let (next, taken) = if current & QUEUED == 0 && held(current) < waiter.max {
                ((current + 1) | USED, true)
            } else {
                (current | QUEUED, false)
            };
            // Acquire on success: a permit taken here is taken as in
            // `try_take`. Setting QUEUED under the queue lock, from a value
            // that was not RETIRED, keeps the slot from being retired while
            // the waiter is queued (the sweep retires only the word 0), and
            // makes every later release come to the queue.
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) if taken => return Joined::Taken,
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        queue.push_back(Arc::clone(waiter));
        // A release may have come between the load above and the flag.
        Self::serve_locked(&self.word, &mut queue);
        Joined::Queued
    }

    /// Takes `waiter` off the queue if it is still there (its caller gave
    /// up); returns whether it was granted a permit, which it then holds.
    pub(crate) fn leave(&self, waiter: &Arc<Waiter>) -> bool {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = queue.iter().position(|w| Arc::ptr_eq(w, waiter)) {
            queue.remove(at);
            // The next waiter may fit where this one did not (a larger
            // `max`), and the queue may now be empty.
            Self::serve_locked(&self.word, &mut queue);
            return false;
        }
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::CancelDroppingAGrant) {
            // BROKEN (a model's twin): off the queue means "not served".
            return false;
        }
        // Off the queue but still ours: only a grant takes a waiter off.
        waiter.granted()
    }

    /// Hands free permits to the waiters at the head of the queue.
    fn serve(&self) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        Self::serve_locked(&self.word, &mut queue);
    }

    /// Serves the queue in order while the head fits under its `max`, and
    /// clears [`QUEUED`] once the queue is empty. Under the queue lock.
    fn serve_locked(word: &AtomicU64, queue: &mut VecDeque<Arc<Waiter>>) {
        // Relaxed: the compare-exchanges below decide on the latest value.
        let mut current = word.load(Ordering::Relaxed);
        while let Some(head) = queue.front() {
            if held(current) >= head.max {
                return;
            }
            // Acquire: the waiter's permit is taken as in `try_take`; its
            // grant publishes it on (see `Waiter::granted`).
            match word.compare_exchange_weak(
                current,
                (current + 1) | USED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    current = (current + 1) | USED;
                    if let Some(head) = queue.pop_front() {
                        head.grant();
                    }
                }
                Err(actual) => current = actual,
            }
        }
        if current & QUEUED != 0 {
            // Relaxed: the flag decides only who serves the queue, which
            // the queue lock orders; takes that see it cleared race on
            // the count alone.
            word.fetch_and(!QUEUED, Ordering::Relaxed);
        }
    }

    /// Retires the slot if no permit is held and no one is queued, used
    /// since the last visit of the automatic sweep or not; returns whether
    /// it did. After `true`, every take and join finds [`RETIRED`] and
    /// looks the key up again, so a caller that found this slot before the
    /// sweep removed it never takes a permit the map no longer counts.
    pub(crate) fn try_retire(&self) -> bool {
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::PermitSlotRemovedWithoutRetiring) {
            // BROKEN (a model's twin): an idle word is removed but left live.
            let word = self.word.load(Ordering::Relaxed);
            return word == 0 || word == USED;
        }
        // Relaxed: the compare-exchange alone decides which of a racing
        // take and the retirement wins; nothing else is published.
        let idle = |word| word == 0 || word == USED;
        let mut current = self.word.load(Ordering::Relaxed);
        while idle(current) {
            match self.word.compare_exchange_weak(
                current,
                RETIRED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
        false
    }

    /// The automatic sweep's visit, by the second-chance rule: retires the
    /// slot if it is idle and was not taken since the previous visit (its
    /// word is 0), and else clears [`USED`] from an idle word, so that the
    /// next visit retires it unless a take comes first. A slot holding
    /// permits or waited for keeps its bit: it was in use during this
    /// pass, and gets its second chance from the next one.
    pub(crate) fn visit(&self) -> Visit {
        // Relaxed: each compare-exchange alone decides against a racing
        // take (which moves the word off 0 or USED, so that the exchange
        // fails and the slot is kept); nothing else is published.
        if self
            .word
            .compare_exchange(0, RETIRED, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            return Visit::Retired;
        }
        // A failed clear means a take or a release came in between: the
        // slot is then in use, and keeps its bit or gets it back.
        let _ = self
            .word
            .compare_exchange(USED, 0, Ordering::Relaxed, Ordering::Relaxed);
        Visit::Kept
    }
}

/// The permits counted in a live word.
#[inline]
fn held(word: u64) -> u32 {
    (word & HELD) as u32
}

//! The in-memory compound charge: a call whose cells a thread caches (all
//! of them) is decided on a lock-free read of them, or on the thread's
//! memo of its last denial, and a denial writes nothing; an admission,
//! and a call whose cells come from the map (some or all of them),
//! decides with every cell locked in one global order, then writes all
//! or nothing.

use super::cell::{Cell, Locked, Retired, SNAPSHOT_CELLS};
use super::decide;
use super::outcome::{CompoundDecision, CompoundDenial};
use super::policy::MAX_QUOTAS;
use super::store::{InlineWords, INLINE_WORDS};
#[cfg(loom)]
use crate::sync::Arc;
use crate::time::{Nanos, MAX_TIMESTAMP_NANOS};
use std::ops::Deref;

/// Scopes a call handles with no allocation; more take a `Vec`.
pub(super) const INLINE_SCOPES: usize = 8;

/// A call's outcome, or [`Retired`]: one of its cells left the map before
/// the call could lock it, and the call must look its keys up again.
pub(super) type Charged = Result<Result<CompoundDecision, CompoundDenial>, Retired>;

/// Charges one scope's cell, locked: all of its quotas or none (see
/// [`charge_words`]); the words are stored back only if the call was
/// admitted.
#[inline]
pub(super) fn charge_locked(
    locked: &mut Locked<'_>,
    policy: &crate::Policy,
    now: Nanos,
    cost: u64,
) -> Result<CompoundDecision, CompoundDenial> {
    let decided = charge_words(&mut locked.words, policy, now, cost);
    if decided.is_ok() {
        locked.commit();
    }
    decided
}

/// Charges one scope's words that the caller holds alone (locked, or
/// inline in its map entry under the shard's lock): all of its quotas or
/// none. Each quota's word is decided once: the words `decide` returns
/// are kept only if every quota admits (the same words [`decide::apply`]
/// writes after [`decide::verdict`]); a denial, which leaves `words` as
/// they were, is then described by `verdict`.
#[inline]
pub(super) fn charge_words<const N: usize>(
    words: &mut [Nanos; N],
    policy: &crate::Policy,
    now: Nanos,
    cost: u64,
) -> Result<CompoundDecision, CompoundDenial> {
    let mut next = *words;
    let mut least = decide::Least::new(now);
    for (quota, (word, q)) in next.iter_mut().zip(policy.quotas()).enumerate() {
        match crate::gcra::decide(*word, now, cost, q) {
            Ok(spent) => {
                *word = spent;
                least.add(0, quota, q, spent);
            }
            Err(_) => {
                decide::verdict(std::iter::once((0, &*words, policy)), now, cost)?;
                unreachable!("a quota that denies makes the verdict a denial");
            }
        }
    }
    *words = next;
    Ok(least.decision())
}

/// Charges one scope's words inline in its map entry (under the shard's
/// lock): as [`charge_words`], on the entry's words (a policy of at most
/// [`INLINE_WORDS`] quotas).
#[inline]
pub(super) fn charge_inline(
    inline: &mut InlineWords,
    policy: &crate::Policy,
    now: Nanos,
    cost: u64,
) -> Result<CompoundDecision, CompoundDenial> {
    debug_assert!(
        policy.quotas().len() <= INLINE_WORDS,
        "a policy too long to be inline"
    );
    let mut words = inline.get();
    let decided = charge_words(&mut words, policy, now, cost);
    if decided.is_ok() {
        inline.set(words);
    }
    decided
}

/// Charges one scope's cell (held outside the map: a thread's cache),
/// with the thread's `memo` of the cell's last denial. A call that the
/// memo denies, or a consistent read that denies, is denied with nothing
/// written (the read's denial becomes the memo); an admission is decided
/// again under the cell's lock. `None` if the cell is retired: nothing
/// was spent, and the call goes to the map.
#[inline]
pub(super) fn charge_read_first(
    cell: &Cell,
    memo: &mut Option<Memo>,
    policy: &crate::Policy,
    now: Nanos,
    cost: u64,
) -> Option<Result<CompoundDecision, CompoundDenial>> {
    if let Some(denial) = memo
        .as_ref()
        .and_then(|memo| memo.denies(cell, policy, now, cost))
    {
        return Some(Err(denial));
    }
    if let Some((state, words)) = cell.read().ok()? {
        if let Err(denial) = decide::verdict(std::iter::once((0, &words, policy)), now, cost) {
            *memo = Memo::of(state, &denial, policy, now, cost);
            return Some(Err(denial));
        }
    }
    Some(charge_locked(&mut cell.lock().ok()?, policy, now, cost))
}

/// A thread's memo of a cached cell's last denial for want of tokens,
/// decided on a read of the cell under state `state`: while no write
/// lands on the cell, a call of the same cost under the same policy is
/// denied by the same quota until the same instant, whatever its own
/// instant before that one (a quota's bucket holds the cost again at a
/// fixed instant, its word plus the cost's refill less the quota's
/// window; a denial waits for the latest of them, the first quota on a
/// tie), so the call reads one state, and no word.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memo {
    state: u64,
    /// The policy's number (`Policy::id`).
    policy: u64,
    cost: u64,
    /// When every quota holds `cost` again.
    until: Nanos,
    /// The binding quota.
    quota: usize,
}

impl Memo {
    /// The memo of `denial`, decided at `now` on a read under `state`, if
    /// it is a denial for want of tokens whose wait is at most
    /// [`MAX_TIMESTAMP_NANOS`], so that `now + wait` fits a `u64` (a word
    /// near 2^64 read at an early instant waits longer: not kept).
    fn of(
        state: u64,
        denial: &CompoundDenial,
        policy: &crate::Policy,
        now: Nanos,
        cost: u64,
    ) -> Option<Memo> {
        let CompoundDenial::InsufficientTokens {
            retry_after, quota, ..
        } = *denial
        else {
            return None;
        };
        // The wait was a whole number of nanoseconds.
        let wait = Nanos::saturating_from_duration(retry_after);
        (wait.as_u64() <= MAX_TIMESTAMP_NANOS).then(|| Memo {
            state,
            policy: policy.id(),
            cost,
            until: now + wait,
            quota,
        })
    }

    /// The denial of a call of `cost` under `policy` at `now` on `cell`,
    /// if this memo decides it: the same cost and policy, an instant
    /// before `until`, and no write on the cell since the read.
    #[inline]
    fn denies(
        &self,
        cell: &Cell,
        policy: &crate::Policy,
        now: Nanos,
        cost: u64,
    ) -> Option<CompoundDenial> {
        #[cfg(loom)]
        let trust = crate::flaw::flawed(crate::flaw::Flaw::CompoundMemoIgnoringState);
        #[cfg(not(loom))]
        let trust = false;
        let same = self.policy == policy.id() && self.cost == cost && now < self.until;
        (same && (trust || cell.unchanged_since(self.state))).then(|| {
            CompoundDenial::InsufficientTokens {
                retry_after: (self.until - now).into(),
                scope: 0,
                quota: self.quota,
            }
        })
    }
}

/// Charges several scopes' cells (held outside the map: a thread's
/// cache): a consistent snapshot of every cell ([`Cell::read_all`]) that
/// denies is the outcome, with nothing written; an admission, or a
/// snapshot that writers kept from succeeding, is decided again under
/// the locks ([`charge`]). `None` if a cell is retired (nothing was spent,
/// and the call goes to the map). `cells[i]` is scope `i`'s (always
/// `Some`, and at least as long as its policy: a shorter one goes to the
/// map, which lengthens it), at most [`SNAPSHOT_CELLS`] of them.
#[inline]
pub(super) fn charge_cached<Q: ?Sized>(
    cells: &[Option<&Cell>],
    scopes: &[(&Q, &crate::Policy)],
    now: Nanos,
    cost: u64,
) -> Option<Result<CompoundDecision, CompoundDenial>> {
    debug_assert!(
        cells
            .iter()
            .zip(scopes)
            .all(|(cell, (_, policy))| cell.is_some_and(|cell| cell.len() >= policy.quotas().len())),
        "every scope's cell, long enough"
    );
    let mut words = [[Nanos::ZERO; MAX_QUOTAS]; SNAPSHOT_CELLS];
    let words = &mut words[..cells.len()];
    if Cell::read_all(cells, words).ok()? {
        let snapshot = words.iter().zip(scopes);
        let snapshot = snapshot
            .enumerate()
            .map(|(i, (words, &(_, policy)))| (i, words, policy));
        if let Err(denial) = decide::verdict(snapshot, now, cost) {
            return Some(Err(denial));
        }
    }
    charge(cells, scopes, now, cost).ok()
}

/// Locks every cell in the global order (by address: cells are distinct,
/// since keys are, and every call orders any two cells the same way, so no
/// two calls can each hold a lock the other waits for), decides, and
/// writes every word or none, all under the locks. `cells[i]` is scope
/// `i`'s (always `Some`): an `Arc` from the map, or a cell borrowed from a
/// thread's cache.
pub(super) fn charge<C: Deref<Target = Cell>, Q: ?Sized>(
    cells: &[Option<C>],
    scopes: &[(&Q, &crate::Policy)],
    now: Nanos,
    cost: u64,
) -> Charged {
    if cells.len() <= INLINE_SCOPES {
        let mut order = [0; INLINE_SCOPES];
        let mut guards: [Option<Locked<'_>>; INLINE_SCOPES] = Default::default();
        let n = cells.len();
        charge_in(cells, scopes, now, cost, &mut order[..n], &mut guards[..n])
    } else {
        let mut order = vec![0; cells.len()];
        let mut guards: Vec<Option<Locked<'_>>> = cells.iter().map(|_| None).collect();
        charge_in(cells, scopes, now, cost, &mut order, &mut guards)
    }
}

/// [`charge`] with its scratch space: `order` and `guards` as long as
/// `cells`.
fn charge_in<'a, C: Deref<Target = Cell>, Q: ?Sized>(
    cells: &'a [Option<C>],
    scopes: &[(&Q, &crate::Policy)],
    now: Nanos,
    cost: u64,
    order: &mut [usize],
    guards: &mut [Option<Locked<'a>>],
) -> Charged {
    let cell = |i: usize| cells[i].as_deref().expect("every scope has its cell");
    for (i, slot) in order.iter_mut().enumerate() {
        *slot = i;
    }
    // The deadlock twin (loom model 14) takes the locks in the call's order.
    #[cfg(loom)]
    let sorted = !crate::flaw::flawed(crate::flaw::Flaw::CompoundLockInCallOrder);
    #[cfg(not(loom))]
    let sorted = true;
    if sorted {
        order.sort_unstable_by_key(|&i| cell(i).address());
    }
    for (guard, &i) in guards.iter_mut().zip(&*order) {
        // A retired cell lets go of the locks taken so far (on return).
        *guard = Some(cell(i).lock()?);
    }
    if let Err(denial) = decide::verdict(locked(guards, order, scopes), now, cost) {
        return Ok(Err(denial));
    }
    for (guard, &i) in guards.iter_mut().zip(&*order) {
        let guard = guard.as_mut().expect("every cell is locked");
        decide::apply(&mut guard.words, scopes[i].1, now, cost);
        guard.commit();
    }
    Ok(Ok(decide::summary(locked(guards, order, scopes), now)))
}

/// The locked words of a call, as `decide` takes them.
fn locked<'b, Q: ?Sized>(
    guards: &'b [Option<Locked<'_>>],
    order: &'b [usize],
    scopes: &'b [(&Q, &'b crate::Policy)],
) -> impl Iterator<Item = (usize, &'b decide::Words, &'b crate::Policy)> {
    guards.iter().zip(order).map(|(guard, &i)| {
        let words = &guard.as_ref().expect("every cell is locked").words;
        (i, words, scopes[i].1)
    })
}

/// The broken twin of [`charge`] (loom model 13): checks every quota
/// under the locks, lets them go, then spends one quota at a time, each
/// under its own lock, so that two calls can both pass the check.
#[cfg(loom)]
pub(super) fn charge_check_then_spend<Q: ?Sized>(
    cells: &[Option<Arc<Cell>>],
    scopes: &[(&Q, &crate::Policy)],
    now: Nanos,
    cost: u64,
) -> Charged {
    let cells: Vec<&Cell> = cells.iter().flatten().map(|cell| &**cell).collect();
    {
        let guards = cells
            .iter()
            .map(|cell| cell.lock())
            .collect::<Result<Vec<_>, _>>()?;
        let checked = decide::verdict(
            guards
                .iter()
                .enumerate()
                .map(|(i, locked)| (i, &locked.words, scopes[i].1)),
            now,
            cost,
        );
        if let Err(denial) = checked {
            return Ok(Err(denial));
        }
    }
    for (cell, &(_, policy)) in cells.iter().zip(scopes) {
        for (quota, q) in policy.quotas().iter().enumerate() {
            let mut locked = cell.lock()?;
            if let Ok(next) = crate::gcra::decide(locked.words[quota], now, cost, q) {
                locked.words[quota] = next;
                locked.commit();
            }
        }
    }
    let guards = cells
        .iter()
        .map(|cell| cell.lock())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Ok(decide::summary(
        guards
            .iter()
            .enumerate()
            .map(|(i, locked)| (i, &locked.words, scopes[i].1)),
        now,
    )))
}

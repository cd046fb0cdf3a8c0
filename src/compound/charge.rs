//! The in-memory compound charge: every bucket of a call locked in one
//! global order, decided, then written all or not at all.

use super::decide;
use super::outcome::{CompoundDecision, CompoundDenial};
use super::store::Cell;
use crate::sync::{Arc, LockGuard};
use crate::time::Nanos;

/// Charges one scope's words, already locked: all of its quotas or none.
pub(super) fn charge_one(
    words: &mut decide::Words,
    policy: &crate::Policy,
    now: Nanos,
    cost: u64,
) -> Result<CompoundDecision, CompoundDenial> {
    decide::verdict(std::iter::once((0, &*words, policy)), now, cost)?;
    decide::apply(words, policy, now, cost);
    Ok(decide::summary(std::iter::once((0, &*words, policy)), now))
}

/// Locks every cell in the global order (by address: cells are distinct,
/// since keys are, and every call orders any two cells the same way, so no
/// two calls can each hold a lock the other waits for), decides, and
/// writes every word or none, all under the locks.
pub(super) fn charge<Q: ?Sized>(
    cells: &[Arc<Cell>],
    scopes: &[(&Q, &crate::Policy)],
    now: Nanos,
    cost: u64,
) -> Result<CompoundDecision, CompoundDenial> {
    let mut order: Vec<usize> = (0..cells.len()).collect();
    // The deadlock twin (loom model 14) takes the locks in the call's order.
    #[cfg(loom)]
    let sorted = !crate::flaw::flawed(crate::flaw::Flaw::CompoundLockInCallOrder);
    #[cfg(not(loom))]
    let sorted = true;
    if sorted {
        order.sort_unstable_by_key(|&i| cells[i].address());
    }
    let mut guards: Vec<(usize, LockGuard<'_, decide::Words>)> =
        order.iter().map(|&i| (i, cells[i].lock())).collect();
    decide::verdict(
        guards.iter().map(|(i, words)| (*i, &**words, scopes[*i].1)),
        now,
        cost,
    )?;
    for (i, words) in &mut guards {
        decide::apply(words, scopes[*i].1, now, cost);
    }
    Ok(decide::summary(
        guards.iter().map(|(i, words)| (*i, &**words, scopes[*i].1)),
        now,
    ))
}

/// The broken twin of [`charge`] (loom model 13): checks every quota
/// under the locks, lets them go, then spends one quota at a time, each
/// under its own lock, so that two calls can both pass the check.
#[cfg(loom)]
pub(super) fn charge_check_then_spend<Q: ?Sized>(
    cells: &[Arc<Cell>],
    scopes: &[(&Q, &crate::Policy)],
    now: Nanos,
    cost: u64,
) -> Result<CompoundDecision, CompoundDenial> {
    {
        let guards: Vec<_> = cells.iter().map(|cell| cell.lock()).collect();
        decide::verdict(
            guards
                .iter()
                .enumerate()
                .map(|(i, words)| (i, &**words, scopes[i].1)),
            now,
            cost,
        )?;
    }
    for (cell, &(_, policy)) in cells.iter().zip(scopes) {
        for (quota, q) in policy.quotas().iter().enumerate() {
            let mut words = cell.lock();
            if let Ok(next) = crate::gcra::decide(words[quota], now, cost, q) {
                words[quota] = next;
            }
        }
    }
    let guards: Vec<_> = cells.iter().map(|cell| cell.lock()).collect();
    Ok(decide::summary(
        guards
            .iter()
            .enumerate()
            .map(|(i, words)| (i, &**words, scopes[i].1)),
        now,
    ))
}

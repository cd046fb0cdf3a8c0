//! The compound rule as pure arithmetic over plain words: no locks here.
//!
//! A call of cost `c` is admitted iff [`gcra::decide`] admits `c` on every
//! quota's word of every scope; then every word takes the value `decide`
//! returned for it. A denial waits for the latest of the buckets' waits:
//! each bucket refills on its own, so that is the first instant at which
//! every one of them holds `c` again.

use super::outcome::{CompoundDecision, CompoundDenial};
use super::policy::{Policy, MAX_QUOTAS};
use crate::error::Denial;
use crate::gcra;
use crate::time::Nanos;

/// A key's compound bucket: word `i` is `full_at` of quota `i` of the
/// key's policy (see [`gcra`]); words past the policy's quotas stay as
/// they are. All 0 (full) for a new key.
pub(crate) type Words = [Nanos; MAX_QUOTAS];

/// The checks that need no word: a cost above some quota's capacity is
/// denied before any bucket is looked up or locked.
pub(crate) fn check_costs<'a>(
    policies: impl Iterator<Item = &'a Policy>,
    cost: u64,
) -> Result<(), CompoundDenial> {
    for (scope, policy) in policies.enumerate() {
        if cost <= policy.least_capacity() {
            continue;
        }
        for (quota, q) in policy.quotas().iter().enumerate() {
            if let Err(Denial::ExceedsCapacity { cost, capacity }) = gcra::spend_for(cost, q) {
                return Err(CompoundDenial::ExceedsCapacity {
                    cost,
                    capacity,
                    scope,
                    quota,
                });
            }
        }
    }
    Ok(())
}

/// Whether every quota of every scope admits `cost` at `now`; if not, the
/// denial with the latest wait (the first `(scope, quota)` on a tie).
/// `scopes` yields `(scope index, words, policy)` in any order.
pub(crate) fn verdict<'a, W: AsRef<[Nanos]> + ?Sized + 'a>(
    scopes: impl Iterator<Item = (usize, &'a W, &'a Policy)>,
    now: Nanos,
    cost: u64,
) -> Result<(), CompoundDenial> {
    // The latest wait so far, kept in nanoseconds (turned into the
    // denial's `Duration` once, at the end).
    let mut latest: Option<(Nanos, usize, usize)> = None;
    for (scope, words, policy) in scopes {
        for (quota, (q, &word)) in policy.quotas().iter().zip(words.as_ref()).enumerate() {
            let spend = match gcra::spend_for(cost, q) {
                Ok(spend) => spend,
                Err(Denial::ExceedsCapacity { cost, capacity }) => {
                    return Err(CompoundDenial::ExceedsCapacity {
                        cost,
                        capacity,
                        scope,
                        quota,
                    })
                }
                // `spend_for` denies for capacity only.
                Err(_) => unreachable!("gcra::spend_for returned another denial"),
            };
            if let Err(wait) = gcra::step(word, now, spend, q) {
                let later = latest.map_or(true, |(w, s, i)| {
                    wait > w || (wait == w && (scope, quota) < (s, i))
                });
                if later {
                    latest = Some((wait, scope, quota));
                }
            }
        }
    }
    match latest {
        None => Ok(()),
        Some((wait, scope, quota)) => Err(CompoundDenial::InsufficientTokens {
            retry_after: wait.into(),
            scope,
            quota,
        }),
    }
}

/// Spends `cost` at `now` from every quota of one scope, after
/// [`verdict`] admitted the call on these same words.
pub(crate) fn apply(words: &mut Words, policy: &Policy, now: Nanos, cost: u64) {
    for (word, q) in words.iter_mut().zip(policy.quotas()) {
        if let Ok(next) = gcra::decide(*word, now, cost, q) {
            *word = next;
        }
    }
}

/// What an admitted call reports, from the words after [`apply`]: the
/// least remaining (first `(scope, quota)` on a tie) and the latest refill.
#[inline]
pub(crate) fn summary<'a, W: AsRef<[Nanos]> + ?Sized + 'a>(
    scopes: impl Iterator<Item = (usize, &'a W, &'a Policy)>,
    now: Nanos,
) -> CompoundDecision {
    let mut least = Least::new(now);
    for (scope, words, policy) in scopes {
        for (quota, (q, &word)) in policy.quotas().iter().zip(words.as_ref()).enumerate() {
            least.add(scope, quota, q, word);
        }
    }
    least.decision()
}

/// The [`summary`] of an admitted call, one spent word at a time.
pub(crate) struct Least {
    now: Nanos,
    /// The least remaining so far, its `(scope, quota)`, that quota's
    /// capacity and its word's missing refill (`remaining` is `u64::MAX`
    /// before the first word: a quota holds at most its capacity, below
    /// 2^63).
    remaining: u64,
    scope: usize,
    quota: usize,
    limit: u64,
    missing: Nanos,
    /// The latest refill so far.
    reset_after: Nanos,
}

impl Least {
    #[inline]
    pub(crate) fn new(now: Nanos) -> Self {
        Least {
            now,
            remaining: u64::MAX,
            scope: 0,
            quota: 0,
            limit: 0,
            missing: Nanos::ZERO,
            reset_after: Nanos::ZERO,
        }
    }

    /// Counts quota `quota` (`q`) of scope `scope`, whose word is now
    /// `word`. Scopes come in any order, so a tie goes to the lower index.
    #[inline]
    pub(crate) fn add(&mut self, scope: usize, quota: usize, q: &gcra::Quota, word: Nanos) {
        let missing = word.saturating_sub(self.now);
        self.reset_after = self.reset_after.max(missing);
        let remaining = q.tokens_with(missing);
        if remaining < self.remaining
            || (remaining == self.remaining && (scope, quota) < (self.scope, self.quota))
        {
            (self.remaining, self.scope, self.quota) = (remaining, scope, quota);
            (self.limit, self.missing) = (q.capacity(), missing);
        }
    }

    /// The decision, once every quota of every scope was added.
    #[inline]
    pub(crate) fn decision(self) -> CompoundDecision {
        debug_assert!(
            self.remaining < u64::MAX,
            "a call has a scope, and a policy a quota"
        );
        CompoundDecision {
            remaining: self.remaining,
            limit: self.limit,
            scope: self.scope,
            quota: self.quota as u8,
            reset_after: self.reset_after,
            quota_reset_after: self.missing,
            degraded: false,
        }
    }
}

#[cfg(feature = "redis")]
/// What a call admitted without a decision reports (a Redis limiter's
/// open failure policy): the smallest capacity over the scopes' quotas
/// (the first on a tie), as if every bucket were full.
pub(crate) fn degraded<'a>(policies: impl Iterator<Item = &'a Policy>) -> CompoundDecision {
    let mut least: Option<CompoundDecision> = None;
    for (scope, policy) in policies.enumerate() {
        for (quota, q) in policy.quotas().iter().enumerate() {
            if least.map_or(true, |d| q.capacity() < d.limit) {
                least = Some(CompoundDecision {
                    remaining: q.capacity(),
                    limit: q.capacity(),
                    scope,
                    quota: quota as u8,
                    reset_after: Nanos::ZERO,
                    quota_reset_after: Nanos::ZERO,
                    degraded: true,
                });
            }
        }
    }
    least.expect("a call has a scope, and a policy a quota")
}

/// The least whole tokens held at `now` over the quotas of `policy`.
pub(crate) fn least_remaining(words: &Words, policy: &Policy, now: Nanos) -> u64 {
    policy
        .quotas()
        .iter()
        .zip(words)
        .map(|(q, &word)| gcra::tokens_at(word, now, q))
        .min()
        .unwrap_or(0)
}

/// Whether every word is full at `now`, so that dropping the bucket
/// changes nothing.
#[cfg(feature = "redis")]
pub(crate) fn all_full(words: &Words, now: Nanos) -> bool {
    gcra::is_full(full_at(words), now)
}

/// The instant from which every word is full: the latest of them (words
/// past a policy's quotas are 0, full).
pub(crate) fn full_at(words: &[Nanos]) -> Nanos {
    words.iter().copied().max().unwrap_or(Nanos::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcra::Quota;
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;

    fn policy(quotas: &[(f64, u64)]) -> Policy {
        Policy::new(quotas.iter().map(|&(r, c)| Quota::new(r, c).unwrap())).unwrap()
    }

    #[test]
    fn admits_only_when_every_quota_holds_the_cost() {
        let p = policy(&[(10.0, 4), (1.0, 2)]);
        let mut words = [Nanos::ZERO; MAX_QUOTAS];
        let now = Nanos::new(100 * SEC);
        for _ in 0..2 {
            verdict([(0, &words, &p)].into_iter(), now, 1).unwrap();
            apply(&mut words, &p, now, 1);
        }
        let before = words;
        // Quota 0 still holds 2; quota 1 is empty and binds, 1 s away.
        assert_eq!(
            verdict([(0, &words, &p)].into_iter(), now, 1),
            Err(CompoundDenial::InsufficientTokens {
                retry_after: Duration::from_secs(1),
                scope: 0,
                quota: 1
            })
        );
        assert_eq!(words, before);
        let d = summary([(0, &words, &p)].into_iter(), now);
        assert_eq!((d.remaining, d.scope, d.quota(), d.limit), (0, 0, 1, 2));
        assert_eq!(d.reset_after(), Duration::from_secs(2));
        assert_eq!(d.quota_reset_after(), Duration::from_secs(2));
    }

    #[test]
    fn the_latest_wait_binds() {
        let fast = policy(&[(1.0, 1)]);
        let slow = policy(&[(0.5, 1)]);
        let now = Nanos::new(SEC);
        let mut a = [Nanos::ZERO; MAX_QUOTAS];
        let mut b = [Nanos::ZERO; MAX_QUOTAS];
        apply(&mut a, &fast, now, 1);
        apply(&mut b, &slow, now, 1);
        assert_eq!(
            verdict([(1, &b, &slow), (0, &a, &fast)].into_iter(), now, 1),
            Err(CompoundDenial::InsufficientTokens {
                retry_after: Duration::from_secs(2),
                scope: 1,
                quota: 0
            })
        );
    }

    #[test]
    fn costs_above_a_capacity_are_named() {
        let p = policy(&[(1.0, 5), (1.0, 3)]);
        assert_eq!(
            check_costs([&p, &p].into_iter(), 4),
            Err(CompoundDenial::ExceedsCapacity {
                cost: 4,
                capacity: 3,
                scope: 0,
                quota: 1
            })
        );
        assert_eq!(check_costs([&p].into_iter(), 3), Ok(()));
    }
}

//! The one spend of the in-memory front ends: a keyed call or a handle's
//! at a validated instant, counted (`decide_at`), out of line once for
//! `allow` and once for `check` (`admit`, `spend_at`), and the read of a
//! bucket's tokens (`remaining_at`). `calls` turns them into the
//! [`Limiter`](crate::Limiter) calls.

use super::{BucketHandle, TokenBucketLimiter};
use crate::bucket::RETIRED;
use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::time::{At, Nanos};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// `charge` at `now` (`None`: an invalid instant, denied): the instant and
/// the bucket's new word, or the denial; `record` sees the decision. The
/// one decision of both in-memory front ends: `check` makes a [`Decision`]
/// of it, `allow` (overridden for this) only asks whether it is `Ok`, so a
/// boolean call builds nothing it does not read.
#[inline(always)]
fn decide_at(
    now: Option<Nanos>,
    charge: impl FnOnce(Nanos) -> Result<Nanos, Denial>,
    record: impl FnOnce(Option<Nanos>, Result<(), &Denial>),
) -> Result<(Nanos, Nanos), Denial> {
    let decided = match now {
        Some(now) => charge(now).map(|word| (now, word)),
        None => Err(Denial::InvalidTimestamp),
    };
    record(now, decided.as_ref().map(|_| ()));
    decided
}

/// The whole tokens a bucket whose word is `word()` (the atomic's value)
/// holds at `now`.
pub(super) fn remaining_at(
    now: Option<Nanos>,
    quota: &Quota,
    word: impl FnOnce() -> u64,
) -> Result<u64, Denial> {
    let now = now.ok_or(Denial::InvalidTimestamp)?;
    Ok(match word() {
        // Retired buckets are full by construction.
        RETIRED => quota.capacity(),
        live => gcra::tokens_at(Nanos::new(live), now, quota),
    })
}

/// Names `allow`'s instance of the keyed spend (see `spend_inline`).
enum AllowPath {}
/// Names `check`'s instance of the keyed spend.
enum CheckPath {}

/// The spends both in-memory front ends decide with (see `decide_at`).
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Spends `cost` from `key`'s bucket at `at` under `quota`: the instant
    /// and the new word, or the denial; counted.
    ///
    /// The instant is read here, where the caller's kind of `At` is known
    /// and its `match` folds away; the rest is one call, not inlined: the
    /// map path and the count stay together out of the caller's loop,
    /// which otherwise spills around them (paired-harness callgrind: see
    /// BENCHMARKS.md).
    #[inline(always)]
    pub(super) fn spend_under<Q>(
        &self,
        key: &Q,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> Result<(Nanos, Nanos), Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.spend_at(key, at.nanos(&*self.clock), cost, quota)
    }

    /// Whether `cost` spent from `key`'s bucket at `at` under `quota` is
    /// admitted: `allow`'s whole call, out of line once per kind of time
    /// it is called with (whose conversion then folds), and returning one
    /// register.
    ///
    /// Each kind of time gets its own copy of every step (`Path` is
    /// `(AllowPath, A)`): with one copy shared by two kinds (`f64` and
    /// `Duration` in one program), the steps they shared (the hot-key
    /// probe's thread-local access, the table lookup) were left out of
    /// line in both, 58 instructions more a call (paired-harness
    /// callgrind).
    #[inline(never)]
    pub(super) fn admit<Q, A: Into<At>>(&self, key: &Q, at: A, cost: u64, quota: &Quota) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = at.into().nanos(&*self.clock);
        self.spend_inline::<(AllowPath, A), Q>(key, now, cost, quota)
            .is_ok()
    }

    /// [`spend_under`](Self::spend_under) at a validated instant (`None`:
    /// invalid, denied).
    #[inline(never)]
    fn spend_at<Q>(
        &self,
        key: &Q,
        now: Option<Nanos>,
        cost: u64,
        quota: &Quota,
    ) -> Result<(Nanos, Nanos), Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.spend_inline::<CheckPath, Q>(key, now, cost, quota)
    }

    /// The body of [`spend_at`](Self::spend_at) and [`admit`](Self::admit),
    /// instantiated once for each (`Path`), so that neither shares an
    /// inlined step with the other: a step with two callers is not
    /// inlined into either (paired-harness callgrind, hammered keys).
    #[inline(always)]
    fn spend_inline<Path, Q>(
        &self,
        key: &Q,
        now: Option<Nanos>,
        cost: u64,
        quota: &Quota,
    ) -> Result<(Nanos, Nanos), Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        decide_at(
            now,
            #[inline(always)]
            |now| self.charge::<Path, Q>(key, now, cost, quota),
            // The offenders' epochs count plain nanoseconds. Inlined
            // whatever the number of front-end instances: a second kind of
            // time (`f64` and `Duration` in one program) left this closure
            // and the table lookup out of line, 100 instructions a call
            // (paired-harness callgrind).
            #[inline(always)]
            |now, decided| {
                self.observer
                    .decided(key, now.map(Nanos::as_u64), cost, decided)
            },
        )
    }
}

impl BucketHandle {
    /// Spends `cost` from the handle's bucket at `at` under `quota`, as the
    /// keyed `spend_under`.
    #[inline(always)]
    pub(super) fn spend_under(
        &self,
        at: At,
        cost: u64,
        quota: &Quota,
    ) -> Result<(Nanos, Nanos), Denial> {
        decide_at(
            at.nanos(&*self.clock),
            |now| self.charge(now, cost, quota),
            |now, decided| self.tally.decided(now.map(Nanos::as_u64), cost, decided),
        )
    }
}

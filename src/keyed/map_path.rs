//! The map path: a keyed spend through the hot-key cache, the map entry,
//! or a new bucket.

use super::TokenBucketLimiter;
use crate::bucket::{Bucket, SpendError};
use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::hot::Probe;
use crate::time::Nanos;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// One keyed spend, as it goes down the map path: `cost` tokens of `key`
/// (whose hash is `hash`) at `now` (validated nanoseconds), under `quota`.
struct Call<'a, Q: ?Sized> {
    hash: u64,
    key: &'a Q,
    now: Nanos,
    cost: u64,
    quota: &'a Quota,
}

/// # The map path: charging a key, and creating its bucket
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> TokenBucketLimiter<K, S> {
    /// Charges `cost` to `key` at `now` (validated nanoseconds): spends
    /// it from the key's bucket, wherever that bucket lives. Returns the
    /// bucket's new word. `quota` is the default quota or the caller's
    /// (see `plan`).
    ///
    /// `Path` only names the front-end call this is inlined into (see
    /// `calls`): each gets its own copy of the hot path's closures, so
    /// that every step of it is inlined whole into that one call.
    #[allow(clippy::extra_unused_type_parameters)] // `Path`: see above
    #[inline(always)]
    pub(super) fn charge<Path, Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
        quota: &Quota,
    ) -> Result<Nanos, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.buckets.hash(key);
        // Fastest path: the key is hot in this thread, and its moved
        // bucket is cached here (see `hot`). A moved bucket never moves
        // again, but a sweep may retire it; the cache then forgets it and
        // the call goes to the map.
        // A thread that has cached nothing (random traffic over many
        // keys) skips the probe, and only counts its vote.
        let promote = if self.hot.cached_here() {
            let probe = self.hot.probe::<K, Q, _>(
                hash,
                key,
                // Inlined into the probe: the hit path's whole spend.
                #[inline(always)]
                |bucket| SpendError::decision(bucket.spend(now, cost, quota)),
            );
            match probe {
                Probe::Hit(decided) => return decided,
                Probe::Miss { promote } => promote,
            }
        } else {
            self.hot.missed(hash)
        };
        let call = Call {
            hash,
            key,
            now,
            cost,
            quota,
        };
        // Fast path, one shard lock: the key's bucket, in its entry or
        // moved; or a new entry, when the call spends and the cap has room.
        let mut created = false;
        let spent = self.buckets.update_or_insert(
            hash,
            key,
            |bucket| self.spend_in(bucket, &call),
            || {
                // A call that would change nothing on a full bucket (cost
                // 0) or be denied even there creates none here (the slow
                // path answers it).
                let start = self.start_word();
                let spends = matches!(
                    gcra::decide(start, now, cost, quota),
                    Ok(word) if word != start
                );
                let bucket = if spends {
                    self.new_bucket(hash, start)
                } else {
                    None
                };
                created = bucket.is_some();
                bucket
            },
            || self.creation_undone(),
        );
        let decided = match spent {
            Some(Ok(word)) => Ok(word),
            Some(Err(SpendError::Denied(denial))) => Err(denial),
            // Nothing was spent: no live bucket, and none made here.
            _ => return self.charge_slow(&call),
        };
        if created {
            // Outside the shard lock: a step takes other shards' locks.
            if self.occupancy.step_due() {
                self.sweep_step(now);
            }
        } else if promote {
            // Outside the shard lock: `promote` takes it for writing.
            self.promote(hash, key);
        }
        decided
    }

    /// Spends from `bucket`, a map entry under its shard's write lock (the
    /// word is updated in place, and the lock released before any other
    /// call on the map), or from the moved bucket it stands for.
    /// `Retired`: the moved bucket was retired under us.
    #[inline(always)]
    fn spend_in<Q>(&self, bucket: &mut Bucket, call: &Call<'_, Q>) -> Result<Nanos, SpendError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Call {
            key,
            now,
            cost,
            quota,
            ..
        } = *call;
        match bucket.spend_locked(now, cost, quota) {
            Err(SpendError::Moved) => self.spend_moved(key, now, cost, quota),
            other => other,
        }
    }

    /// Spends from the moved bucket of `key`, whose entry says `MOVED`,
    /// under that entry's shard lock (in the lock order of `life`). A `MOVED` word always has its `moved` entry: both change
    /// under this shard's write lock. Out of line: the map path's body
    /// then stays small enough to inline where it is called twice.
    #[cold]
    #[inline(never)]
    fn spend_moved<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
        quota: &Quota,
    ) -> Result<Nanos, SpendError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.moved
            .read(key, |moved| moved.bucket.spend(now, cost, quota))
            .unwrap_or(Err(SpendError::Retired))
    }

    /// Spends from the key's bucket where its entry says it is (see
    /// [`spend_in`](Self::spend_in)). `None`: the key has no entry.
    fn spend_entry<Q>(&self, call: &Call<'_, Q>) -> Option<Result<Nanos, SpendError>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.buckets
            .update(call.hash, call.key, |bucket| self.spend_in(bucket, call))
    }

    /// The rest of `charge`, past a fast path that found no live bucket:
    /// creates one (unless the call would change nothing, or could never
    /// be admitted), or finds the one another thread just made.
    #[cold]
    #[inline(never)]
    fn charge_slow<Q>(&self, call: &Call<'_, Q>) -> Result<Nanos, Denial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A call that would change nothing on a new bucket (cost 0) or
        // be denied there creates no bucket: it is answered from the word
        // of a key without one, read after the fast path found none (a
        // creation below reads it again, under the shard lock).
        let start = self.start_word();
        match gcra::decide(start, call.now, call.cost, call.quota) {
            Ok(word) if word == start => return Ok(word),
            Ok(_) => {}
            Err(denial) => return Err(denial),
        }
        loop {
            // `None`: moved to a handle under us (or retired, which the
            // shard lock rules out); spend where the entry now says.
            if let Some(decided) = SpendError::decision(self.create(call)) {
                return decided;
            }
            if let Some(decided) = self.spend_entry(call).and_then(SpendError::decision) {
                return decided;
            }
        }
    }

    /// Creates the key's bucket (unless another thread just did) and
    /// spends from it.
    fn create<Q>(&self, call: &Call<'_, Q>) -> Result<Nanos, SpendError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let occupancy = &self.occupancy;
        if occupancy.step_due() {
            self.sweep_step(call.now);
        }
        // The shard's write lock makes two racing first calls end up on the
        // same bucket, and the place under the cap is reserved under it only
        // when the key is absent, so a racing creation of the same key is
        // never refused. The key is cloned only here.
        let result = self.buckets.try_write(
            call.hash,
            call.key,
            || self.new_bucket(call.hash, self.start_word()),
            |bucket| bucket.spend_locked(call.now, call.cost, call.quota),
            || self.creation_undone(),
        );
        result.unwrap_or(Err(SpendError::Denied(Denial::LimiterFull {
            max_buckets: occupancy.max_buckets,
        })))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The slow path, entered because the fast path found no live bucket
    /// for a key that another thread then moved to a handle (before the
    /// slow path took the shard lock): it finds the entry `MOVED` and
    /// spends from the handle's bucket. Set up here without the race: the
    /// handle exists, and the slow path is called as the racing call
    /// would reach it. The words expected are the GCRA's by hand: from a
    /// full bucket at 0 s, one token at 1 token/s moves `full_at` to
    /// 1 s, then 2 s; a third is due once `full_at - capacity + 1` (1 s)
    /// has come.
    #[test]
    fn the_slow_path_spends_from_a_bucket_moved_after_the_fast_path_missed() {
        let limiter = crate::TokenBucketLimiter::new(1.0, 2);
        let quota = Quota::new(1.0, 2).expect("a valid quota");
        let handle = limiter.bucket("k");
        let call = Call {
            hash: limiter.buckets.hash("k"),
            key: "k",
            now: Nanos::ZERO,
            cost: 1,
            quota: &quota,
        };
        assert_eq!(limiter.charge_slow(&call), Ok(Nanos::new(1_000_000_000)));
        assert_eq!(
            handle.remaining(0.0),
            Ok(1),
            "spent from the handle's bucket"
        );
        assert_eq!(limiter.charge_slow(&call), Ok(Nanos::new(2_000_000_000)));
        assert_eq!(handle.remaining(0.0), Ok(0));
        assert_eq!(
            limiter.charge_slow(&call),
            Err(Denial::InsufficientTokens {
                retry_after: Duration::from_secs(1)
            })
        );
        assert_eq!(limiter.len(), 1, "no second bucket for the key");
    }
}

//! Which way an in-memory compound call goes: through the calling
//! thread's cache of hot cells for the keys it holds (a call whose every
//! cell is there is denied on a read of them, with nothing shared
//! written), and through the map for the others.

use super::cell::Cell;
#[cfg(loom)]
use super::charge::charge_check_then_spend;
use super::charge::{charge, charge_cached, charge_inline, charge_locked, charge_read_first};
use super::charge::{Charged, Memo, INLINE_SCOPES};
use super::hot::Probe;
use super::limiter::CompoundLimiter;
use super::outcome::{CompoundDecision, CompoundDenial};
use super::store::{Held, InMap, NO_CELLS};
use crate::sync::Arc;
use crate::time::Nanos;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// # The ways a call goes
impl<K: Hash + Eq + 'static, S: BuildHasher + Clone> CompoundLimiter<K, S> {
    /// One scope: through this thread's cache of hot cells if the key is
    /// there (a denial then reads the cell and writes nothing), else under
    /// its shard's lock: on the words inline in its entry, or, for a cell
    /// behind an `Arc`, under the cell's lock too (the store's one lock
    /// order), with no `Arc` taken unless the key is promoted (inline
    /// words then move behind one).
    pub(super) fn charge_one<Q>(
        &self,
        key: &Q,
        policy: &crate::Policy,
        now: Nanos,
        cost: u64,
    ) -> Result<CompoundDecision, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.store.hash(key);
        let len = policy.quotas().len();
        let cached = |cell: &Cell, memo: &mut Option<Memo>| {
            // A cell too short for this policy is lengthened in the map.
            if cell.len() < len {
                return None;
            }
            charge_read_first(cell, memo, policy, now, cost)
        };
        let promote = match self.hot.probe::<K, Q, _>(hash, key, cached) {
            Probe::Hit(decided) => return decided,
            Probe::Miss { promote } => promote,
        };
        let charge = |slot: InMap<'_>| match slot {
            InMap::Inline(words) => (charge_inline(words, policy, now, cost), None),
            InMap::Shared(cell) => {
                // In the map, under its shard's lock: never retired.
                let mut locked = cell.lock().expect("a cell in the map is not retired");
                let decided = charge_locked(&mut locked, policy, now, cost);
                drop(locked);
                (decided, promote.then(|| Arc::clone(cell)))
            }
        };
        let (decided, promoted) = self.in_map(hash, key, len, promote, now, NO_CELLS, charge)?;
        if let Some(cell) = promoted {
            self.hot.insert(hash, key.to_owned(), cell);
        }
        self.store.step(now);
        decided
    }

    /// Several scopes: the cells this thread caches, borrowed there (no
    /// `Arc` taken, no shard locked), and the others' from the map. When
    /// every cell is cached, a denial reads them all at one instant and
    /// writes nothing ([`charge_cached`]); otherwise, and for an
    /// admission, the cells are locked ([`charge`]). A cached cell found
    /// retired, or too short for its policy (the map lengthens it, and
    /// retires it), sends the call through the map for every key, and the
    /// cache forgets a retired cell then. A key that won its vote on the
    /// way is cached after the call.
    pub(super) fn charge_scopes<Q>(
        &self,
        scopes: &[(&Q, &crate::Policy)],
        now: Nanos,
        cost: u64,
    ) -> Result<CompoundDecision, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let n = scopes.len();
        if n > INLINE_SCOPES {
            let hashes: Vec<u64> = scopes
                .iter()
                .map(|(key, _)| self.store.hash(*key))
                .collect();
            loop {
                let mut cells = vec![None; n];
                if let Ok(decided) = self.charge_from_map(&mut cells, &hashes, scopes, now, cost)? {
                    drop(cells);
                    self.store.step(now);
                    return decided;
                }
            }
        }
        let mut hashes = [0; INLINE_SCOPES];
        for (hash, (key, _)) in hashes.iter_mut().zip(scopes) {
            *hash = self.store.hash(*key);
        }
        let hashes = &hashes[..n];
        let mut promote = [false; INLINE_SCOPES];
        // The cells taken from the map by a call that the cache served in
        // part (`fetched[i]` is key `i`'s, if it was not cached); none
        // when every cell is cached.
        let mut fetched: Option<[Option<Arc<Cell>>; INLINE_SCOPES]> = None;
        let cached = |cached: &[Option<&Cell>]| {
            let short = |(cell, (_, policy)): (&Option<&Cell>, &(&Q, &crate::Policy))| {
                cell.is_some_and(|cell| cell.len() < policy.quotas().len())
            };
            if cached.iter().zip(scopes).any(short) {
                return None;
            }
            if cached.iter().all(Option::is_some) {
                return charge_cached(cached, scopes, now, cost);
            }
            let fetched = fetched.insert(Default::default());
            self.charge_partly_cached(cached, fetched, hashes, scopes, now, cost)
        };
        let decided = self
            .hot
            .probe_all::<K, Q, _>(hashes, scopes, &mut promote[..n], cached);
        if let Some(decided) = decided {
            if let Some(fetched) = &mut fetched {
                self.after_map(&mut fetched[..n], hashes, scopes, &promote, now);
            }
            return decided;
        }
        loop {
            let mut cells: [Option<Arc<Cell>>; INLINE_SCOPES] = Default::default();
            let cells = &mut cells[..n];
            // Retired: a sweep or a lengthening took a cell from the map
            // before the call locked it; look the keys up again.
            if let Ok(decided) = self.charge_from_map(cells, hashes, scopes, now, cost)? {
                self.after_map(cells, hashes, scopes, &promote, now);
                return decided;
            }
        }
    }

    /// After a call of several scopes that went to the map: caches the
    /// cells (taken from `cells`, key `i`'s in `cells[i]`) of the keys
    /// that won their votes (`promote[i]`), then takes the automatic
    /// sweep's step.
    fn after_map<Q>(
        &self,
        cells: &mut [Option<Arc<Cell>>],
        hashes: &[u64],
        scopes: &[(&Q, &crate::Policy)],
        promote: &[bool],
        now: Nanos,
    ) where
        K: Borrow<Q>,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        for (i, cell) in cells.iter_mut().enumerate() {
            if let (true, Some(cell)) = (promote[i], cell.take()) {
                self.hot.insert(hashes[i], scopes[i].0.to_owned(), cell);
            }
        }
        self.store.step(now);
    }

    /// Several scopes, some of whose cells this thread caches (`cached[i]`
    /// is key `i`'s, borrowed from the cache and long enough for its
    /// policy, or `None`): the others' cells from the map into `fetched`,
    /// then every cell locked and charged. `None` if a cached cell is
    /// retired before anything is fetched, or a cell was retired before
    /// the call locked it (nothing was spent; the call goes through the
    /// map).
    fn charge_partly_cached<Q>(
        &self,
        cached: &[Option<&Cell>],
        fetched: &mut [Option<Arc<Cell>>; INLINE_SCOPES],
        hashes: &[u64],
        scopes: &[(&Q, &crate::Policy)],
        now: Nanos,
        cost: u64,
    ) -> Option<Result<CompoundDecision, CompoundDenial>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A cached cell found retired only after the others were fetched
        // would send the call through the map with their new cells in it
        // and not held (a sweep that makes room may take them, where the
        // map's path would have spared them): the cache would change
        // which keys the map keeps at the cap.
        if cached.iter().flatten().any(|cell| cell.is_retired()) {
            return None;
        }
        let n = scopes.len();
        if let Err(denial) = self.fetch_from_map(cached, &mut fetched[..n], hashes, scopes, now) {
            return Some(Err(denial));
        }
        let mut cells = [None; INLINE_SCOPES];
        for (i, cell) in cells[..n].iter_mut().enumerate() {
            *cell = cached[i].or(fetched[i].as_deref());
        }
        charge(&cells[..n], scopes, now, cost).ok()
    }

    /// Several scopes through the map: their cells into `cells` (key `i`'s
    /// hash is `hashes[i]`), then charged.
    fn charge_from_map<Q>(
        &self,
        cells: &mut [Option<Arc<Cell>>],
        hashes: &[u64],
        scopes: &[(&Q, &crate::Policy)],
        now: Nanos,
        cost: u64,
    ) -> Result<Charged, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.fetch_from_map(&[], cells, hashes, scopes, now)?;
        #[cfg(loom)]
        if crate::flaw::flawed(crate::flaw::Flaw::CompoundCheckThenSpend) {
            return Ok(charge_check_then_spend(cells, scopes, now, cost));
        }
        Ok(charge(cells, scopes, now, cost))
    }

    /// The cells of the keys that `cached` lacks (key `i`'s is
    /// `cached[i]`, borrowed from this thread's cache, if the call has it)
    /// from the map into `fetched`, each made if new. The cells the call
    /// holds already (the cached ones before key `i`, and those fetched)
    /// are spared if room must be made; a cached cell after it that the
    /// sweep retires sends the call through the map.
    #[inline(always)]
    fn fetch_from_map<Q>(
        &self,
        cached: &[Option<&Cell>],
        fetched: &mut [Option<Arc<Cell>>],
        hashes: &[u64],
        scopes: &[(&Q, &crate::Policy)],
        now: Nanos,
    ) -> Result<(), CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        for (i, (&hash, &(key, policy))) in hashes.iter().zip(scopes).enumerate() {
            if cached.get(i).is_some_and(Option::is_some) {
                continue;
            }
            let held = (&cached[..i.min(cached.len())], &fetched[..i]);
            let len = policy.quotas().len();
            let cell = self.in_map(hash, key, len, true, now, &held, |slot| slot.shared())?;
            fetched[i] = Some(cell.expect("a cell asked for shared is shared"));
        }
        Ok(())
    }

    /// `f` on the key's cell of at least `len` words in the map (its hash
    /// is `hash`; behind an `Arc` if `share`), made if new, under its
    /// shard's lock; at the cap, after the store tried to make room at
    /// `now` (one shard's sweep, and one more for each cell in `held`, the
    /// cells the call holds already, which stay), and
    /// [`CompoundDenial::LimiterFull`] if it made none.
    #[allow(clippy::too_many_arguments)]
    fn in_map<Q, T, H: Held + ?Sized>(
        &self,
        hash: u64,
        key: &Q,
        len: usize,
        share: bool,
        now: Nanos,
        held: &H,
        f: impl Fn(InMap<'_>) -> T,
    ) -> Result<T, CompoundDenial>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.store
            .with_cell(hash, key, len, share, &f)
            .or_else(|full| {
                if !self.store.make_room(now, held) {
                    return Err(full);
                }
                self.store.with_cell(hash, key, len, share, &f)
            })
            .map_err(|_| CompoundDenial::LimiterFull {
                max_keys: self.store.max_keys(),
            })
    }
}

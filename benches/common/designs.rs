//! The reference designs measured beside keyrate and governor: the
//! seed's algorithm under one lock, the design card's DashMap tuple, the
//! bare-map floor (`DashWord`), a lock-free-read prototype and the
//! physical limit of one word per key.

use super::{Competitor, Fold, Spec};
use dashmap::DashMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The seed's algorithm, step for step: `(tokens, last_refill)` in `f64`,
/// refilled on each call, stored on admission and on denial.
#[inline]
fn seed_step(state: &mut (f64, f64), now: f64, cost: u32, rate: f64, capacity: f64) -> bool {
    let (tokens, last) = *state;
    let tokens = (tokens + (now - last) * rate).min(capacity);
    let cost = f64::from(cost);
    if tokens >= cost {
        *state = (tokens - cost, now);
        true
    } else {
        *state = (tokens, now);
        false
    }
}

/// The naive baseline: the seed's algorithm under one lock around a std
/// `HashMap` (SipHash).
pub struct MutexMap {
    map: parking_lot::Mutex<HashMap<String, (f64, f64)>>,
    rate: f64,
    capacity: f64,
    keys: Arc<[String]>,
}

impl MutexMap {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        MutexMap {
            map: parking_lot::Mutex::new(HashMap::new()),
            rate: spec.rate(),
            capacity: f64::from(spec.burst),
            keys,
        }
    }
}

impl Competitor for MutexMap {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, _: u64, now: f64, cost: u32) -> bool {
        let key = self.keys[key].as_str();
        let mut map = self.map.lock();
        if let Some(state) = map.get_mut(key) {
            return seed_step(state, now, cost, self.rate, self.capacity);
        }
        let mut state = (self.capacity, now);
        let admitted = seed_step(&mut state, now, cost, self.rate, self.capacity);
        map.insert(key.to_owned(), state);
        admitted
    }
}

/// The design card's other option: the seed's tuple in DashMap entries
/// (seeded foldhash, as keyrate), updated under the shard's write lock.
pub struct DashTuple {
    map: DashMap<String, (f64, f64), Fold>,
    rate: f64,
    capacity: f64,
    keys: Arc<[String]>,
}

impl DashTuple {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        DashTuple {
            map: DashMap::with_hasher(Fold::default()),
            rate: spec.rate(),
            capacity: f64::from(spec.burst),
            keys,
        }
    }
}

impl Competitor for DashTuple {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, _: u64, now: f64, cost: u32) -> bool {
        let key = self.keys[key].as_str();
        if let Some(mut state) = self.map.get_mut(key) {
            return seed_step(&mut state, now, cost, self.rate, self.capacity);
        }
        let mut state = self
            .map
            .entry(key.to_owned())
            .or_insert((self.capacity, now));
        seed_step(&mut state, now, cost, self.rate, self.capacity)
    }
}

/// One GCRA compare-and-swap on a word holding the instant the bucket is
/// full again (the same algorithm as keyrate's, reduced to whole-nanosecond
/// intervals). A denial only loads.
#[inline]
fn gcra_cas(word: &AtomicU64, now: u64, cost: u32, spec: Spec) -> bool {
    let spend = spec.period_ns * u64::from(cost);
    let window = spec.window();
    // Relaxed: the word is the only state; the compare-exchange orders spends.
    let mut current = word.load(Relaxed);
    loop {
        let missing = current.saturating_sub(now) + spend;
        if missing > window {
            return false;
        }
        match word.compare_exchange_weak(current, now + missing, Relaxed, Relaxed) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}

/// The floor every map-based design must clear: a bare
/// `DashMap<String, AtomicU64>` (seeded foldhash, as keyrate), looked up
/// under the shard's read lock, and one GCRA compare-and-swap on the word.
pub struct DashWord {
    map: DashMap<String, AtomicU64, Fold>,
    spec: Spec,
    keys: Arc<[String]>,
}

impl DashWord {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        DashWord {
            map: DashMap::with_hasher(Fold::default()),
            spec,
            keys,
        }
    }
}

impl Competitor for DashWord {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, ns: u64, _: f64, cost: u32) -> bool {
        let key = self.keys[key].as_str();
        if let Some(word) = self.map.get(key) {
            return gcra_cas(&word, ns, cost, self.spec);
        }
        let word = self
            .map
            .entry(key.to_owned())
            .or_insert_with(|| AtomicU64::new(0));
        gcra_cas(&word, ns, cost, self.spec)
    }
}

/// A prototype of a lock-free-read store, measured in the same harness: a
/// boxed GCRA word per key in `scc::HashIndex` (seeded foldhash). Lookups
/// take no lock and write no shared memory; only the first call for a key
/// takes the bucket's writer lock.
///
/// The word must be boxed: `HashIndex` moves entries when it resizes, and a
/// lock-free `peek_with` may then read a stale copy of the entry (scc
/// documents this), so an atomic stored inline could take a spend that the
/// map no longer holds. Through the box, every copy points to the same word.
pub struct SccBoxWord {
    map: scc::HashIndex<String, Box<AtomicU64>, Fold>,
    spec: Spec,
    keys: Arc<[String]>,
}

impl SccBoxWord {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        SccBoxWord {
            map: scc::HashIndex::with_hasher(Fold::default()),
            spec,
            keys,
        }
    }
}

impl Competitor for SccBoxWord {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, ns: u64, _: f64, cost: u32) -> bool {
        let key = self.keys[key].as_str();
        if let Some(admitted) = self
            .map
            .peek_with(key, |_, word| gcra_cas(word, ns, cost, self.spec))
        {
            return admitted;
        }
        let entry = self
            .map
            .entry_sync(key.to_owned())
            .or_insert_with(|| Box::new(AtomicU64::new(0)));
        gcra_cas(entry.get(), ns, cost, self.spec)
    }
}

/// The physical limit for a keyed limiter: one `AtomicU64` per key in a
/// pre-built `Vec`, indexed directly (no hashing, no map), one GCRA
/// compare-and-swap.
pub struct AtomicFloor {
    words: Vec<AtomicU64>,
    spec: Spec,
}

impl AtomicFloor {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        AtomicFloor {
            words: (0..keys.len()).map(|_| AtomicU64::new(0)).collect(),
            spec,
        }
    }
}

impl Competitor for AtomicFloor {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, ns: u64, _: f64, cost: u32) -> bool {
        gcra_cas(&self.words[key], ns, cost, self.spec)
    }
}

//! The competitors measured by the `contention` and `bytes_per_key`
//! benchmarks, each behind the same small [`Competitor`] trait so that both
//! benchmarks drive them with identical workloads.
//!
//! Every competitor takes the caller's timestamp: none of them reads a clock.

pub mod compound;

use dashmap::DashMap;
use keyrate::{BucketHandle, Limiter, TokenBucketLimiter};
use std::cell::Cell;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// The seeded hasher keyrate uses by default, for the competitors that
/// should differ from keyrate only in their map or their state.
type Fold = foldhash::fast::RandomState;

/// A key shaped like a production API key: `sk_live_` and 32 hex digits,
/// 40 bytes in all. Distinct `n` give distinct keys.
pub fn api_key(n: u64) -> String {
    let high = mix(n);
    let low = mix(high ^ n);
    format!("sk_live_{high:016x}{low:016x}")
}

/// A bijective 64-bit mixer (splitmix64's finaliser), used for keys and as
/// a cheap pseudo-random step.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A bucket shape, expressed the way every competitor can take it: one token
/// per `period_ns`, at most `burst` tokens.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub period_ns: u64,
    pub burst: u32,
}

impl Spec {
    /// Everything admitted: 1e9 tokens/s and about 4.3 s of burst, while the
    /// benchmark's callers advance their timestamps 1 µs per call.
    pub const ADMIT: Spec = Spec {
        period_ns: 1,
        burst: u32::MAX,
    };
    /// One token, then nothing for about three years of caller time.
    pub const DENY: Spec = Spec {
        period_ns: 100_000_000_000_000_000,
        burst: 1,
    };

    fn rate(self) -> f64 {
        1e9 / self.period_ns as f64
    }

    fn window(self) -> u64 {
        self.period_ns * u64::from(self.burst)
    }
}

/// One limiter under test. `call` spends `cost` tokens from key number `key`
/// of the competitor's key table at the caller-supplied time (`ns` and the
/// same instant in seconds, `secs`; each competitor takes the one its API
/// takes) and says whether it was admitted.
pub trait Competitor: Sync {
    /// Per-thread state made before the timed region (keyrate's handles).
    type Local;
    fn local(&self) -> Self::Local;
    fn call(&self, local: &Self::Local, key: usize, ns: u64, secs: f64, cost: u32) -> bool;
    /// keyrate only: keys its threads' hot-key caches have taken in so far.
    fn promotions(&self) -> Option<u64> {
        None
    }
    /// keyrate only: buckets it has created so far.
    fn created(&self) -> Option<u64> {
        None
    }
}

/// keyrate's keyed API: `allow_n(&str, f64 seconds, cost)`.
pub struct Keyrate {
    limiter: TokenBucketLimiter,
    keys: Arc<[String]>,
}

impl Keyrate {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        Keyrate {
            limiter: TokenBucketLimiter::new(spec.rate(), u64::from(spec.burst)),
            keys,
        }
    }

    /// The same, with the per-thread hot-key cache off: every call looks
    /// its key up in the map.
    pub fn without_hot_key_cache(spec: Spec, keys: Arc<[String]>) -> Self {
        let keyrate = Self::new(spec, keys);
        Keyrate {
            limiter: keyrate.limiter.with_hot_key_cache(false),
            keys: keyrate.keys,
        }
    }
}

impl Keyrate {
    /// As users get it, over a `DashMap` (`with_store(Store::DashMap)`).
    pub fn over_dashmap(spec: Spec, keys: Arc<[String]>) -> Self {
        let keyrate = Self::new(spec, keys);
        Keyrate {
            limiter: keyrate.limiter.with_store(keyrate::Store::DashMap),
            keys: keyrate.keys,
        }
    }

    /// As users get it, with the counters and offender sketches off
    /// (`with_stats(false)`): what observing the calls costs.
    pub fn without_stats(spec: Spec, keys: Arc<[String]>) -> Self {
        let keyrate = Self::new(spec, keys);
        Keyrate {
            limiter: keyrate.limiter.with_stats(false),
            keys: keyrate.keys,
        }
    }
}

impl Competitor for Keyrate {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, _: u64, secs: f64, cost: u32) -> bool {
        self.limiter
            .allow_n(self.keys[key].as_str(), secs, u64::from(cost))
    }
    fn promotions(&self) -> Option<u64> {
        Some(self.limiter.stats().hot_key_promotions)
    }
    fn created(&self) -> Option<u64> {
        Some(self.limiter.stats().buckets_created)
    }
}

/// keyrate as users get it, called with the caller's nanoseconds as a
/// `Duration` since its epoch (`allow_n(&str, Duration, cost)`) instead of
/// `f64` seconds: the exact form, for callers that keep time in integers.
pub struct KeyrateNanos(pub Keyrate);

impl KeyrateNanos {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        KeyrateNanos(Keyrate::new(spec, keys))
    }
}

impl Competitor for KeyrateNanos {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, ns: u64, _: f64, cost: u32) -> bool {
        let since = Duration::from_nanos(ns);
        self.0
            .limiter
            .allow_n(self.0.keys[key].as_str(), since, u64::from(cost))
    }
}

/// keyrate's keyed API with the quota passed on every call
/// (`limiter.under(&quota).allow_n(..)`, a per-key plan), the same quota as
/// the default: what naming the quota costs against reading the default.
pub struct KeyrateUnder {
    keyrate: Keyrate,
    quota: keyrate::Quota,
}

impl KeyrateUnder {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        let keyrate = Keyrate::new(spec, keys);
        let quota = keyrate.limiter.quota();
        KeyrateUnder { keyrate, quota }
    }
}

impl Competitor for KeyrateUnder {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, _: u64, secs: f64, cost: u32) -> bool {
        let keys = &self.keyrate.keys;
        self.keyrate
            .limiter
            .under(&self.quota)
            .allow_n(keys[key].as_str(), secs, u64::from(cost))
    }
}

/// keyrate's per-connection handles: each thread resolves every key once
/// (outside the timed region) and then spends with no map lookup.
pub struct KeyrateHandle(pub Keyrate);

impl Competitor for KeyrateHandle {
    type Local = Vec<BucketHandle>;
    fn local(&self) -> Vec<BucketHandle> {
        self.0
            .keys
            .iter()
            .map(|key| self.0.limiter.bucket(key.as_str()))
            .collect()
    }
    #[inline]
    fn call(&self, handles: &Vec<BucketHandle>, key: usize, _: u64, secs: f64, cost: u32) -> bool {
        handles[key].allow_n(secs, u64::from(cost))
    }
}

thread_local! {
    /// The caller's timestamp for governor, set just before each call. One
    /// per thread, so setting it writes no shared memory.
    static GOVERNOR_NOW: Cell<u64> = const { Cell::new(0) };
}

/// A governor clock that reads the timestamp the benchmark passes.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallerClock;

impl governor::clock::Clock for CallerClock {
    type Instant = Duration;
    #[inline]
    fn now(&self) -> Duration {
        Duration::from_nanos(GOVERNOR_NOW.with(Cell::get))
    }
}

type GovernorKeyed = governor::RateLimiter<
    String,
    governor::state::keyed::DefaultKeyedStateStore<String>,
    CallerClock,
    governor::middleware::NoOpMiddleware<Duration>,
>;

/// governor's keyed limiter over DashMap with its default hasher, as a user
/// gets it from `RateLimiter::dashmap_with_clock`.
pub struct Governor {
    limiter: GovernorKeyed,
    keys: Arc<[String]>,
}

impl Governor {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        let quota = governor::Quota::with_period(Duration::from_nanos(spec.period_ns))
            .expect("non-zero period")
            .allow_burst(NonZeroU32::new(spec.burst).expect("non-zero burst"));
        Governor {
            limiter: governor::RateLimiter::dashmap_with_clock(quota, CallerClock),
            keys,
        }
    }
}

impl Competitor for Governor {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, ns: u64, _: f64, cost: u32) -> bool {
        GOVERNOR_NOW.with(|now| now.set(ns));
        let key = &self.keys[key];
        if cost == 1 {
            self.limiter.check_key(key).is_ok()
        } else {
            let n = NonZeroU32::new(cost).expect("non-zero cost");
            matches!(self.limiter.check_key_n(key, n), Ok(Ok(())))
        }
    }
}

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

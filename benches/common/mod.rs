//! The competitors measured by the `contention` and `bytes_per_key`
//! benchmarks, each behind the same small [`Competitor`] trait so that both
//! benchmarks drive them with identical workloads.
//!
//! Every competitor takes the caller's timestamp: none of them reads a clock.

pub mod compound;
mod designs;
mod keys;

// Each benchmark that includes this module uses some of them.
#[allow(unused_imports)]
pub use designs::{AtomicFloor, DashTuple, DashWord, MutexMap, SccBoxWord};
#[allow(unused_imports)]
pub use keys::{api_key, mix, one_of};

use keyrate::{BucketHandle, Limiter, TokenBucketLimiter};
use std::cell::Cell;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

/// The seeded hasher keyrate uses by default, for the competitors that
/// should differ from keyrate only in their map or their state.
type Fold = foldhash::fast::RandomState;

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

//! What the async and the blocking limiter share: the quota, the script,
//! the bucket names, the deadline and the failure policy.

use super::breaker::{Breaker, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_PROBE_EVERY};
use super::error::FailurePolicy;
use super::mirror::{Mirror, DEFAULT_MIRROR_CAPACITY, DEFAULT_MIRROR_REFRESH};
use super::names::Names;
use super::script::BUCKET_SCRIPT;
use crate::gcra::Quota;
use crate::live_quota::LiveQuota;
use crate::time::MAX_TIMESTAMP_NANOS;
use ::redis::Script;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The per-call deadline used unless [`RedisLimiter::with_timeout`](crate::RedisLimiter::with_timeout) sets
/// another.
///
/// [`RedisLimiter::with_timeout`](crate::RedisLimiter::with_timeout): crate::RedisLimiter::with_timeout
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_secs(1);

/// The shortest deadline a limiter accepts: a socket refuses a zero
/// timeout, and a zero deadline would fail every call.
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// The settings of one limiter, cloned with it.
#[derive(Clone)]
pub(super) struct Settings {
    /// The default quota, shared by clones; `set_quota` replaces it.
    pub(super) quota: Arc<LiveQuota>,
    pub(super) script: Arc<Script>,
    /// The compound decision script (`compound/compound.lua`).
    pub(super) compound_script: Arc<Script>,
    /// The namespace and how keys are named in it, shared by clones.
    pub(super) names: Arc<Names>,
    /// The deadline of one call, at least [`MIN_TIMEOUT`].
    pub(super) timeout: Duration,
    /// The least TTL of a written key, in milliseconds.
    pub(super) min_ttl_ms: u64,
    pub(super) failure_policy: FailurePolicy,
    /// The local deny mirror, shared by clones; `None` when turned off.
    pub(super) mirror: Option<Arc<Mirror>>,
    /// How long a mirror's bound may deny after the call that showed it.
    pub(super) mirror_refresh: Duration,
    /// Decision counters, shared by clones (see `stats`).
    pub(super) counters: Arc<crate::observe::Counters>,
    /// Compound decision counters, shared by clones (see `compound_stats`).
    pub(super) compound_counters: Arc<crate::compound::stats::CompoundCounters>,
    /// The circuit breaker, shared by clones.
    pub(super) breaker: Arc<Breaker>,
}

impl Settings {
    pub(super) fn new(quota: Quota) -> Self {
        Settings {
            quota: Arc::new(LiveQuota::new(quota)),
            script: Arc::new(Script::new(BUCKET_SCRIPT)),
            compound_script: Arc::new(Script::new(super::script::COMPOUND_SCRIPT)),
            names: Arc::new(Names::private()),
            timeout: DEFAULT_REDIS_TIMEOUT,
            min_ttl_ms: 0,
            failure_policy: FailurePolicy::default(),
            mirror: Some(Arc::new(Mirror::new(
                DEFAULT_MIRROR_CAPACITY,
                DEFAULT_MIRROR_REFRESH,
            ))),
            mirror_refresh: DEFAULT_MIRROR_REFRESH,
            counters: Arc::new(crate::observe::Counters::new(true)),
            compound_counters: Arc::new(crate::compound::stats::CompoundCounters::new()),
            breaker: Arc::new(Breaker::new(
                DEFAULT_BREAKER_FAILURES,
                DEFAULT_BREAKER_PROBE_EVERY,
            )),
        }
    }

    pub(super) fn set_names(&mut self, names: Names) {
        self.names = Arc::new(names);
    }

    pub(super) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout.max(MIN_TIMEOUT);
    }

    pub(super) fn set_min_ttl(&mut self, min_ttl: Duration) {
        let cap = MAX_TIMESTAMP_NANOS / 1_000_000;
        self.min_ttl_ms = u64::try_from(min_ttl.as_millis()).map_or(cap, |ms| ms.min(cap));
    }

    /// A fresh mirror of `capacity` bounds, or none for 0.
    pub(super) fn set_mirror_capacity(&mut self, capacity: usize) {
        let refresh = self.mirror_refresh;
        self.mirror = (capacity > 0).then(|| Arc::new(Mirror::new(capacity, refresh)));
    }

    /// A fresh mirror whose bounds deny for `refresh`, of the same
    /// capacity (if any).
    pub(super) fn set_mirror_refresh(&mut self, refresh: Duration) {
        self.mirror_refresh = refresh;
        if let Some(capacity) = self.mirror.as_ref().map(|mirror| mirror.capacity()) {
            self.set_mirror_capacity(capacity);
        }
    }

    pub(super) fn bucket_key(&self, key: &str) -> String {
        self.names.bucket_key(key)
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("quota", &self.quota.load())
            .field("names", &self.names)
            .field("timeout", &self.timeout)
            .field("min_ttl_ms", &self.min_ttl_ms)
            .field("failure_policy", &self.failure_policy)
            .field("mirror", &self.mirror)
            .field("breaker", &self.breaker)
            .finish()
    }
}

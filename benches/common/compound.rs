//! Compound competitors: keyrate's `CompoundLimiter` charging one or two
//! quotas of one key, or three scopes (key, org, global) at once, and the
//! three sequential single-quota calls users make today instead.

use super::{Competitor, Spec};
use keyrate::{CompoundLimiter, Policy, Quota, TokenBucketLimiter};
use std::sync::Arc;
use std::time::Duration;

/// Orgs the three-scope competitors spread their keys over.
pub const ORGS: usize = 100;

/// The spec's quota, exactly (its period and burst).
fn spec_quota(spec: Spec) -> Quota {
    Quota::with_interval(Duration::from_nanos(spec.period_ns), u64::from(spec.burst))
        .expect("a benchmark spec is a valid quota")
}

/// A second quota that never binds before the spec's own: twice the
/// refill rate (rounded) and the same burst, or the spec's for a refill
/// too fast to halve.
fn looser_quota(spec: Spec) -> Quota {
    let period = (spec.period_ns / 2).max(1);
    Quota::with_interval(Duration::from_nanos(period), u64::from(spec.burst))
        .expect("a benchmark spec is a valid quota")
}

/// `CompoundLimiter::check(key, policy, secs, cost)` on one key, under a
/// policy of one quota (the spec) or two (the spec and a looser one).
pub struct KeyrateCompound {
    limiter: CompoundLimiter,
    policy: Policy,
    keys: Arc<[String]>,
}

impl KeyrateCompound {
    pub fn new(spec: Spec, keys: Arc<[String]>, quotas: usize) -> Self {
        let policy = match quotas {
            1 => Policy::from(spec_quota(spec)),
            _ => Policy::new([spec_quota(spec), looser_quota(spec)]).expect("two quotas"),
        };
        KeyrateCompound {
            limiter: CompoundLimiter::new(),
            policy,
            keys,
        }
    }
}

impl Competitor for KeyrateCompound {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, _: u64, secs: f64, cost: u32) -> bool {
        self.limiter
            .check(self.keys[key].as_str(), &self.policy, secs, u64::from(cost))
            .is_ok()
    }
}

/// Three scopes in one all-or-nothing call: the key, its org (key number
/// modulo [`ORGS`]) and one global key, each under the spec's quota.
pub struct KeyrateScopes {
    limiter: CompoundLimiter,
    policy: Policy,
    keys: Arc<[String]>,
    orgs: Vec<String>,
}

impl KeyrateScopes {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        KeyrateScopes {
            limiter: CompoundLimiter::new(),
            policy: Policy::from(spec_quota(spec)),
            keys,
            orgs: (0..ORGS).map(|o| format!("org_{o}")).collect(),
        }
    }
}

impl Competitor for KeyrateScopes {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, _: u64, secs: f64, cost: u32) -> bool {
        let p = &self.policy;
        let scopes = [
            (self.keys[key].as_str(), p),
            (self.orgs[key % ORGS].as_str(), p),
            ("global", p),
        ];
        self.limiter
            .check_scopes(&scopes, secs, u64::from(cost))
            .is_ok()
    }
}

/// The same three scopes as three single-quota limiters called one after
/// the other (stopping at the first denial): what users write today, and
/// wrong (a later denial does not give back what an earlier call spent).
pub struct SequentialScopes {
    key: TokenBucketLimiter,
    org: TokenBucketLimiter,
    global: TokenBucketLimiter,
    keys: Arc<[String]>,
    orgs: Vec<String>,
}

impl SequentialScopes {
    pub fn new(spec: Spec, keys: Arc<[String]>) -> Self {
        let make = || TokenBucketLimiter::with_quota(spec_quota(spec));
        SequentialScopes {
            key: make(),
            org: make(),
            global: make(),
            keys,
            orgs: (0..ORGS).map(|o| format!("org_{o}")).collect(),
        }
    }
}

impl Competitor for SequentialScopes {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn call(&self, _: &(), key: usize, _: u64, secs: f64, cost: u32) -> bool {
        let cost = u64::from(cost);
        self.key.allow_n(self.keys[key].as_str(), secs, cost)
            && self.org.allow_n(self.orgs[key % ORGS].as_str(), secs, cost)
            && self.global.allow_n("global", secs, cost)
    }
}

//! The compound limiters' series: decisions by outcome, and denials by the
//! `(scope, quota)` that bound them.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `keyrate_compound_admitted_total`, `keyrate_compound_admitted_cost_total` | counter | |
//! | `keyrate_compound_denied_total` | counter | `reason`: `insufficient_tokens`, `exceeds_capacity`, `invalid_timestamp`, `limiter_full`, `bad_call` |
//! | `keyrate_compound_denied_by_bucket_total` | counter | `scope`, `quota`: the binding bucket's indexes (`scope` `7` counts 7 and later); only buckets that bound a denial |
//! | `keyrate_compound_backend_errors_total`, `keyrate_compound_mirror_denials_total` | counter | (Redis limiters) |
//!
//! At most `7 + 64` series per limiter: scopes and quotas are indexes in
//! the caller's lists, never keys.

use super::{register_counter, Backend, Metrics};
use crate::compound::{CompoundLimiter, CompoundStats, COUNTED_SCOPES, MAX_QUOTAS};
use ::prometheus::Registry;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// A compound limiter that [`Metrics`] can expose: its counters.
pub trait ObserveCompound: Send + Sync {
    /// Where the limiter's buckets live.
    fn backend(&self) -> Backend;
    /// The limiter's compound counters.
    fn compound_stats(&self) -> CompoundStats;
}

impl<K, S> ObserveCompound for CompoundLimiter<K, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync,
{
    fn backend(&self) -> Backend {
        Backend::InProcess
    }

    fn compound_stats(&self) -> CompoundStats {
        self.stats()
    }
}

#[cfg(feature = "redis")]
impl<C: Send + Sync> ObserveCompound for crate::RedisLimiter<C> {
    fn backend(&self) -> Backend {
        Backend::Shared
    }

    fn compound_stats(&self) -> CompoundStats {
        crate::RedisLimiter::compound_stats(self)
    }
}

/// # Compound limiters and layers
impl Metrics {
    /// Exposes a compound limiter (in memory or Redis) under
    /// `limiter="name"`: its decisions, and its denials by the bucket that
    /// bound them.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::prometheus::Metrics;
    /// use keyrate::{CompoundLimiter, Policy, Quota};
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(CompoundLimiter::new());
    /// let metrics = Metrics::new().compound("plans", limiter.clone());
    /// let key = Policy::from(Quota::new(1.0, 5).unwrap());
    /// let org = Policy::from(Quota::new(1.0, 1).unwrap());
    /// let scopes = [("sk_live_1", &key), ("org_7", &org)];
    /// assert!(limiter.check_scopes(&scopes, 0.0, 1).is_ok());
    /// assert!(limiter.check_scopes(&scopes, 0.0, 1).is_err());
    /// let text = metrics.render();
    /// assert!(text.contains(
    ///     r#"keyrate_compound_denied_by_bucket_total{limiter="plans",quota="0",scope="1"} 1"#
    /// ));
    /// assert!(!text.contains("sk_live_1"));
    /// ```
    #[must_use]
    pub fn compound(mut self, name: &str, limiter: Arc<dyn ObserveCompound>) -> Self {
        self.compound.push((name.to_owned(), limiter));
        self
    }

    /// Exposes a [`CompoundLimitLayer`](crate::layer::CompoundLimitLayer)'s
    /// responses by status under `limiter="name"`, as [`layer`](Self::layer).
    #[cfg(feature = "tower")]
    #[must_use]
    pub fn compound_layer<L, F, C>(
        self,
        name: &str,
        layer: &crate::layer::CompoundLimitLayer<L, F, C>,
    ) -> Self {
        self.responses(name, layer.response_counts())
    }
}

/// # The compound limiters' series
impl Metrics {
    pub(super) fn encode_compound(&self, registry: &Registry) -> Result<(), ::prometheus::Error> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register_counter(registry, name, help, labels)
        };
        let limiter = &["limiter"];
        let admitted = counter(
            "keyrate_compound_admitted_total",
            "Compound calls admitted.",
            limiter,
        )?;
        let cost = counter(
            "keyrate_compound_admitted_cost_total",
            "Tokens spent from each bucket by admitted compound calls.",
            limiter,
        )?;
        let denied = counter(
            "keyrate_compound_denied_total",
            "Compound calls denied, by reason.",
            &["limiter", "reason"],
        )?;
        let by_bucket = counter(
            "keyrate_compound_denied_by_bucket_total",
            "Compound calls denied by a quota, by the bucket that bound them.",
            &["limiter", "scope", "quota"],
        )?;
        let backend = counter(
            "keyrate_compound_backend_errors_total",
            "Compound calls whose Redis round trip failed.",
            limiter,
        )?;
        let mirror = counter(
            "keyrate_compound_mirror_denials_total",
            "Compound denials the Redis deny mirror decided locally.",
            limiter,
        )?;
        for (name, source) in &self.compound {
            let stats = source.compound_stats();
            let l = &[name.as_str()];
            admitted.with_label_values(l).inc_by(stats.admitted);
            cost.with_label_values(l).inc_by(stats.admitted_cost);
            for (reason, n) in [
                ("insufficient_tokens", stats.denied_insufficient_tokens),
                ("exceeds_capacity", stats.denied_exceeds_capacity),
                ("invalid_timestamp", stats.denied_invalid_timestamp),
                ("limiter_full", stats.denied_limiter_full),
                ("bad_call", stats.denied_bad_call),
            ] {
                denied.with_label_values(&[name.as_str(), reason]).inc_by(n);
            }
            for scope in 0..COUNTED_SCOPES {
                for quota in 0..MAX_QUOTAS {
                    let n = stats.denied_by(scope, quota);
                    if n > 0 {
                        let (s, q) = (scope.to_string(), quota.to_string());
                        by_bucket
                            .with_label_values(&[name.as_str(), &s, &q])
                            .inc_by(n);
                    }
                }
            }
            if source.backend() == Backend::Shared {
                backend.with_label_values(l).inc_by(stats.backend_errors);
                mirror.with_label_values(l).inc_by(stats.mirror_denials);
            }
        }
        Ok(())
    }
}

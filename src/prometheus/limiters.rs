//! The limiters' series: what a rate limiter exposes ([`Observe`], by
//! where its buckets live: [`Backend`]), and their encoding, its top
//! offenders included.

use super::{register_counter, register_gauge, saturate, Metrics};
use crate::keyed::TokenBucketLimiter;
use crate::observe::{Offenders, Stats};
use ::prometheus::{CounterVec, Opts, Registry};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// Where a limiter's buckets live, and so what it can measure.
///
/// | series | `InProcess` | `Shared` |
/// |---|---|---|
/// | admitted, admitted cost, denied by reason | yes | yes (this process's calls) |
/// | buckets, created, evicted, sweeps, sweep time, hot-key promotions, offenders | yes | no: the buckets live in the backend |
/// | backend errors, mirror denials | no: there is no backend | yes |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// In this process's memory ([`TokenBucketLimiter`]).
    InProcess,
    /// In a store shared by many processes (Redis).
    Shared,
}

/// A limiter that [`Metrics`] can expose: its counters, and its top
/// offenders with keys as label values.
pub trait Observe: Send + Sync {
    /// Where the limiter's buckets live, which decides what it measures:
    /// [`Metrics`] exports only those series.
    fn backend(&self) -> Backend;
    /// The limiter's counters.
    fn stats(&self) -> Stats;
    /// The `n` keys denied most, as text (raw: [`Metrics`] labels them);
    /// none by default.
    fn top_offenders(&self, n: usize) -> Offenders<String> {
        let _ = n;
        Offenders {
            top: Vec::new(),
            max_error: 0,
            denials: 0,
        }
    }
    /// The buckets held, if the limiter knows.
    fn buckets(&self) -> Option<usize> {
        None
    }
}

impl<K, S> Observe for TokenBucketLimiter<K, S>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync,
{
    fn backend(&self) -> Backend {
        Backend::InProcess
    }

    fn stats(&self) -> Stats {
        TokenBucketLimiter::stats(self)
    }

    fn top_offenders(&self, n: usize) -> Offenders<String> {
        let offenders = TokenBucketLimiter::top_offenders(self, n);
        Offenders {
            top: offenders
                .top
                .into_iter()
                .map(|(key, count)| (key.to_string(), count))
                .collect(),
            max_error: offenders.max_error,
            denials: offenders.denials,
        }
    }

    fn buckets(&self) -> Option<usize> {
        Some(self.len())
    }
}

impl Metrics {
    /// Exposes `limiter` under `limiter="name"`.
    #[must_use]
    pub fn limiter(mut self, name: &str, limiter: Arc<dyn Observe>) -> Self {
        self.limiters.push((name.to_owned(), limiter));
        self
    }
}

impl Metrics {
    /// Registers the limiters' series in `registry`, with their values.
    pub(super) fn encode_limiters(&self, registry: &Registry) -> Result<(), ::prometheus::Error> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register_counter(registry, name, help, labels)
        };
        let gauge =
            |name: &str, help: &str, labels: &[&str]| register_gauge(registry, name, help, labels);
        let limiter = &["limiter"];
        let admitted = counter("keyrate_admitted_total", "Calls admitted.", limiter)?;
        let cost = counter(
            "keyrate_admitted_cost_total",
            "Tokens spent by admitted calls.",
            limiter,
        )?;
        let denied = counter(
            "keyrate_denied_total",
            "Calls denied, by reason.",
            &["limiter", "reason"],
        )?;
        let created = counter("keyrate_buckets_created_total", "Buckets created.", limiter)?;
        let evicted = counter(
            "keyrate_buckets_evicted_total",
            "Buckets evicted by sweeps.",
            limiter,
        )?;
        let sweeps = counter("keyrate_sweeps_total", "Sweeps run.", limiter)?;
        let sweep_seconds = CounterVec::new(
            Opts::new("keyrate_sweep_seconds_total", "Time spent sweeping."),
            limiter,
        )?;
        registry.register(Box::new(sweep_seconds.clone()))?;
        let backend = counter(
            "keyrate_backend_errors_total",
            "Calls whose backend (Redis) round trip failed.",
            limiter,
        )?;
        let mirror = counter(
            "keyrate_mirror_denials_total",
            "Denials the Redis deny mirror decided locally, with no round trip.",
            limiter,
        )?;
        let promotions = counter(
            "keyrate_hot_key_promotions_total",
            "Keys taken into a thread's hot-key cache.",
            limiter,
        )?;
        let buckets = gauge("keyrate_buckets", "Buckets held.", limiter)?;
        let offender = gauge(
            "keyrate_offender_denials",
            "Approximate denials of a top offender in the recent window.",
            &["limiter", "key"],
        )?;
        let max_error = gauge(
            "keyrate_offenders_max_error",
            "The most by which an offender's count can be off.",
            limiter,
        )?;
        let window = gauge(
            "keyrate_offenders_window_denials",
            "Denials counted in the offenders' window.",
            limiter,
        )?;
        for (name, source) in &self.limiters {
            let stats = source.stats();
            let l = &[name.as_str()];
            admitted.with_label_values(l).inc_by(stats.admitted);
            cost.with_label_values(l).inc_by(stats.admitted_cost);
            for (reason, n) in [
                ("insufficient_tokens", stats.denied_insufficient_tokens),
                ("exceeds_capacity", stats.denied_exceeds_capacity),
                ("invalid_timestamp", stats.denied_invalid_timestamp),
                ("limiter_full", stats.denied_limiter_full),
            ] {
                denied.with_label_values(&[name.as_str(), reason]).inc_by(n);
            }
            if source.backend() == Backend::Shared {
                backend.with_label_values(l).inc_by(stats.backend_errors);
                mirror.with_label_values(l).inc_by(stats.mirror_denials);
                continue;
            }
            created.with_label_values(l).inc_by(stats.buckets_created);
            evicted.with_label_values(l).inc_by(stats.buckets_evicted);
            sweeps.with_label_values(l).inc_by(stats.sweeps);
            sweep_seconds
                .with_label_values(l)
                .inc_by(stats.sweep_time.as_secs_f64());
            promotions
                .with_label_values(l)
                .inc_by(stats.hot_key_promotions);
            if let Some(n) = source.buckets() {
                buckets.with_label_values(l).set(saturate(n as u64));
            }
            let offenders = source.top_offenders(self.top).labelled(&self.labels);
            for (key, count) in offenders.top.iter().take(self.top) {
                offender
                    .with_label_values(&[name.as_str(), key.as_str()])
                    .set(saturate(*count));
            }
            max_error
                .with_label_values(l)
                .set(saturate(offenders.max_error));
            window.with_label_values(l).set(saturate(offenders.denials));
        }
        Ok(())
    }
}

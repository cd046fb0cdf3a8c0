//! The concurrency limiters' series: what each backend measures, and its
//! encoding. No series names a key.

use super::{register_counter, register_gauge, saturate, Metrics};
use crate::concurrency::{ConcurrencyLimiter, ConcurrencyStats};
use ::prometheus::{IntCounterVec, IntGaugeVec, Registry};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// What a concurrency limiter measures, by where its permits live:
/// [`Metrics`] exports only the series its variant has.
///
/// | series | `InProcess` | `Leases` (Redis) |
/// |---|---|---|
/// | `keyrate_concurrency_in_flight` | permits held, over every key | permits with a lease this process holds |
/// | `keyrate_concurrency_acquired_total` | yes | yes (this process's) |
/// | `keyrate_concurrency_refused_total{reason}` | `at_limit`, `limiter_full`, `timed_out`, `rate_limited` | `at_limit`, `timed_out` |
/// | `keyrate_concurrency_keys` | yes | no: the keys live in Redis |
/// | `keyrate_concurrency_waiting` | yes | yes (this process's callers) |
/// | `keyrate_concurrency_failed_total`, `keyrate_concurrency_degraded_total` | no: there is no backend | yes |
/// | `keyrate_concurrency_release_failures_total` | no | yes |
/// | `keyrate_concurrency_renew_rounds_total`, `keyrate_concurrency_renew_calls_total`, `keyrate_concurrency_renew_failures_total` | no | yes |
/// | `keyrate_concurrency_leases_lost_total` | no | yes |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConcurrencyReport {
    /// An in-memory [`ConcurrencyLimiter`]'s stats.
    InProcess(ConcurrencyStats),
    /// A [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter)'s
    /// counts in this process.
    #[cfg(feature = "redis")]
    Leases(crate::RedisConcurrencyStats),
}

/// A concurrency limiter that [`Metrics`] can expose: its permits in
/// flight and outcomes, and what else its backend measures. No key is
/// ever read from it.
pub trait ObserveConcurrency: Send + Sync {
    /// The limiter's gauges and counters now.
    fn report(&self) -> ConcurrencyReport;
}

impl<K, S> ObserveConcurrency for ConcurrencyLimiter<K, S>
where
    K: Hash + Eq + Send + Sync,
    S: BuildHasher + Clone + Send + Sync,
{
    fn report(&self) -> ConcurrencyReport {
        ConcurrencyReport::InProcess(self.stats())
    }
}

#[cfg(feature = "redis")]
impl<C: Send + Sync> ObserveConcurrency for crate::RedisConcurrencyLimiter<C> {
    fn report(&self) -> ConcurrencyReport {
        ConcurrencyReport::Leases(self.stats())
    }
}

impl Metrics {
    /// Exposes a concurrency limiter under `limiter="name"`: its permits
    /// in flight (a gauge), its permits given and its refusals by reason
    /// (counters), and what else its backend measures (see
    /// [`ConcurrencyReport`]): an in-memory [`ConcurrencyLimiter`]
    /// its keys and waiters, a
    /// [`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter) its
    /// failed acquires, renewals and leases lost. No series names a key.
    ///
    /// The scrape of an in-memory limiter counts the permits in flight by
    /// visiting every key (see [`ConcurrencyLimiter::stats`](crate::ConcurrencyLimiter::stats)).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::prometheus::Metrics;
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(1));
    /// let metrics = Metrics::new().concurrency("streams", streams.clone());
    /// let _held = streams.try_acquire("sk_live_1").unwrap();
    /// assert!(streams.try_acquire("sk_live_1").is_err());
    /// let text = metrics.render();
    /// assert!(text.contains(r#"keyrate_concurrency_in_flight{limiter="streams"} 1"#));
    /// assert!(text.contains(r#"keyrate_concurrency_refused_total{limiter="streams",reason="at_limit"} 1"#));
    /// assert!(!text.contains("sk_live_1"));
    /// ```
    #[must_use]
    pub fn concurrency(mut self, name: &str, limiter: Arc<dyn ObserveConcurrency>) -> Self {
        self.concurrency.push((name.to_owned(), limiter));
        self
    }
}

/// The series, registered once per scrape; a series with no limiter to
/// report it is left out of the text.
struct Series {
    in_flight: IntGaugeVec,
    keys: IntGaugeVec,
    waiting: IntGaugeVec,
    acquired: IntCounterVec,
    refused: IntCounterVec,
    /// The Redis limiters' own counters, each with its reader.
    #[cfg(feature = "redis")]
    leases: Vec<(Read, IntCounterVec)>,
}

/// Reads one of a Redis limiter's counters.
#[cfg(feature = "redis")]
type Read = fn(&crate::RedisConcurrencyStats) -> u64;

/// The Redis limiters' own counters: name (after `keyrate_concurrency_`,
/// before `_total`), help, and where it is read.
#[cfg(feature = "redis")]
const LEASE_COUNTERS: [(&str, &str, Read); 7] = [
    (
        "failed",
        "Acquires Redis could not decide, answered by the failure policy.",
        |s| s.failed,
    ),
    (
        "degraded",
        "Of the failed acquires, those admitted without a lease (fail open).",
        |s| s.degraded,
    ),
    (
        "release_failures",
        "Lease releases that failed (the lease expires within the lease time).",
        |s| s.release_failures,
    ),
    ("renew_rounds", "Lease renewal rounds done.", |s| {
        s.renew_rounds
    }),
    ("renew_calls", "Lease renewal calls sent to Redis.", |s| {
        s.renew_calls
    }),
    (
        "renew_failures",
        "Lease renewal calls that failed (retried next round).",
        |s| s.renew_failures,
    ),
    (
        "leases_lost",
        "Leases a renewal found gone: their permits hold no lease any more.",
        |s| s.leases_lost,
    ),
];

impl Series {
    fn register(registry: &Registry) -> Result<Self, ::prometheus::Error> {
        let limiter = &["limiter"];
        let gauge = |name: &str, help: &str| register_gauge(registry, name, help, limiter);
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register_counter(registry, name, help, labels)
        };
        #[cfg(feature = "redis")]
        let leases = LEASE_COUNTERS
            .iter()
            .map(|(name, help, read)| {
                let full = format!("keyrate_concurrency_{name}_total");
                Ok((*read, counter(&full, help, limiter)?))
            })
            .collect::<Result<_, ::prometheus::Error>>()?;
        Ok(Series {
            in_flight: gauge(
                "keyrate_concurrency_in_flight",
                "Concurrency permits held now (in memory: over every key; Redis: this process's leases).",
            )?,
            keys: gauge(
                "keyrate_concurrency_keys",
                "Keys a concurrency limiter tracks now.",
            )?,
            waiting: gauge(
                "keyrate_concurrency_waiting",
                "Callers waiting for a concurrency permit now.",
            )?,
            acquired: counter(
                "keyrate_concurrency_acquired_total",
                "Concurrency permits given.",
                limiter,
            )?,
            refused: counter(
                "keyrate_concurrency_refused_total",
                "Concurrency permits refused, by reason.",
                &["limiter", "reason"],
            )?,
            #[cfg(feature = "redis")]
            leases,
        })
    }

    fn refused(&self, name: &str, reasons: &[(&str, u64)]) {
        for (reason, n) in reasons {
            self.refused.with_label_values(&[name, reason]).inc_by(*n);
        }
    }

    fn in_process(&self, name: &str, stats: &ConcurrencyStats) {
        let l = &[name];
        self.in_flight
            .with_label_values(l)
            .set(saturate(stats.in_flight));
        self.keys.with_label_values(l).set(saturate(stats.keys));
        self.waiting
            .with_label_values(l)
            .set(saturate(stats.waiting));
        self.acquired.with_label_values(l).inc_by(stats.acquired);
        self.refused(
            name,
            &[
                ("at_limit", stats.refused_at_limit),
                ("limiter_full", stats.refused_limiter_full),
                ("timed_out", stats.timed_out),
                ("rate_limited", stats.rate_limited),
            ],
        );
    }

    #[cfg(feature = "redis")]
    fn leases(&self, name: &str, stats: &crate::RedisConcurrencyStats) {
        let l = &[name];
        self.in_flight
            .with_label_values(l)
            .set(saturate(stats.held));
        self.waiting
            .with_label_values(l)
            .set(saturate(stats.waiting));
        self.acquired.with_label_values(l).inc_by(stats.acquired);
        self.refused(
            name,
            &[
                ("at_limit", stats.refused_at_limit),
                ("timed_out", stats.timed_out),
            ],
        );
        for (read, metric) in &self.leases {
            metric.with_label_values(l).inc_by(read(stats));
        }
    }
}

/// # The concurrency limiters' series
impl Metrics {
    pub(super) fn encode_concurrency(
        &self,
        registry: &Registry,
    ) -> Result<(), ::prometheus::Error> {
        let series = Series::register(registry)?;
        for (name, source) in &self.concurrency {
            match source.report() {
                ConcurrencyReport::InProcess(stats) => series.in_process(name, &stats),
                #[cfg(feature = "redis")]
                ConcurrencyReport::Leases(stats) => series.leases(name, &stats),
            }
        }
        Ok(())
    }
}

//! Prometheus text exposition of limiters' counters, their top offenders,
//! concurrency limiters' permits and the layers' responses (feature
//! `prometheus`).
//!
//! [`Metrics`] names the limiters (and layers) to expose, and
//! [`render`](Metrics::render) reads them and encodes the Prometheus text
//! format (version 0.0.4, [`CONTENT_TYPE`]) with the `prometheus` crate.
//! Every series carries a `limiter` label (the name given), and a limiter
//! exports only what its [`Backend`] measures:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `keyrate_admitted_total` | counter | |
//! | `keyrate_admitted_cost_total` | counter | |
//! | `keyrate_denied_total` | counter | `reason`: `insufficient_tokens`, `exceeds_capacity`, `invalid_timestamp`, `limiter_full` |
//! | `keyrate_buckets_created_total`, `keyrate_buckets_evicted_total` | counter | |
//! | `keyrate_sweeps_total`, `keyrate_sweep_seconds_total` | counter | |
//! | `keyrate_backend_errors_total` | counter | (Redis limiters) |
//! | `keyrate_mirror_denials_total` | counter | (Redis limiters: denials decided locally, with no round trip) |
//! | `keyrate_hot_key_promotions_total` | counter | (in-memory limiters: keys taken into a thread's hot-key cache) |
//! | `keyrate_buckets` | gauge | (in-memory limiters) |
//! | `keyrate_offender_denials` | gauge | `key`: one series per top offender, the key's label (below) |
//! | `keyrate_offenders_max_error`, `keyrate_offenders_window_denials` | gauge | |
//! | `keyrate_http_responses_total` | counter | `status`: `200` (admitted), `400`, `401`, `411`, `413`, `429`, `431`, `503`; `limiter` is the layer's name |
//! | `keyrate_concurrency_in_flight` | gauge | (concurrency limiters: permits held now; over every key in memory, this process's leases on Redis) |
//! | `keyrate_concurrency_keys` | gauge | (in-memory concurrency limiters: keys tracked) |
//! | `keyrate_concurrency_waiting` | gauge | (concurrency limiters: callers waiting; on Redis, this process's) |
//! | `keyrate_concurrency_acquired_total` | counter | (concurrency limiters: permits given) |
//! | `keyrate_concurrency_refused_total` | counter | `reason`: `at_limit`, `limiter_full`, `timed_out`, `rate_limited` (Redis: `at_limit`, `timed_out`) |
//! | `keyrate_concurrency_failed_total`, `keyrate_concurrency_degraded_total` | counter | (Redis concurrency limiters: acquires Redis could not decide; of those, admitted without a lease) |
//! | `keyrate_concurrency_release_failures_total` | counter | (Redis concurrency limiters) |
//! | `keyrate_concurrency_renew_rounds_total`, `keyrate_concurrency_renew_calls_total`, `keyrate_concurrency_renew_failures_total` | counter | (Redis concurrency limiters: lease renewals) |
//! | `keyrate_concurrency_leases_lost_total` | counter | (Redis concurrency limiters: leases a renewal found gone) |
//!
//! A concurrency limiter ([`Metrics::concurrency`]) is exported with no
//! per-key series at all: its keys are counted, never named; it exports
//! what its backend measures ([`ConcurrencyReport`]). A compound
//! limiter ([`Metrics::compound`]) exports `keyrate_compound_*` series:
//! its decisions, and its denials by the `(scope, quota)` that bound them
//! (`keyrate_compound_denied_by_bucket_total{scope="1",quota="0"}`), no
//! key either.
//!
//! # Keys
//!
//! A key appears only as the `key` label of `keyrate_offender_denials`,
//! shown by the [`KeyLabels`] policy of [`with_key_labels`](Metrics::with_key_labels):
//! by default a fingerprint (a keyed hash of the whole key, after a type
//! tag such as `sk_live_` only where you list it, see [`KeyLabels`]),
//! never the raw key, which a scrape endpoint that
//! anyone can read would otherwise publish for any key that got one 429.
//! Labels are at most 64 bytes. [`KeyLabels::raw`] shows keys that are not
//! secrets; [`KeyLabels::with`] your own function (key -> customer id).
//!
//! # Cardinality
//!
//! A limiter contributes at most 15 series plus one per listed offender,
//! and offenders are capped at [`with_top_offenders`](Metrics::with_top_offenders)
//! (by default [`DEFAULT_TOP_OFFENDERS`], 10) per limiter, whatever keys
//! arrive; a layer contributes 6 and a concurrency limiter at most 12
//! (8 in memory, 12 on Redis). So `n` limiters, `m` layers and `c`
//! concurrency limiters expose at most `n * (15 + top) + 6 * m + 12 * c`
//! series.
//!
//! Files: `mod.rs` ([`Metrics`]: what to expose, and the encoder over
//! every family), `limiters.rs` (the rate limiters' series and
//! offenders), `layers.rs` (the layers' responses), `concurrency.rs` and
//! `compound.rs` (those limiters' series).

mod compound;
mod concurrency;
mod layers;
mod limiters;

pub use self::compound::ObserveCompound;
pub use self::concurrency::{ConcurrencyReport, ObserveConcurrency};
pub use self::limiters::{Backend, Observe};

use self::layers::ResponsesFn;
use crate::observe::KeyLabels;
use ::prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use std::fmt;
use std::sync::Arc;

/// Offenders listed per limiter unless [`Metrics::with_top_offenders`]
/// says otherwise.
pub const DEFAULT_TOP_OFFENDERS: usize = 10;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The limiters and layers to expose, and how many offenders to list.
///
/// # Examples
///
/// ```
/// use keyrate::prometheus::Metrics;
/// use keyrate::TokenBucketLimiter;
/// use std::sync::Arc;
///
/// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1).with_top_offenders(true));
/// let metrics = Metrics::new().limiter("api", limiter.clone());
/// assert!(limiter.allow("alice", 0.0));
/// assert!(limiter.allow("mallory", 0.0));
/// assert!(!limiter.allow("mallory", 0.0));
/// let text = metrics.render();
/// assert!(text.contains(r#"keyrate_admitted_total{limiter="api"} 2"#));
/// // The offender by its fingerprint, never its raw key.
/// let label = keyrate::KeyLabels::fingerprint().label("mallory");
/// assert!(text.contains(&format!(r#"keyrate_offender_denials{{key="{label}",limiter="api"}} 1"#)));
/// assert!(!text.contains("mallory"));
/// ```
pub struct Metrics {
    limiters: Vec<(String, Arc<dyn Observe>)>,
    concurrency: Vec<(String, Arc<dyn ObserveConcurrency>)>,
    compound: Vec<(String, Arc<dyn ObserveCompound>)>,
    layers: Vec<(String, ResponsesFn)>,
    top: usize,
    labels: KeyLabels,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limiters: Vec<_> = self.limiters.iter().map(|(name, _)| name).collect();
        let concurrency: Vec<_> = self.concurrency.iter().map(|(name, _)| name).collect();
        let compound: Vec<_> = self.compound.iter().map(|(name, _)| name).collect();
        let layers: Vec<_> = self.layers.iter().map(|(name, _)| name).collect();
        f.debug_struct("Metrics")
            .field("limiters", &limiters)
            .field("concurrency", &concurrency)
            .field("compound", &compound)
            .field("layers", &layers)
            .field("top", &self.top)
            .field("labels", &self.labels)
            .finish()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Nothing to expose yet; [`DEFAULT_TOP_OFFENDERS`] offenders per limiter.
    #[must_use]
    pub fn new() -> Self {
        Metrics {
            limiters: Vec::new(),
            concurrency: Vec::new(),
            compound: Vec::new(),
            layers: Vec::new(),
            top: DEFAULT_TOP_OFFENDERS,
            labels: KeyLabels::default(),
        }
    }

    /// Shows offenders' keys in the `key` label by `labels` instead of
    /// the default fingerprint ([`KeyLabels::fingerprint`], under the
    /// process's default secret).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::prometheus::Metrics;
    /// use keyrate::{KeyLabels, TokenBucketLimiter};
    /// use std::sync::Arc;
    ///
    /// // Keyed by tenant ids, which are not secrets: shown as they are.
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1).with_top_offenders(true));
    /// let metrics = Metrics::new().with_key_labels(KeyLabels::raw()).limiter("api", limiter.clone());
    /// assert!(limiter.allow("tenant-7", 0.0) && !limiter.allow("tenant-7", 0.0));
    /// assert!(metrics.render().contains(r#"keyrate_offender_denials{key="tenant-7",limiter="api"} 1"#));
    ///
    /// // A fleet's processes share a secret, so their labels agree.
    /// let shared = Metrics::new()
    ///     .with_key_labels(KeyLabels::fingerprint_with_secret(b"from the operator's vault")?)
    ///     .limiter("api", limiter.clone());
    /// let label = KeyLabels::fingerprint_with_secret(b"from the operator's vault")?.label("tenant-7");
    /// assert!(shared.render().contains(&format!(r#"{{key="{label}",limiter="api"}} 1"#)));
    /// # Ok::<(), keyrate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn with_key_labels(mut self, labels: KeyLabels) -> Self {
        self.labels = labels;
        self
    }

    /// Lists at most `n` offenders per limiter (0: none).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::prometheus::Metrics;
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1).with_top_offenders(true));
    /// let all = Metrics::new().limiter("api", limiter.clone());
    /// let none = Metrics::new().with_top_offenders(0).limiter("api", limiter.clone());
    /// assert!(limiter.allow("k", 0.0) && !limiter.allow("k", 0.0));
    /// assert!(all.render().contains("keyrate_offender_denials{"));
    /// assert!(!none.render().contains("keyrate_offender_denials{"));
    /// ```
    #[must_use]
    pub fn with_top_offenders(mut self, n: usize) -> Self {
        self.top = n;
        self
    }

    /// The current values, in the Prometheus text format.
    #[must_use]
    pub fn render(&self) -> String {
        match self.encode() {
            Ok(text) => text,
            // Only a bug in the metric definitions can fail.
            Err(err) => format!("# keyrate: cannot encode metrics: {err}\n"),
        }
    }

    fn encode(&self) -> Result<String, ::prometheus::Error> {
        let registry = Registry::new();
        self.encode_limiters(&registry)?;
        if !self.layers.is_empty() {
            self.encode_layers(&registry)?;
        }
        if !self.concurrency.is_empty() {
            self.encode_concurrency(&registry)?;
        }
        if !self.compound.is_empty() {
            self.encode_compound(&registry)?;
        }
        let mut text = String::new();
        TextEncoder::new().encode_utf8(&registry.gather(), &mut text)?;
        Ok(text)
    }
}

fn saturate(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A counter family named `name`, registered in `registry`: every series
/// family is made this way, by the limiters', layers', compound and
/// concurrency encoders alike.
pub(super) fn register_counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, ::prometheus::Error> {
    let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// A gauge family named `name`, registered in `registry` (see
/// [`register_counter`]).
pub(super) fn register_gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, ::prometheus::Error> {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

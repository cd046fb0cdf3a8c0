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
//! by default a fingerprint (`sk_live_#` and a keyed hash of the whole key,
//! see [`KeyLabels`]), never the raw key, which a scrape endpoint that
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

mod compound;

pub use self::compound::ObserveCompound;

use crate::keyed::TokenBucketLimiter;
use crate::observe::{KeyLabels, Offenders, Stats};
use ::prometheus::{CounterVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

mod concurrency;

pub use self::concurrency::{ConcurrencyReport, ObserveConcurrency};

/// Offenders listed per limiter unless [`Metrics::with_top_offenders`]
/// says otherwise.
pub const DEFAULT_TOP_OFFENDERS: usize = 10;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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

/// A reader of a layer's responses.
type ResponsesFn = Box<dyn Fn() -> [(&'static str, u64); 8] + Send + Sync>;

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
    ///     .with_key_labels(KeyLabels::fingerprint_with_secret(b"from the vault"))
    ///     .limiter("api", limiter.clone());
    /// let label = KeyLabels::fingerprint_with_secret(b"from the vault").label("tenant-7");
    /// assert!(shared.render().contains(&format!(r#"{{key="{label}",limiter="api"}} 1"#)));
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

    /// Exposes `limiter` under `limiter="name"`.
    #[must_use]
    pub fn limiter(mut self, name: &str, limiter: Arc<dyn Observe>) -> Self {
        self.limiters.push((name.to_owned(), limiter));
        self
    }

    /// Exposes a concurrency limiter under `limiter="name"`: its permits
    /// in flight (a gauge), its permits given and its refusals by reason
    /// (counters), and what else its backend measures (see
    /// [`ConcurrencyReport`]): an in-memory [`ConcurrencyLimiter`](crate::ConcurrencyLimiter)
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

    /// Exposes `layer`'s responses by status under `limiter="name"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::prometheus::Metrics;
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    ///
    /// let layer = RateLimitLayer::new(Arc::new(TokenBucketLimiter::new(1.0, 1)), bearer_token);
    /// let metrics = Metrics::new().layer("api", &layer);
    /// assert!(metrics.render().contains(r#"keyrate_http_responses_total{limiter="api",status="429"} 0"#));
    /// ```
    #[cfg(feature = "tower")]
    #[must_use]
    pub fn layer<L, F, K, C, P>(
        self,
        name: &str,
        layer: &crate::layer::RateLimitLayer<L, F, K, C, P>,
    ) -> Self {
        self.responses(name, layer.response_counts())
    }

    /// Exposes a [`ConcurrencyLimitLayer`](crate::layer::ConcurrencyLimitLayer)'s
    /// responses by status under `limiter="name"`, as [`layer`](Self::layer)
    /// does a rate layer's (its `413` is always 0).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::prometheus::Metrics;
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(2)), bearer_token);
    /// let metrics = Metrics::new().concurrency_layer("streams", &layer);
    /// assert!(metrics.render().contains(r#"keyrate_http_responses_total{limiter="streams",status="429"} 0"#));
    /// ```
    #[cfg(feature = "tower")]
    #[must_use]
    pub fn concurrency_layer<F, K, P, S>(
        self,
        name: &str,
        layer: &crate::layer::ConcurrencyLimitLayer<F, K, P, S>,
    ) -> Self {
        self.responses(name, layer.response_counts())
    }

    /// Exposes a [`DeclaredLengthLayer`](crate::layer::DeclaredLengthLayer)'s
    /// responses by status under `limiter="name"`: its refusals (`411`,
    /// `400`) and the requests it passed on (`200`). Give it a name of its
    /// own: under a rate layer's name, the requests both passed on would
    /// be counted twice.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::DeclaredLengthLayer;
    /// use keyrate::prometheus::Metrics;
    ///
    /// let layer = DeclaredLengthLayer::new();
    /// let metrics = Metrics::new().length_layer("uploads", &layer);
    /// assert!(metrics.render().contains(r#"keyrate_http_responses_total{limiter="uploads",status="411"} 0"#));
    /// ```
    #[cfg(feature = "tower")]
    #[must_use]
    pub fn length_layer(self, name: &str, layer: &crate::layer::DeclaredLengthLayer) -> Self {
        self.responses(name, layer.response_counts())
    }

    /// Exposes a layer's response counts under `limiter="name"`.
    #[cfg(feature = "tower")]
    fn responses(mut self, name: &str, counts: crate::observe::ResponseCounts) -> Self {
        let read = move || {
            let r = counts.read();
            [
                ("200", r.admitted),
                ("400", r.bad_request),
                ("401", r.unauthorized),
                ("411", r.length_required),
                ("413", r.payload_too_large),
                ("429", r.too_many_requests),
                ("431", r.key_too_large),
                ("503", r.unavailable),
            ]
        };
        self.layers.push((name.to_owned(), Box::new(read)));
        self
    }

    /// The current values, in the Prometheus text format.
    #[must_use]
    pub fn render(&self) -> String {
        match self.encode() {
            Ok(text) => text,
            // Only a bug in the metric definitions below can fail.
            Err(err) => format!("# keyrate: cannot encode metrics: {err}\n"),
        }
    }

    fn encode(&self) -> Result<String, ::prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register_counter(&registry, name, help, labels)
        };
        let gauge =
            |name: &str, help: &str, labels: &[&str]| register_gauge(&registry, name, help, labels);
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
        if !self.layers.is_empty() {
            let responses = counter(
                "keyrate_http_responses_total",
                "Responses of the layers, by status (200: passed on).",
                &["limiter", "status"],
            )?;
            for (name, read) in &self.layers {
                for (status, n) in read() {
                    responses
                        .with_label_values(&[name.as_str(), status])
                        .inc_by(n);
                }
            }
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

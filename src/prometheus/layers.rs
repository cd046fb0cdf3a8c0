//! The layers' series: each layer's responses by status
//! (`keyrate_http_responses_total`), read through the closure it was
//! added with.

use super::{register_counter, Metrics};
use ::prometheus::Registry;

/// A reader of a layer's responses.
pub(super) type ResponsesFn = Box<dyn Fn() -> [(&'static str, u64); 8] + Send + Sync>;

impl Metrics {
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
    pub(super) fn responses(mut self, name: &str, counts: crate::observe::ResponseCounts) -> Self {
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
}

impl Metrics {
    /// Registers the layers' series in `registry`, with their values.
    pub(super) fn encode_layers(&self, registry: &Registry) -> Result<(), ::prometheus::Error> {
        let responses = register_counter(
            registry,
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
        Ok(())
    }
}

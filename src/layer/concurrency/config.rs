//! Making a [`ConcurrencyLimitLayer`], and configuring it before it is
//! cloned or used: a limit per request, a wait for a permit, the bound on
//! key headers.

use super::{default_max, ConcurrencyLimitLayer, DefaultMax, Shared};
use crate::layer::keys::DEFAULT_MAX_KEY_LEN;
use crate::layer::unshared;
use crate::observe::ResponseCounts;
use http::request::Parts;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

impl<F, K, L> ConcurrencyLimitLayer<F, K, DefaultMax, L> {
    /// A layer that keys each request with `key` (`None` refuses it with
    /// 401) and holds one of its permits under the limiter's default
    /// limit, refusing at once a key at its limit.
    ///
    /// Ready-made key functions: [`bearer_token`](crate::layer::bearer_token) and
    /// [`api_key_header`](crate::layer::api_key_header).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{api_key_header, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(4));
    /// let _layer = ConcurrencyLimitLayer::new(streams, api_key_header);
    /// ```
    #[must_use]
    pub fn new(limiter: Arc<L>, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<K>,
    {
        ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                keys: PhantomData,
                key,
                max: default_max,
                max_wait: Duration::ZERO,
                responses: ResponseCounts::new(),
                max_key_len: DEFAULT_MAX_KEY_LEN,
            }),
        }
    }
}

/// # Configuration (before the layer is cloned or used)
impl<F, K, P, L> ConcurrencyLimitLayer<F, K, P, L> {
    /// Rebuilds the shared part with one part replaced.
    fn rebuild<P2>(
        self,
        change: impl FnOnce(Shared<F, K, P, L>) -> Shared<F, K, P2, L>,
    ) -> ConcurrencyLimitLayer<F, K, P2, L> {
        ConcurrencyLimitLayer {
            shared: Arc::new(change(unshared(self.shared, "ConcurrencyLimitLayer"))),
        }
    }

    /// Holds each request under the limit `max(parts)`, a plan's chosen
    /// per request, or the limiter's default where it returns `None`. A
    /// limit of 0 refuses every request of the plan (429).
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// /// The plan your authentication found for the key, in the request's
    /// /// extensions (never the key's shape: a client chooses its key).
    /// #[derive(Clone, Copy)]
    /// struct Pro;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(2)); // free plan
    /// let _layer = ConcurrencyLimitLayer::new(streams, bearer_token).with_max(|parts: &http::request::Parts| {
    ///     parts.extensions.get::<Pro>().map(|_| 20)
    /// });
    /// ```
    #[must_use]
    pub fn with_max<P2>(self, max: P2) -> ConcurrencyLimitLayer<F, K, P2, L>
    where
        P2: Fn(&Parts) -> Option<u32>,
    {
        self.rebuild(|s| Shared {
            limiter: s.limiter,
            keys: PhantomData,
            key: s.key,
            max,
            max_wait: s.max_wait,
            responses: s.responses,
            max_key_len: s.max_key_len,
        })
    }

    /// Lets a request of a key at its limit wait up to `max_wait` for a
    /// permit (first come, first served: [`ConcurrencyLimiter::acquire`](crate::ConcurrencyLimiter::acquire))
    /// before it is refused (feature `tokio`). By default, and with
    /// `Duration::ZERO`, it is refused at once. Over Redis the wait polls
    /// ([`RedisConcurrencyLimiter::acquire_under`](crate::RedisConcurrencyLimiter::acquire_under)),
    /// first come first served only among this process's requests.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(2));
    /// let _layer = ConcurrencyLimitLayer::new(streams, bearer_token)
    ///     .with_max_wait(Duration::from_millis(200));
    /// ```
    #[cfg(feature = "tokio")]
    #[must_use]
    pub fn with_max_wait(self, max_wait: Duration) -> Self {
        self.rebuild(|s| Shared { max_wait, ..s })
    }

    /// Refuses requests whose key header holds more than `max_key_len`
    /// bytes of key (by default [`DEFAULT_MAX_KEY_LEN`](crate::layer::DEFAULT_MAX_KEY_LEN), 256) with `431
    /// Request Header Fields Too Large`, before the key function runs: as
    /// [`RateLimitLayer::with_max_key_len`](crate::layer::RateLimitLayer::with_max_key_len).
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer};
    /// use keyrate::ConcurrencyLimiter;
    /// use std::sync::Arc;
    ///
    /// let streams = Arc::new(ConcurrencyLimiter::new(2));
    /// let _layer = ConcurrencyLimitLayer::new(streams, bearer_token).with_max_key_len(64);
    /// ```
    #[must_use]
    pub fn with_max_key_len(self, max_key_len: usize) -> Self {
        self.rebuild(|s| Shared { max_key_len, ..s })
    }
}

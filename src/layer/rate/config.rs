//! Making a [`RateLimitLayer`], and configuring it before it is cloned or
//! used: its cost and quota functions, its policy's name, its bound on key
//! headers.

use super::{default_quota, RateLimitLayer, Shared};
use crate::gcra::Quota;
use crate::layer::headers::Fields;
use crate::layer::keys::DEFAULT_MAX_KEY_LEN;
use crate::layer::{unit_cost, unshared};
use crate::observe::ResponseCounts;
use http::request::Parts;
use std::marker::PhantomData;
use std::sync::Arc;

impl<L, F, K> RateLimitLayer<L, F, K> {
    /// A layer that keys each request with `key` (`None` refuses it with
    /// 401) and charges it one token. The policy is named `"default"` in
    /// the rate-limit headers.
    ///
    /// Ready-made key functions: [`bearer_token`](crate::layer::bearer_token) and
    /// [`api_key_header`](crate::layer::api_key_header).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{api_key_header, bearer_token, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(TokenBucketLimiter::new(10.0, 20));
    /// let _layer = RateLimitLayer::new(limiter, |parts: &http::request::Parts| {
    ///     bearer_token(parts).or_else(|| api_key_header(parts))
    /// });
    /// ```
    #[must_use]
    pub fn new(limiter: Arc<L>, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<K>,
    {
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                key,
                cost: unit_cost,
                quota: default_quota,
                fields: Fields::new("default"),
                responses: ResponseCounts::new(),
                max_key_len: DEFAULT_MAX_KEY_LEN,
            }),
            key: PhantomData,
        }
    }
}

impl<L, F, K, C, P> RateLimitLayer<L, F, K, C, P> {
    /// Rebuilds the shared part with one function replaced; the layer must
    /// not have made services yet (it is being configured).
    fn rebuild<C2, P2>(
        self,
        change: impl FnOnce(Shared<L, F, C, P>) -> Shared<L, F, C2, P2>,
    ) -> RateLimitLayer<L, F, K, C2, P2> {
        RateLimitLayer {
            shared: Arc::new(change(unshared(self.shared, "RateLimitLayer"))),
            key: PhantomData,
        }
    }

    /// Charges each request `cost(parts)` tokens instead of one.
    ///
    /// A cost of 0 is admitted without spending; a cost above the capacity
    /// is refused with 413.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, declared_length, DeclaredBody, DeclaredLengthLayer, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    /// use tower::{service_fn, ServiceBuilder};
    ///
    /// // One token per started kilobyte of declared body; the declared
    /// // length is the truth behind a DeclaredLengthLayer (411 without one).
    /// let limiter = Arc::new(TokenBucketLimiter::new(100.0, 1000));
    /// let layer = RateLimitLayer::new(limiter, bearer_token).with_cost(|parts: &http::request::Parts| {
    ///     declared_length(parts).div_ceil(1024).max(1)
    /// });
    /// let _uploads = ServiceBuilder::new()
    ///     .layer(DeclaredLengthLayer::new()) // outermost: refused before charged
    ///     .layer(layer)
    ///     .service(service_fn(|_request: http::Request<DeclaredBody<String>>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     }));
    /// ```
    ///
    /// A cost by body length must not trust a header the client may leave
    /// out: see [`DeclaredLengthLayer`](crate::layer::DeclaredLengthLayer) (a chunked upload declares none).
    #[must_use]
    pub fn with_cost<C2>(self, cost: C2) -> RateLimitLayer<L, F, K, C2, P>
    where
        C2: Fn(&Parts) -> u64,
    {
        self.rebuild(|s| Shared {
            limiter: s.limiter,
            key: s.key,
            cost,
            quota: s.quota,
            fields: s.fields,
            responses: s.responses,
            max_key_len: s.max_key_len,
        })
    }

    /// Applies `quota(parts)` to each request, a plan chosen per request
    /// (say, from an extension that an authentication layer set), or the
    /// limiter's default quota where it returns `None`. The rate-limit
    /// headers describe the quota applied.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::{Quota, TokenBucketLimiter};
    /// use std::sync::Arc;
    ///
    /// /// The plan your authentication (in front of this layer) found for
    /// /// the key in your key table, in the request's extensions. Never
    /// /// the key's shape: a client chooses its key's prefix.
    /// #[derive(Clone, Copy)]
    /// enum Plan { Free, Pro }
    ///
    /// let pro = Quota::new(20.0, 100).unwrap();
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5)); // free plan
    /// let _layer = RateLimitLayer::new(limiter, bearer_token).with_quota(move |parts: &http::request::Parts| {
    ///     matches!(parts.extensions.get::<Plan>()?, Plan::Pro).then_some(pro)
    /// });
    /// ```
    #[must_use]
    pub fn with_quota<P2>(self, quota: P2) -> RateLimitLayer<L, F, K, C, P2>
    where
        P2: Fn(&Parts) -> Option<Quota>,
    {
        self.rebuild(|s| Shared {
            limiter: s.limiter,
            key: s.key,
            cost: s.cost,
            quota,
            fields: s.fields,
            responses: s.responses,
            max_key_len: s.max_key_len,
        })
    }

    /// Names the policy in the `RateLimit-Policy` and `RateLimit` headers
    /// (by default `"default"`).
    ///
    /// # Panics
    ///
    /// Panics if `name` is empty or holds a character outside printable
    /// ASCII (`' '..='~'`), which a structured-field string cannot carry,
    /// or if the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5));
    /// let _layer = RateLimitLayer::new(limiter, bearer_token).with_policy_name("connections");
    /// ```
    #[must_use]
    pub fn with_policy_name(self, name: &str) -> Self {
        assert!(
            !name.is_empty() && name.bytes().all(|b| (b' '..=b'~').contains(&b)),
            "invalid policy name {name:?}: expected 1 or more printable ASCII characters"
        );
        self.rebuild(|s| Shared {
            fields: Fields::new(name),
            ..s
        })
    }

    /// Refuses requests whose key header holds more than `max_key_len`
    /// bytes of key (by default [`DEFAULT_MAX_KEY_LEN`](crate::layer::DEFAULT_MAX_KEY_LEN), 256) with `431
    /// Request Header Fields Too Large`, before the key function runs: the
    /// token of `Authorization` (what follows its scheme, whatever the
    /// scheme) and the value of `X-API-Key`, the headers that
    /// [`bearer_token`](crate::layer::bearer_token) and
    /// [`api_key_header`](crate::layer::api_key_header) read. A key is copied into
    /// the limiter's map, a thread's hot-key cache, the offenders' sketch
    /// and the request's extensions, so its size bounds their memory. A
    /// key function of your own that reads other headers bounds them
    /// itself.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5));
    /// let layer = RateLimitLayer::new(limiter, bearer_token).with_max_key_len(64);
    /// let service = layer.layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// let bearer = |key: String| {
    ///     http::Request::get("/").header("authorization", format!("Bearer {key}")).body(()).unwrap()
    /// };
    /// let fits = service.clone().oneshot(bearer("k".repeat(64))).await.unwrap();
    /// assert_eq!(fits.status(), 200);
    /// let too_long = service.clone().oneshot(bearer("k".repeat(65))).await.unwrap();
    /// assert_eq!(too_long.status(), 431);
    /// assert_eq!(layer.responses().key_too_large, 1);
    /// # });
    /// ```
    #[must_use]
    pub fn with_max_key_len(self, max_key_len: usize) -> Self {
        self.rebuild(|s| Shared { max_key_len, ..s })
    }
}

//! A [`tower::Layer`] that rate-limits HTTP requests by key (feature `tower`).
//!
//! The layer asks a user-supplied function for each request's key (an API
//! key, a tenant id), and optionally another for its cost, then spends from
//! that key's bucket at the limiter's clock reading:
//!
//! | outcome | response |
//! |---|---|
//! | no key | `401 Unauthorized` with `WWW-Authenticate: Bearer`; nothing spent |
//! | admitted | the inner service's response, plus `RateLimit-Policy` and `RateLimit` (the tokens left) |
//! | over the limit | `429 Too Many Requests` with `Retry-After`, `RateLimit-Policy` and `RateLimit` |
//! | cost above the capacity | `413 Content Too Large`, no `Retry-After`: no wait can help |
//! | any other denial (the limiter full, its clock out of range) | `503 Service Unavailable` |
//!
//! The rate-limit fields follow the structured-field form of
//! draft-ietf-httpapi-ratelimit-headers (revisions 09 to 11):
//!
//! ```text
//! RateLimit-Policy: "default";q=20;w=10
//! RateLimit: "default";r=7;t=7
//! ```
//!
//! `q` is the bucket's capacity (its largest burst), `w` the seconds an empty
//! bucket takes to refill (rounded up), `r` the whole tokens left after this
//! request, and `t` the seconds until the bucket is full again (an upper
//! bound, rounded up; on a 429, the seconds until this request would be
//! admitted). `Retry-After` is whole seconds, rounded up, so a client that
//! honours it is admitted when it retries (if nothing else spent meanwhile).

use crate::error::Denial;
use crate::gcra::{self, Quota};
use crate::keyed::{DefaultHasher, TokenBucketLimiter};
use crate::observe::{ResponseCounts, Responses, Status};
use http::header::{HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service};

/// The `RateLimit-Policy` header name (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` header name (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The `X-API-Key` header name read by [`api_key_header`].
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The default cost function's type: every request costs one token.
pub type UnitCost = fn(&Parts) -> u64;

fn unit_cost(_: &Parts) -> u64 {
    1
}

/// The default quota function's type: every request gets the limiter's
/// default quota.
pub type DefaultQuota = fn(&Parts) -> Option<Quota>;

fn default_quota(_: &Parts) -> Option<Quota> {
    None
}

/// What the layer hands the inner service in the request's extensions
/// when it admits a request: the key it extracted and the quota it
/// applied, so a handler need not parse the key again to find its
/// customer.
///
/// # Examples
///
/// ```
/// use keyrate::layer::Limited;
///
/// fn handler(request: http::Request<()>) -> String {
///     match request.extensions().get::<Limited<String>>() {
///         Some(limited) => format!("hello {}, burst {}", limited.key, limited.quota.capacity()),
///         None => String::from("not rate-limited"),
///     }
/// }
/// # assert_eq!(handler(http::Request::new(())), "not rate-limited");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Limited<K = String> {
    /// The key the layer's key function extracted.
    pub key: K,
    /// The quota the request was admitted under.
    pub quota: Quota,
}

/// Reads the key from `Authorization: Bearer <token>`.
///
/// The scheme is matched case-insensitively; surrounding spaces are ignored.
/// Returns `None` when the header is missing, not visible ASCII, uses
/// another scheme, or carries an empty token.
///
/// # Examples
///
/// ```
/// use keyrate::layer::bearer_token;
///
/// let (parts, ()) = http::Request::get("/")
///     .header("authorization", "Bearer sk_live_123")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(bearer_token(&parts).as_deref(), Some("sk_live_123"));
/// ```
#[must_use]
pub fn bearer_token(parts: &Parts) -> Option<String> {
    let value = parts
        .headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let value = value.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    non_empty(token.trim())
}

/// Reads the key from the `X-API-Key` header.
///
/// Returns `None` when the header is missing, not visible ASCII, or blank.
///
/// # Examples
///
/// ```
/// use keyrate::layer::api_key_header;
///
/// let (parts, ()) = http::Request::get("/")
///     .header("x-api-key", "sk_live_123")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(api_key_header(&parts).as_deref(), Some("sk_live_123"));
/// ```
#[must_use]
pub fn api_key_header(parts: &Parts) -> Option<String> {
    non_empty(parts.headers.get(X_API_KEY)?.to_str().ok()?.trim())
}

fn non_empty(token: &str) -> Option<String> {
    (!token.is_empty()).then(|| token.to_owned())
}

/// Rate-limits the requests to the service it wraps, per key.
///
/// Build it once with a shared limiter; every service it makes, and every
/// clone of those, spends from that same limiter (one [`Arc`], never a copy).
///
/// # Examples
///
/// ```
/// use keyrate::layer::{bearer_token, RateLimitLayer};
/// use keyrate::TokenBucketLimiter;
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2));
/// let layer = RateLimitLayer::new(limiter, bearer_token);
/// let mut service = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
/// }));
/// let request = || {
///     http::Request::get("/").header("authorization", "Bearer k").body(()).unwrap()
/// };
///
/// let ok = service.ready().await.unwrap().call(request()).await.unwrap();
/// assert_eq!(ok.status(), 200);
/// assert_eq!(ok.headers()["ratelimit"], "\"default\";r=1;t=1");
/// assert_eq!(ok.headers()["ratelimit-policy"], "\"default\";q=2;w=2");
///
/// let _ = service.ready().await.unwrap().call(request()).await.unwrap();
/// let limited = service.ready().await.unwrap().call(request()).await.unwrap();
/// assert_eq!(limited.status(), 429);
/// assert_eq!(limited.headers()["retry-after"], "1");
///
/// let anonymous = http::Request::get("/").body(()).unwrap();
/// let refused = service.ready().await.unwrap().call(anonymous).await.unwrap();
/// assert_eq!(refused.status(), 401);
/// # });
/// ```
pub struct RateLimitLayer<F, C = UnitCost, K = String, S = DefaultHasher, P = DefaultQuota> {
    limiter: Arc<TokenBucketLimiter<K, S>>,
    key: F,
    cost: C,
    quota: P,
    policy_name: Arc<str>,
    /// Shared by every service made, for [`responses`](Self::responses).
    responses: ResponseCounts,
}

impl<F, K, S> RateLimitLayer<F, UnitCost, K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// A layer that keys each request with `key` (`None` refuses it with
    /// 401) and charges it one token. The policy is named `"default"` in
    /// the rate-limit headers.
    ///
    /// Ready-made key functions: [`bearer_token`] and [`api_key_header`].
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
    pub fn new(limiter: Arc<TokenBucketLimiter<K, S>>, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<K>,
    {
        RateLimitLayer {
            limiter,
            key,
            cost: unit_cost,
            quota: default_quota,
            policy_name: Arc::from("default"),
            responses: ResponseCounts::new(),
        }
    }
}

impl<F, C, K, S, P> RateLimitLayer<F, C, K, S, P> {
    /// Charges each request `cost(parts)` tokens instead of one.
    ///
    /// A cost of 0 is admitted without spending; a cost above the capacity
    /// is refused with 413.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::TokenBucketLimiter;
    /// use std::sync::Arc;
    ///
    /// // One token per started kilobyte of declared body.
    /// let limiter = Arc::new(TokenBucketLimiter::new(100.0, 1000));
    /// let _layer = RateLimitLayer::new(limiter, bearer_token).with_cost(|parts: &http::request::Parts| {
    ///     let len: u64 = parts.headers.get("content-length")
    ///         .and_then(|v| v.to_str().ok()?.parse().ok())
    ///         .unwrap_or(0);
    ///     len.div_ceil(1024).max(1)
    /// });
    /// ```
    #[must_use]
    pub fn with_cost<C2>(self, cost: C2) -> RateLimitLayer<F, C2, K, S, P>
    where
        C2: Fn(&Parts) -> u64,
    {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            cost,
            quota: self.quota,
            policy_name: self.policy_name,
            responses: self.responses,
        }
    }

    /// Applies `quota(parts)` to each request, a plan chosen per request
    /// (say, from an extension that an authentication layer set), or the
    /// limiter's default quota where it returns `None`. The rate-limit
    /// headers describe the quota applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, RateLimitLayer};
    /// use keyrate::{Quota, TokenBucketLimiter};
    /// use std::sync::Arc;
    ///
    /// let pro = Quota::new(20.0, 100).unwrap();
    /// let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5)); // free plan
    /// let _layer = RateLimitLayer::new(limiter, bearer_token).with_quota(move |parts: &http::request::Parts| {
    ///     let key = bearer_token(parts)?;
    ///     key.starts_with("sk_pro_").then_some(pro)
    /// });
    /// ```
    #[must_use]
    pub fn with_quota<P2>(self, quota: P2) -> RateLimitLayer<F, C, K, S, P2>
    where
        P2: Fn(&Parts) -> Option<Quota>,
    {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            cost: self.cost,
            quota,
            policy_name: self.policy_name,
            responses: self.responses,
        }
    }

    /// Names the policy in the `RateLimit-Policy` and `RateLimit` headers
    /// (by default `"default"`).
    ///
    /// # Panics
    ///
    /// Panics if `name` is empty or holds a character outside printable
    /// ASCII (`' '..='~'`), which a structured-field string cannot carry.
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
    pub fn with_policy_name(mut self, name: &str) -> Self {
        assert!(
            !name.is_empty() && name.bytes().all(|b| (b' '..=b'~').contains(&b)),
            "invalid policy name {name:?}: expected 1 or more printable ASCII characters"
        );
        self.policy_name = Arc::from(name);
        self
    }

    /// The limiter the layer spends from.
    #[must_use]
    pub fn limiter(&self) -> &Arc<TokenBucketLimiter<K, S>> {
        &self.limiter
    }

    /// The responses of every service this layer made, counted by status
    /// (see [`Responses`] for an example).
    #[must_use]
    pub fn responses(&self) -> Responses {
        self.responses.read()
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn response_counts(&self) -> ResponseCounts {
        self.responses.clone()
    }
}

impl<F: Clone, C: Clone, K, S, P: Clone> Clone for RateLimitLayer<F, C, K, S, P> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: Arc::clone(&self.limiter),
            key: self.key.clone(),
            cost: self.cost.clone(),
            quota: self.quota.clone(),
            policy_name: Arc::clone(&self.policy_name),
            responses: self.responses.clone(),
        }
    }
}

impl<F, C, K, S, P> fmt::Debug for RateLimitLayer<F, C, K, S, P>
where
    K: Hash + Eq,
    S: BuildHasher + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("policy_name", &self.policy_name)
            .finish_non_exhaustive()
    }
}

impl<Svc, F, C, K, S, P> Layer<Svc> for RateLimitLayer<F, C, K, S, P>
where
    F: Clone,
    C: Clone,
    P: Clone,
    K: Hash + Eq + 'static,
    S: BuildHasher + Clone,
{
    type Service = RateLimitService<Svc, F, C, K, S, P>;

    fn layer(&self, inner: Svc) -> Self::Service {
        RateLimitService {
            inner,
            shared: Arc::new(Shared {
                limiter: Arc::clone(&self.limiter),
                key: self.key.clone(),
                cost: self.cost.clone(),
                quota: self.quota.clone(),
                policy_item: sf_string(&self.policy_name),
                responses: self.responses.clone(),
            }),
        }
    }
}

/// What every clone of a [`RateLimitService`] shares.
struct Shared<F, C, K, S, P> {
    limiter: Arc<TokenBucketLimiter<K, S>>,
    key: F,
    cost: C,
    quota: P,
    /// The policy's name as a structured-field string, quotes included
    /// (printable ASCII only, checked by `with_policy_name`).
    policy_item: String,
    responses: ResponseCounts,
}

impl<F, C, K, S, P> Shared<F, C, K, S, P> {
    /// The `RateLimit-Policy` value for a request under `quota`.
    fn policy(&self, quota: &Quota) -> HeaderValue {
        header_value(format!(
            "{};q={};w={}",
            self.policy_item,
            quota.capacity(),
            ceil_secs(quota.refill_time())
        ))
    }
}

/// The service made by [`RateLimitLayer`]: spends from the request's key's
/// bucket, then calls the inner service or answers 401 / 429 itself.
///
/// Cloning it clones the inner service and one [`Arc`]; the limiter and the
/// key and cost functions are shared, never copied.
pub struct RateLimitService<Svc, F, C = UnitCost, K = String, S = DefaultHasher, P = DefaultQuota> {
    inner: Svc,
    shared: Arc<Shared<F, C, K, S, P>>,
}

impl<Svc: Clone, F, C, K, S, P> Clone for RateLimitService<Svc, F, C, K, S, P> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Svc: fmt::Debug, F, C, K, S, P> fmt::Debug for RateLimitService<Svc, F, C, K, S, P>
where
    K: Hash + Eq,
    S: BuildHasher + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .field("policy", &self.shared.policy_item)
            .finish_non_exhaustive()
    }
}

impl<Svc, F, C, K, S, P, ReqBody, ResBody> Service<Request<ReqBody>>
    for RateLimitService<Svc, F, C, K, S, P>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
    F: Fn(&Parts) -> Option<K>,
    C: Fn(&Parts) -> u64,
    P: Fn(&Parts) -> Option<Quota>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Svc::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let (parts, body) = request.into_parts();
        let Some(key) = (shared.key)(&parts) else {
            shared.responses.count(Status::Unauthorized);
            let mut response = Response::new(ResBody::default());
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return ResponseFuture::refused(response);
        };
        let cost = (shared.cost)(&parts);
        let quota = (shared.quota)(&parts).unwrap_or_else(|| shared.limiter.quota());
        match shared.limiter.under(&quota).check_now(&key, cost) {
            Ok(remaining) => {
                shared.responses.count(Status::Admitted);
                // At most `capacity - remaining` tokens are missing: their
                // refill, exact as the limiter counts it, in whole seconds.
                let missing = quota.capacity().saturating_sub(remaining);
                let until_full = ceil_secs(
                    gcra::spend_for(missing, &quota)
                        .map_or(quota.refill_time(), Duration::from_nanos),
                );
                let state = format!("{};r={remaining};t={until_full}", shared.policy_item);
                let headers = [
                    (RATELIMIT_POLICY, shared.policy(&quota)),
                    (RATELIMIT, header_value(state)),
                ];
                let mut parts = parts;
                parts.extensions.insert(Limited { key, quota });
                let inner = self.inner.call(Request::from_parts(parts, body));
                ResponseFuture::admitted(inner, headers)
            }
            Err(denial) => ResponseFuture::refused(refusal(shared, &quota, denial)),
        }
    }
}

/// The response to a request the limiter refused.
fn refusal<F, C, K, S, P, B: Default>(
    shared: &Shared<F, C, K, S, P>,
    quota: &Quota,
    denial: Denial,
) -> Response<B> {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    let (status, counted) = match denial {
        Denial::InsufficientTokens { retry_after } => {
            let secs = ceil_secs(retry_after);
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            let state = format!("{};r=0;t={secs}", shared.policy_item);
            headers.insert(RATELIMIT, header_value(state));
            (StatusCode::TOO_MANY_REQUESTS, Status::TooManyRequests)
        }
        Denial::ExceedsCapacity { .. } => (StatusCode::PAYLOAD_TOO_LARGE, Status::PayloadTooLarge),
        // The limiter is full, or its clock reads beyond 292 years: the
        // server's condition, not the client's doing.
        _ => (StatusCode::SERVICE_UNAVAILABLE, Status::Unavailable),
    };
    shared.responses.count(counted);
    headers.insert(RATELIMIT_POLICY, shared.policy(quota));
    *response.status_mut() = status;
    response
}

/// Whole seconds, rounded up.
fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// `name` as a structured-field string: quoted, `"` and `\` escaped.
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn header_value(text: String) -> HeaderValue {
    // Built from printable ASCII and digits only.
    HeaderValue::try_from(text).expect("printable ASCII")
}

pin_project! {
    /// The future returned by [`RateLimitService`]: the inner service's
    /// response with the rate-limit headers added, or the refusal.
    pub struct ResponseFuture<Fut, B> {
        #[pin]
        state: State<Fut, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, B> {
        Admitted {
            #[pin]
            inner: Fut,
            headers: Option<[(HeaderName, HeaderValue); 2]>,
        },
        Refused {
            response: Option<Response<B>>,
        },
    }
}

impl<Fut, B> ResponseFuture<Fut, B> {
    fn admitted(inner: Fut, headers: [(HeaderName, HeaderValue); 2]) -> Self {
        ResponseFuture {
            state: State::Admitted {
                inner,
                headers: Some(headers),
            },
        }
    }

    fn refused(response: Response<B>) -> Self {
        ResponseFuture {
            state: State::Refused {
                response: Some(response),
            },
        }
    }
}

impl<Fut, B, E> Future for ResponseFuture<Fut, B>
where
    Fut: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { inner, headers } => {
                let mut response = std::task::ready!(inner.poll(cx))?;
                for (name, value) in headers.take().into_iter().flatten() {
                    response.headers_mut().insert(name, value);
                }
                Poll::Ready(Ok(response))
            }
            StateProj::Refused { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
        }
    }
}

impl<Fut, B> fmt::Debug for ResponseFuture<Fut, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Admitted { .. } => "admitted",
            State::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_seconds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn quotes_policy_names() {
        assert_eq!(sf_string("tts"), "\"tts\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}

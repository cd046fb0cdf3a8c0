//! The compound rate layer: each request charges every quota of each of
//! its scopes (its key under its plan, its organization, a global key),
//! all or nothing, over any [`AsyncCompound`] limiter: the in-memory
//! [`CompoundLimiter`](crate::CompoundLimiter) or a `RedisLimiter`.
//!
//! The headers describe every quota of the request's scopes, one list item
//! each, named `"<scope>.<quota index>"`, and `RateLimit` reports the one
//! that binds (draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy` is
//! a list):
//!
//! ```text
//! RateLimit-Policy: "key.0";q=40;w=2, "key.1";q=50000;w=86400, "org.0";q=100;w=1
//! RateLimit: "key.0";r=12;t=2
//! ```
//!
//! On an admission `RateLimit` names the bucket holding the least, `r` its
//! whole tokens and `t` the seconds until it is full again; on a 429 it names the bucket whose wait binds, with `r=0`
//! and `t` that wait, as `Retry-After`. A cost above some quota's capacity
//! is 413; a limiter at its cap of keys 503 with `Retry-After: 1`; a
//! request whose scopes are malformed (none, a key twice, keys in several
//! Redis Cluster slots: the server's doing) or whose backend failed closed,
//! 503.

use super::headers::{ceil_secs, header_value, limiter_full, sf_string};
use super::keys::{self, DEFAULT_MAX_KEY_LEN};
use super::{take_ready, unit_cost, unshared, ResponseFuture, UnitCost};
use crate::compound::{AsyncCompound, CompoundDecision, CompoundDenial, CompoundRefusal, Policy};
use crate::observe::{ResponseCounts, Responses, Status};
use crate::time::Now;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

use super::headers::{RATELIMIT, RATELIMIT_POLICY};

/// One scope of a request: a name for the headers (`"key"`, `"org"`), the
/// key charged, and its policy.
///
/// # Examples
///
/// ```
/// use keyrate::layer::Scope;
/// use keyrate::{Policy, Quota};
/// use std::sync::Arc;
///
/// let org = Arc::new(Policy::from(Quota::new(100.0, 60).unwrap()));
/// let scope = Scope::new("org", "org_7", org);
/// assert_eq!(scope.key(), "org_7");
/// assert!(!format!("{scope:?}").contains("org_7"));
/// ```
#[derive(Clone)]
pub struct Scope {
    /// The name's structured-field string, quoted and escaped; characters
    /// outside printable ASCII become `?`.
    item: String,
    key: String,
    policy: Arc<Policy>,
}

impl Scope {
    /// A scope named `name` in the headers, charging `key` under `policy`.
    #[must_use]
    pub fn new(name: &str, key: impl Into<String>, policy: Arc<Policy>) -> Self {
        let printable: String = name
            .chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
            .collect();
        Scope {
            item: sf_string(&printable),
            key: key.into(),
            policy,
        }
    }

    /// The key charged.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The policy it is charged under.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The list item name of quota `quota`: `"<name>.<quota>"`.
    fn item(&self, quota: usize) -> String {
        format!("{}.{quota}\"", &self.item[..self.item.len() - 1])
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is a secret: not shown.
        f.debug_struct("Scope")
            .field("name", &self.item)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Rate-limits the requests to the service it wraps by several scopes at
/// once, all or nothing, over any [`AsyncCompound`] limiter `L`.
///
/// `scopes(parts)` names the request's scopes (`None` refuses it with
/// 401, as [`RateLimitLayer`](crate::RateLimitLayer)'s key function); key
/// headers above the layer's bound are refused with 431 first.
///
/// # Examples
///
/// ```
/// use keyrate::layer::{bearer_token, CompoundLimitLayer, Scope};
/// use keyrate::{CompoundLimiter, Policy, Quota};
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let plan = Arc::new(Policy::new([Quota::new(1.0, 3)?, Quota::new(0.01, 5)?])?);
/// let org = Arc::new(Policy::from(Quota::new(1.0, 2)?));
/// let layer = CompoundLimitLayer::new(Arc::new(CompoundLimiter::new()), move |parts: &http::request::Parts| {
///     let key = bearer_token(parts)?;
///     Some(vec![Scope::new("key", key, plan.clone()), Scope::new("org", "org_7", org.clone())])
/// });
/// let service = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// }));
/// let request = || http::Request::get("/").header("authorization", "Bearer k").body(()).unwrap();
/// let ok = service.clone().oneshot(request()).await.unwrap();
/// assert_eq!(ok.headers()["ratelimit-policy"], "\"key.0\";q=3;w=3, \"key.1\";q=5;w=500, \"org.0\";q=2;w=2");
/// assert_eq!(ok.headers()["ratelimit"], "\"org.0\";r=1;t=1");
/// let _ = service.clone().oneshot(request()).await.unwrap();
/// let limited = service.clone().oneshot(request()).await.unwrap();
/// assert_eq!(limited.status(), 429);
/// assert_eq!(limited.headers()["ratelimit"], "\"org.0\";r=0;t=1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct CompoundLimitLayer<L, F, C = UnitCost> {
    shared: Arc<Shared<L, F, C>>,
}

struct Shared<L, F, C> {
    limiter: Arc<L>,
    scopes: F,
    cost: C,
    responses: ResponseCounts,
    max_key_len: usize,
}

impl<L, F> CompoundLimitLayer<L, F> {
    /// A layer that charges each request one token from every quota of
    /// every scope `scopes(parts)` names.
    #[must_use]
    pub fn new(limiter: Arc<L>, scopes: F) -> Self
    where
        F: Fn(&Parts) -> Option<Vec<Scope>>,
    {
        CompoundLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                scopes,
                cost: unit_cost,
                responses: ResponseCounts::new(),
                max_key_len: DEFAULT_MAX_KEY_LEN,
            }),
        }
    }
}

impl<L, F, C> CompoundLimitLayer<L, F, C> {
    /// Charges each request `cost(parts)` tokens instead of one.
    ///
    /// # Panics
    ///
    /// If the layer was cloned before (configure it first).
    #[must_use]
    pub fn with_cost<C2>(self, cost: C2) -> CompoundLimitLayer<L, F, C2>
    where
        C2: Fn(&Parts) -> u64,
    {
        let s = unshared(self.shared, "CompoundLimitLayer");
        CompoundLimitLayer {
            shared: Arc::new(Shared {
                limiter: s.limiter,
                scopes: s.scopes,
                cost,
                responses: s.responses,
                max_key_len: s.max_key_len,
            }),
        }
    }

    /// The limiter the layer charges.
    #[must_use]
    pub fn limiter(&self) -> &Arc<L> {
        &self.shared.limiter
    }

    /// The responses of every service this layer made, by status.
    #[must_use]
    pub fn responses(&self) -> Responses {
        self.shared.responses.read()
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn response_counts(&self) -> ResponseCounts {
        self.shared.responses.clone()
    }
}

impl<L, F, C> Clone for CompoundLimitLayer<L, F, C> {
    fn clone(&self) -> Self {
        CompoundLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L: fmt::Debug, F, C> fmt::Debug for CompoundLimitLayer<L, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompoundLimitLayer")
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<Svc, L, F, C> Layer<Svc> for CompoundLimitLayer<L, F, C> {
    type Service = CompoundLimitService<Svc, L, F, C>;

    fn layer(&self, inner: Svc) -> Self::Service {
        CompoundLimitService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service made by [`CompoundLimitLayer`].
pub struct CompoundLimitService<Svc, L, F, C = UnitCost> {
    inner: Svc,
    shared: Arc<Shared<L, F, C>>,
}

impl<Svc: Clone, L, F, C> Clone for CompoundLimitService<Svc, L, F, C> {
    fn clone(&self) -> Self {
        CompoundLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Svc: fmt::Debug, L: fmt::Debug, F, C> fmt::Debug for CompoundLimitService<Svc, L, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompoundLimitService")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<Svc, L, F, C, ReqBody, ResBody> Service<Request<ReqBody>>
    for CompoundLimitService<Svc, L, F, C>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Svc::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
    L: AsyncCompound<str> + Send + Sync + 'static,
    F: Fn(&Parts) -> Option<Vec<Scope>> + Send + Sync + 'static,
    C: Fn(&Parts) -> u64 + Send + Sync + 'static,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Response<ResBody>, Svc::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let scopes = match keys::extract(
                &parts,
                shared.max_key_len,
                &shared.scopes,
                &shared.responses,
            ) {
                Ok(scopes) => scopes,
                Err(refused) => return Ok(refused),
            };
            let cost = (shared.cost)(&parts);
            let calls: Vec<(&str, &Policy)> = scopes
                .iter()
                .map(|scope| (scope.key.as_str(), &*scope.policy))
                .collect();
            let decided = shared.limiter.check_scopes(&calls, Now, cost).await;
            match decided {
                Ok(decision) => {
                    shared.responses.count(Status::Admitted);
                    let headers = admitted(&scopes, &decision);
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    for (name, value) in headers {
                        response.headers_mut().insert(name, value);
                    }
                    Ok(response)
                }
                Err(refusal) => {
                    let (response, status) = refused(&scopes, &refusal);
                    shared.responses.count(status);
                    Ok(response)
                }
            }
        })
    }
}

/// `RateLimit-Policy`: every quota of every scope, one list item each.
fn policy_list(scopes: &[Scope]) -> HeaderValue {
    let items: Vec<String> = scopes
        .iter()
        .flat_map(|scope| {
            scope.policy.quotas().iter().enumerate().map(|(i, q)| {
                format!(
                    "{};q={};w={}",
                    scope.item(i),
                    q.capacity(),
                    ceil_secs(q.refill_time())
                )
            })
        })
        .collect();
    header_value(items.join(", "))
}

/// `RateLimit` for the bucket `(scope, quota)`.
fn state(scopes: &[Scope], (scope, quota): (usize, usize), r: u64, t: u64) -> HeaderValue {
    let item = scopes
        .get(scope)
        .map_or_else(|| String::from("\"?\""), |s| s.item(quota));
    header_value(format!("{item};r={r};t={t}"))
}

/// The headers of an admitted request.
fn admitted(scopes: &[Scope], decision: &CompoundDecision) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = vec![(RATELIMIT_POLICY, policy_list(scopes))];
    if !decision.is_degraded() {
        let binding = (decision.scope(), decision.quota());
        let t = ceil_secs(decision.quota_reset_after());
        headers.push((RATELIMIT, state(scopes, binding, decision.remaining(), t)));
    }
    headers
}

/// The response to a refused request, and the status it is counted under.
fn refused<B: Default>(scopes: &[Scope], refusal: &impl CompoundRefusal) -> (Response<B>, Status) {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    let (status, counted) = match refusal.denial() {
        Some(&CompoundDenial::InsufficientTokens {
            retry_after,
            scope,
            quota,
        }) => {
            let secs = ceil_secs(retry_after);
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            headers.insert(RATELIMIT, state(scopes, (scope, quota), 0, secs));
            (StatusCode::TOO_MANY_REQUESTS, Status::TooManyRequests)
        }
        Some(CompoundDenial::ExceedsCapacity { .. }) => {
            (StatusCode::PAYLOAD_TOO_LARGE, Status::PayloadTooLarge)
        }
        Some(CompoundDenial::LimiterFull { .. }) => limiter_full(headers),
        _ => (StatusCode::SERVICE_UNAVAILABLE, Status::Unavailable),
    };
    if !scopes.is_empty() {
        headers.insert(RATELIMIT_POLICY, policy_list(scopes));
    }
    *response.status_mut() = status;
    (response, counted)
}

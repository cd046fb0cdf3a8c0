//! A [`tower::Layer`] that rate-limits HTTP requests by key (feature
//! `tower`), over any [`AsyncLimiter`](crate::AsyncLimiter): the in-memory limiter, or
//! `RedisLimiter` for a fleet of servers sharing each key's budget.
//!
//! The layer asks a user-supplied function for each request's key (an API
//! key, a tenant id), and optionally others for its cost and its quota,
//! then spends from that key's bucket at the backend's clock ([`Now`](crate::Now)):
//!
//! | outcome | response |
//! |---|---|
//! | a key header above the bound (`Authorization`'s token or `X-API-Key`, 256 bytes by default: [`with_max_key_len`](RateLimitLayer::with_max_key_len)) | `431 Request Header Fields Too Large`; the key function is not called, nothing spent |
//! | no key | `401 Unauthorized` with `WWW-Authenticate: Bearer`; nothing spent |
//! | admitted | the inner service's response, plus `RateLimit-Policy` and `RateLimit` (the tokens left) |
//! | over the limit | `429 Too Many Requests` with `Retry-After`, `RateLimit-Policy` and `RateLimit` |
//! | cost above the capacity | `413 Content Too Large`, no `Retry-After`: no wait can help |
//! | the limiter at its bucket cap | `503 Service Unavailable` with `Retry-After: 1` ([`LIMITER_FULL_RETRY_AFTER`]) |
//! | any other refusal (its clock out of range, its backend down and failing closed) | `503 Service Unavailable` |
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
//! request, and `t` the seconds until the bucket is full again (rounded up;
//! on a 429, the seconds until this request would be admitted).
//! `Retry-After` is whole seconds, rounded up, so a client that honours it
//! is admitted when it retries (if nothing else spent meanwhile). An
//! admission that a fail-open backend could not measure carries no
//! `RateLimit` field.
//!
//! [`ConcurrencyLimitLayer`] limits, with the same key functions, how many
//! requests of a key are in flight at once, each holding a permit of a
//! [`ConcurrencyLimiter`](crate::ConcurrencyLimiter) until its response
//! body has been sent (see `docs/concurrency.md`).
//!
//! [`CompoundLimitLayer`] charges each request several scopes (its key
//! under a plan of several quotas, its organization, a global key) all or
//! nothing, over any [`AsyncCompound`](crate::AsyncCompound) limiter, with
//! every quota in `RateLimit-Policy` and the binding one in `RateLimit`.
//!
//! Files: `mod.rs` (what the layers share: the unit cost, the response
//! future, taking a configuration back), `rate.rs` (the rate layer;
//! `rate/config.rs` makes and configures it, `rate/service.rs` is its
//! tower plumbing), `headers.rs` (the HTTP policy: header fields and
//! refusals), `keys.rs` (key extraction), `compound.rs` (the compound
//! layer, its plumbing and its headers), `concurrency.rs` (the concurrency
//! layer, with `concurrency/config.rs` and `concurrency/service.rs` as the
//! rate layer's), `held.rs` (its permit in the request and in the response
//! body), `length.rs` (the declared-length rule, for costs by the byte;
//! `length/body.rs`, the body held to its declared length).
//!
//! A cost by body length reads the request's head, so it charges the
//! declared `Content-Length` ([`declared_length`]); a
//! [`DeclaredLengthLayer`] outside the rate layer makes that the truth:
//! `411` for a body that declares no length (a chunked upload), and a
//! body cut off with an error past its declared length.

mod compound;
mod concurrency;
mod headers;
mod held;
mod keys;
mod length;
mod rate;

pub use self::compound::{CompoundLimitLayer, CompoundLimitService, Scope};
pub use self::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimitService, DefaultMax};
pub use self::headers::{
    LIMITER_FULL_RETRY_AFTER, RATELIMIT, RATELIMIT_POLICY, X_CONCURRENCY_HELD, X_CONCURRENCY_LIMIT,
};
pub use self::held::{HeldPermit, PermitBody};
pub use self::keys::{api_key_header, bearer_token, Limited, DEFAULT_MAX_KEY_LEN, X_API_KEY};
pub use self::length::{
    declared_length, BodyTooLong, DeclaredBody, DeclaredLengthFuture, DeclaredLengthLayer,
    DeclaredLengthService,
};
pub use self::rate::{DefaultQuota, RateLimitLayer, RateLimitService};

use http::request::Parts;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The default cost function's type: every request costs one token.
pub type UnitCost = fn(&Parts) -> u64;

fn unit_cost(_: &Parts) -> u64 {
    1
}

/// The future of a [`RateLimitService`] call: the decision (awaited on
/// backends that await), then the inner service's response with the
/// rate-limit headers, or the refusal; and of a
/// [`ConcurrencyLimitService`] call.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// The inner service that was polled ready, to serve this request; a
/// clone takes its place for the next one (a service cloned into its
/// call's future must answer with the clone that `poll_ready` prepared).
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let ready = inner.clone();
    std::mem::replace(inner, ready)
}

/// A layer's configuration, taken back to be changed: it must not be
/// shared yet (a layer is configured before it is cloned or used).
fn unshared<T>(shared: Arc<T>, layer: &str) -> T {
    match Arc::try_unwrap(shared) {
        Ok(shared) => shared,
        Err(_) => panic!("a {layer} is configured before it is cloned"),
    }
}

//! Key extraction: the ready-made key functions, and what the layer hands
//! the inner service about the key it admitted.

use super::headers;
use crate::gcra::Quota;
use crate::observe::{ResponseCounts, Shown, Status};
use http::header::HeaderName;
use http::request::Parts;
use http::Response;
use std::fmt;
use std::hash::Hash;

/// The `X-API-Key` header name read by [`api_key_header`].
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

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
///         // `limited.key` finds the customer; a secret, it is not echoed.
///         Some(limited) => format!("hello, burst {}", limited.quota.capacity()),
///         None => String::from("not rate-limited"),
///     }
/// }
/// # assert_eq!(handler(http::Request::new(())), "not rate-limited");
/// ```
///
/// Its `Debug` shows the key as its fingerprint (see
/// [`KeyLabels`](crate::KeyLabels)), never the raw key.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct Limited<K = String> {
    /// The key the layer's key function extracted.
    pub key: K,
    /// The quota the request was admitted under.
    pub quota: Quota,
}

impl<K: Hash + fmt::Debug> fmt::Debug for Limited<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limited")
            .field("key", &Shown(&self.key))
            .field("quota", &self.quota)
            .finish()
    }
}

/// The longest key the layer accepts by default, in bytes (see
/// [`RateLimitLayer::with_max_key_len`](crate::RateLimitLayer::with_max_key_len)).
pub const DEFAULT_MAX_KEY_LEN: usize = 256;

/// Whether a key header holds more than `max` bytes of key: the token of
/// `Authorization` (what follows its scheme) or the value of `X-API-Key`,
/// the fields that [`bearer_token`] and [`api_key_header`] read, measured
/// without copying them.
fn oversized(parts: &Parts, max: usize) -> bool {
    let token = |value: &[u8]| {
        let value = value.trim_ascii();
        match value.iter().position(|&b| b == b' ') {
            Some(space) => value[space + 1..].trim_ascii().len(),
            None => value.len(),
        }
    };
    let authorization = parts.headers.get(http::header::AUTHORIZATION);
    let api_key = parts.headers.get(X_API_KEY);
    authorization.is_some_and(|v| token(v.as_bytes()) > max)
        || api_key.is_some_and(|v| v.as_bytes().trim_ascii().len() > max)
}

/// The request's key by `key`, or the response that refuses it, counted:
/// 431 for a key header above `max_key_len` bytes (before `key` runs),
/// 401 when `key` finds none. Both layers start here.
pub(super) fn extract<K, B: Default>(
    parts: &Parts,
    max_key_len: usize,
    key: impl Fn(&Parts) -> Option<K>,
    responses: &ResponseCounts,
) -> Result<K, Response<B>> {
    if oversized(parts, max_key_len) {
        responses.count(Status::KeyTooLarge);
        return Err(headers::key_too_large());
    }
    key(parts).ok_or_else(|| {
        responses.count(Status::Unauthorized);
        headers::unauthorized()
    })
}

/// Reads the key from `Authorization: Bearer <token>`.
///
/// The scheme is matched case-insensitively; surrounding spaces are ignored.
/// Returns `None` when the header is missing, not visible ASCII, uses
/// another scheme, or carries an empty token. It copies the token whatever
/// its length: the layer refuses a token above its bound
/// ([`DEFAULT_MAX_KEY_LEN`], 256 bytes) with 431 before it calls the key
/// function; bound it yourself where you call it outside the layer.
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
/// Like [`bearer_token`], it copies the value whatever its length: the
/// layer refuses one above its bound with 431 first.
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

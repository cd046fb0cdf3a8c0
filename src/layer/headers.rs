//! The HTTP side of a decision: the rate-limit header fields of
//! draft-ietf-httpapi-ratelimit-headers, the concurrency limit's, and the
//! response to a refusal.

use crate::concurrency::ConcurrencyDenial;
use crate::decision::{Decision, Refusal};
use crate::error::Denial;
use crate::gcra::Quota;
use crate::observe::Status;
use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{Response, StatusCode};
use std::time::Duration;

/// The `RateLimit-Policy` header name (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` header name (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The `X-Concurrency-Limit` header name: on a `429` of the concurrency
/// layer, the permits the key may hold at once.
pub const X_CONCURRENCY_LIMIT: HeaderName = HeaderName::from_static("x-concurrency-limit");
/// The `X-Concurrency-Held` header name: on a `429` of the concurrency
/// layer, the permits the key held when refused.
pub const X_CONCURRENCY_HELD: HeaderName = HeaderName::from_static("x-concurrency-held");

/// The `Retry-After` of a `503` for a limiter at its bucket cap
/// ([`Denial::LimiterFull`]): one second. Room comes back as the automatic
/// sweep evicts idle buckets, which new keys' calls pay for, so no exact
/// wait is known; a second spreads the retries of a refused client without
/// keeping it out long.
pub const LIMITER_FULL_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One policy's header fields, by its name.
#[derive(Debug)]
pub(super) struct Fields {
    /// The policy's name as a structured-field string, quotes included
    /// (printable ASCII only, checked by `with_policy_name`).
    item: String,
}

impl Fields {
    pub(super) fn new(name: &str) -> Self {
        Fields {
            item: sf_string(name),
        }
    }

    /// `RateLimit-Policy` for a request under `quota`.
    pub(super) fn policy(&self, quota: &Quota) -> HeaderValue {
        header_value(format!(
            "{};q={};w={}",
            self.item,
            quota.capacity(),
            ceil_secs(quota.refill_time())
        ))
    }

    /// The headers of an admitted request: the policy, and, unless the
    /// backend could not measure it, the bucket's state after the request.
    pub(super) fn admitted(&self, decision: &Decision) -> Vec<(HeaderName, HeaderValue)> {
        let mut headers = vec![(RATELIMIT_POLICY, self.policy(&decision.quota()))];
        if !decision.is_degraded() {
            let state = format!(
                "{};r={};t={}",
                self.item,
                decision.remaining(),
                ceil_secs(decision.reset_after())
            );
            headers.push((RATELIMIT, header_value(state)));
        }
        headers
    }

    /// The response to a request the limiter refused, and the status it
    /// is counted under.
    pub(super) fn refused<B: Default>(
        &self,
        quota: &Quota,
        refusal: &impl Refusal,
    ) -> (Response<B>, Status) {
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        let (status, counted) = match refusal.denial() {
            Some(Denial::InsufficientTokens { retry_after }) => {
                let secs = ceil_secs(*retry_after);
                headers.insert(RETRY_AFTER, HeaderValue::from(secs));
                let state = format!("{};r=0;t={secs}", self.item);
                headers.insert(RATELIMIT, header_value(state));
                (StatusCode::TOO_MANY_REQUESTS, Status::TooManyRequests)
            }
            Some(Denial::ExceedsCapacity { .. }) => {
                (StatusCode::PAYLOAD_TOO_LARGE, Status::PayloadTooLarge)
            }
            // The limiter holds its maximum of buckets: the server's
            // condition, which the sweep lifts.
            Some(Denial::LimiterFull { .. }) => limiter_full(headers),
            // Its clock out of range, or its backend down under a
            // fail-closed policy: the server's condition, not the client's
            // doing, with no known end.
            _ => (StatusCode::SERVICE_UNAVAILABLE, Status::Unavailable),
        };
        headers.insert(RATELIMIT_POLICY, self.policy(quota));
        *response.status_mut() = status;
        (response, counted)
    }
}

/// A limiter at its cap of keys (either limiter's `LimiterFull`): the
/// server's condition, which its sweep lifts: `503` with `Retry-After` of
/// [`LIMITER_FULL_RETRY_AFTER`].
pub(super) fn limiter_full(headers: &mut HeaderMap) -> (StatusCode, Status) {
    let secs = ceil_secs(LIMITER_FULL_RETRY_AFTER);
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    (StatusCode::SERVICE_UNAVAILABLE, Status::Unavailable)
}

/// The response to a request the concurrency limiter refused, its body
/// the reason (from `text`, which makes a body of it), and the status it
/// is counted under: `429` with [`X_CONCURRENCY_LIMIT`] and
/// [`X_CONCURRENCY_HELD`] for a key at its limit (at once or after the
/// wait), with no `Retry-After` (no time is known to help: a permit comes
/// back when a request ends); `503` with `Retry-After` at the cap of keys;
/// `503` alone when the backend could not decide (`denial` is `None`:
/// Redis unreachable, under the failure policy closed), whose body then
/// says only that: the backend's error (hosts, ports, the operating
/// system's words) is the server's business, not the client's.
pub(super) fn concurrency_refused<B: Default>(
    reason: &dyn std::fmt::Display,
    denial: Option<&ConcurrencyDenial>,
    text: impl FnOnce(String) -> B,
) -> (Response<B>, Status) {
    let body = match denial {
        Some(_) => format!("{reason}\n"),
        None => String::from("the concurrency limit could not be checked; try again later\n"),
    };
    let mut response = Response::new(text(body));
    let headers = response.headers_mut();
    let (status, counted) = match denial {
        None => (StatusCode::SERVICE_UNAVAILABLE, Status::Unavailable),
        Some(&ConcurrencyDenial::AtLimit { held, max })
        | Some(&ConcurrencyDenial::TimedOut { held, max, .. }) => {
            headers.insert(X_CONCURRENCY_LIMIT, HeaderValue::from(max));
            headers.insert(X_CONCURRENCY_HELD, HeaderValue::from(held));
            (StatusCode::TOO_MANY_REQUESTS, Status::TooManyRequests)
        }
        Some(ConcurrencyDenial::LimiterFull { .. }) => limiter_full(headers),
        // Not asked for by the layer (it spends no tokens); the server's
        // condition if it ever were.
        _ => (StatusCode::SERVICE_UNAVAILABLE, Status::Unavailable),
    };
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    *response.status_mut() = status;
    (response, counted)
}

/// The response to a request without a key.
pub(super) fn unauthorized<B: Default>() -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The response to a request whose key header is above the layer's bound:
/// `431 Request Header Fields Too Large`, as RFC 6585 has it for one
/// oversized field; no `Retry-After`: the same key never fits.
pub(super) fn key_too_large<B: Default>() -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
    response
}

/// Whole seconds, rounded up.
pub(super) fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// `name` as a structured-field string: quoted, `"` and `\` escaped.
pub(super) fn sf_string(name: &str) -> String {
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

pub(super) fn header_value(text: String) -> HeaderValue {
    // Built from printable ASCII and digits only.
    HeaderValue::try_from(text).expect("printable ASCII")
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
    fn a_backend_failure_does_not_reach_the_client() {
        let reason = "refused (fail closed): Redis unavailable: Connection refused (os error 111)";
        let (response, counted) = concurrency_refused::<String>(&reason, None, |s| s);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(matches!(counted, Status::Unavailable));
        assert!(!response.body().contains("Redis"), "{}", response.body());
        // A denial's own reason is the client's: it says which limit.
        let at_limit = ConcurrencyDenial::AtLimit { held: 2, max: 2 };
        let (response, _) = concurrency_refused::<String>(&at_limit, Some(&at_limit), |s| s);
        assert_eq!(response.body(), &format!("{at_limit}\n"));
    }

    #[test]
    fn quotes_policy_names() {
        assert_eq!(sf_string("tts"), "\"tts\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}

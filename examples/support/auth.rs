//! Authentication before limiting: the key table (API key -> customer,
//! organization, plan), the middleware that looks every API request's key
//! up in it and rate-limits failed attempts per client address, and the
//! constant-time token check of the admin and metrics routes.

use super::{error, App};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use keyrate::layer::{api_key_header, bearer_token, DEFAULT_MAX_KEY_LEN, X_API_KEY};
use keyrate::{Denial, Now};
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Who an API key belongs to. The limiters are keyed by `id` and `org`,
/// never by the key: a key can be rotated without resetting its budget,
/// and no limiter, metric or log holds a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customer {
    /// The customer's id (not a secret; shown in metrics as a fingerprint).
    pub id: Arc<str>,
    /// The organization whose ceiling the customer shares.
    pub org: Arc<str>,
    /// The plan's name: from the table, never from the key's shape.
    pub plan: Arc<str>,
}

/// The API keys this server accepts.
#[derive(Clone, Default)]
pub struct KeyTable(Arc<HashMap<String, Customer>>);

impl fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The keys are secrets: the count only.
        f.debug_struct("KeyTable")
            .field("keys", &self.0.len())
            .finish()
    }
}

/// The built-in demo table of `cargo run --example streaming_server`
/// (key, customer, org, plan). These keys are public: the server prints
/// them, and uses them only when no table is configured.
pub const DEMO_KEYS: &str = "\
sk_agent_demo   cust_agent   org_demo   free
sk_abuser_demo  cust_abuser  org_abuse  free
sk_flood_demo   cust_flood   org_flood  free
sk_pro_demo     cust_pro     org_pro    pro
";

impl KeyTable {
    /// Parses a table: one key a line, `key customer org plan` separated
    /// by whitespace; blank lines and lines starting `#` are skipped.
    /// Every plan must be in `plans`; keys are at most 256 bytes (what
    /// the server reads of a key header) and unique.
    pub fn parse(text: &str, plans: &[&str]) -> Result<Self, String> {
        let mut keys = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [key, id, org, plan] = fields[..] else {
                return Err(format!(
                    "line {}: expected `key customer org plan`, got {} fields",
                    n + 1,
                    fields.len()
                ));
            };
            if key.len() > DEFAULT_MAX_KEY_LEN {
                return Err(format!(
                    "line {}: a key is at most {DEFAULT_MAX_KEY_LEN} bytes",
                    n + 1
                ));
            }
            if !plans.contains(&plan) {
                // Not the field itself: in a line whose columns are out
                // of order it may be a key, and this message may reach a
                // log.
                return Err(format!(
                    "line {}: the fourth column is not a plan: expected one of {plans:?}",
                    n + 1
                ));
            }
            let customer = Customer {
                id: id.into(),
                org: org.into(),
                plan: plan.into(),
            };
            if keys.insert(key.to_owned(), customer).is_some() {
                // Not the key itself: this message may reach a log.
                return Err(format!("line {}: a key listed twice", n + 1));
            }
        }
        Ok(KeyTable(Arc::new(keys)))
    }

    /// The customer of `key`, if the table has it. A lookup in a hash
    /// map with a random per-process seed: its timing tells an attacker
    /// nothing usable about other keys' bytes (a table that must compare
    /// in constant time stores keyed hashes of the keys instead).
    pub fn customer(&self, key: &str) -> Option<&Customer> {
        self.0.get(key)
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// What the authentication refused, and why.
fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = (status, Json(error(code, message))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        let bearer = header::HeaderValue::from_static("Bearer");
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, bearer);
    }
    response
}

/// Whether a key header holds more than the bound (the layer's rule).
fn oversized(headers: &HeaderMap) -> bool {
    let token = |value: &[u8]| {
        let value = value.trim_ascii();
        value
            .iter()
            .position(|&b| b == b' ')
            .map_or(value.len(), |space| value[space + 1..].trim_ascii().len())
    };
    headers
        .get(header::AUTHORIZATION)
        .is_some_and(|v| token(v.as_bytes()) > DEFAULT_MAX_KEY_LEN)
        || headers
            .get(X_API_KEY)
            .is_some_and(|v| v.as_bytes().trim_ascii().len() > DEFAULT_MAX_KEY_LEN)
}

/// Every API route: the request's key (`Authorization: Bearer` or
/// `X-API-Key`) must be in the key table; its [`Customer`] goes into the
/// request's extensions for the limiters. A missing or unknown key is a
/// failed authentication, charged to the client's address: 401 while the
/// address has failures left, then 429 with `Retry-After`, whatever key
/// it sends, a right one included (so that guessing cannot tell a hit
/// while it is throttled). A key header above 256 bytes is 431.
pub async fn authenticate(State(app): State<App>, mut request: Request, next: Next) -> Response {
    if oversized(request.headers()) {
        let message = "the key header is above 256 bytes";
        return refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "key_too_large",
            message,
        );
    }
    let attempt = match Attempt::begin(&app, &request) {
        Ok(attempt) => attempt,
        Err(denial) => return throttled(&denial),
    };
    let (parts, body) = request.into_parts();
    let key = bearer_token(&parts).or_else(|| api_key_header(&parts));
    request = Request::from_parts(parts, body);
    match key.as_deref().and_then(|key| app.keys.customer(key)) {
        Some(customer) => {
            request.extensions_mut().insert(customer.clone());
            next.run(request).await
        }
        None => attempt.failed(&app, unauthorized),
    }
}

/// One authentication attempt of a client, for its address's budget of
/// failures (`App::auth_failures`), which API keys and route tokens share.
struct Attempt {
    /// The client's address (see [`client_key`]).
    client: String,
    /// Whether this attempt has already been charged.
    charged: bool,
}

impl Attempt {
    /// Starts an attempt; `Err` is the denial of an address out of
    /// failures (a 429, see [`throttled`]), whatever it sends.
    fn begin(app: &App, request: &Request) -> Result<Self, Denial> {
        // The peer's address, as axum's `ConnectInfo` saw the TCP
        // connection (behind a proxy, use the address the proxy vouches
        // for instead: through one, every client would share its budget).
        let client = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(|| "unknown".to_owned(), |info| client_key(info.0.ip()));
        let failures = &app.auth_failures;
        let mut charged = false;
        if failures.remaining(client.as_str(), Now) == Ok(0) {
            // Throttled: charge 1 to learn the exact wait (a denial spends
            // nothing); admitted only if the bucket refilled meanwhile,
            // and then that was this attempt's charge.
            let _admitted = failures.check(client.as_str(), Now, 1)?;
            charged = true;
        }
        Ok(Attempt { client, charged })
    }

    /// The attempt failed: charged to the address, `refused` while it has
    /// failures left, 429 once it has none.
    fn failed(self, app: &App, refused: impl FnOnce() -> Response) -> Response {
        if self.charged {
            return refused();
        }
        match app.auth_failures.check(self.client.as_str(), Now, 1) {
            Ok(_) => refused(),
            Err(denial) => throttled(&denial),
        }
    }
}

/// The key of a client's failed authentications: its IPv4 address, or the
/// `/64` network of its IPv6 address. A `/64` is what one subscriber is
/// given, so one attacker holds 2^64 addresses of it: keyed by the whole
/// address, each would get a fresh budget of guesses. An IPv4-mapped IPv6
/// address (a dual-stack socket's view of an IPv4 client) is its IPv4
/// address.
pub fn client_key(ip: IpAddr) -> String {
    let v6 = match ip {
        IpAddr::V4(v4) => return v4.to_string(),
        IpAddr::V6(v6) => v6,
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return v4.to_string();
    }
    let [a, b, c, d, ..] = v6.segments();
    format!("{a:x}:{b:x}:{c:x}:{d:x}::/64")
}

fn unauthorized() -> Response {
    refuse(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "a key from the key table is needed: Authorization: Bearer <key> or X-API-Key",
    )
}

/// 429 for an address out of failed authentications.
fn throttled(denial: &Denial) -> Response {
    let wait = denial.retry_after().unwrap_or_default();
    let seconds = wait.as_nanos().div_ceil(1_000_000_000).max(1).to_string();
    let mut response = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_failed_authentications",
        "too many failed authentications from this address",
    );
    let value = header::HeaderValue::from_str(&seconds).expect("digits");
    response.headers_mut().insert(header::RETRY_AFTER, value);
    response
}

/// The shortest route token accepted, in bytes: a short token is guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// A route's token: a secret, so its `Debug` does not show it.
#[derive(Clone)]
pub struct Token {
    /// The header that carries it: `X-Admin-Token`, or `Authorization`
    /// (as `Bearer <token>`, what Prometheus sends).
    header: header::HeaderName,
    value: Arc<str>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}: [REDACTED])", self.header)
    }
}

impl Token {
    /// The token of the admin routes, in `X-Admin-Token`; `None` for no
    /// token or one under [`MIN_TOKEN_LEN`] bytes (the server refuses
    /// those at startup; an `App` given one has no admin routes).
    pub fn admin(token: Option<&str>) -> Option<Self> {
        Self::new(header::HeaderName::from_static("x-admin-token"), token)
    }

    /// The token of `/metrics`, as `Authorization: Bearer <token>`.
    pub fn bearer(token: Option<&str>) -> Option<Self> {
        Self::new(header::AUTHORIZATION, token)
    }

    fn new(header: header::HeaderName, token: Option<&str>) -> Option<Self> {
        let token = token.filter(|t| t.len() >= MIN_TOKEN_LEN)?;
        Some(Token {
            header,
            value: Arc::from(token),
        })
    }

    /// Whether `headers` carry the token, compared in constant time
    /// (`subtle`; only whether the lengths are equal shows).
    fn matches(&self, headers: &HeaderMap) -> bool {
        let given = headers.get(&self.header).map_or(&[][..], |v| v.as_bytes());
        let given = if self.header == header::AUTHORIZATION {
            match given.get(..7) {
                Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &given[7..],
                _ => &[][..],
            }
        } else {
            given
        };
        bool::from(given.ct_eq(self.value.as_bytes()))
    }
}

/// Routes behind a [`Token`]: checked from the headers alone, so the body
/// is not read before this passes; 401 otherwise. A wrong or missing
/// token is a failed authentication of the client's address, as an
/// unknown API key is (the same budget): guessing a token is throttled,
/// and an address out of failures gets 429 even with the right token.
pub async fn require_token(
    State((token, app)): State<(Token, App)>,
    request: Request,
    next: Next,
) -> Response {
    let attempt = match Attempt::begin(&app, &request) {
        Ok(attempt) => attempt,
        Err(denial) => return throttled(&denial),
    };
    if token.matches(request.headers()) {
        next.run(request).await
    } else {
        attempt.failed(&app, || {
            let message = format!("{} is missing or wrong", token.header);
            refuse(StatusCode::UNAUTHORIZED, "unauthorized", &message)
        })
    }
}

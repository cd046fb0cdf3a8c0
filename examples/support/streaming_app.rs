//! The streaming endpoint that `examples/streaming_server.rs` runs and
//! the `tests/server*.rs` drive: an axum app modelling a real-time TTS
//! service over WebSockets, for the customers of a key table.
//!
//! **Authentication first.** Every API route looks the request's key
//! (`Authorization: Bearer <key>` or `X-API-Key`) up in a [`KeyTable`]
//! (key -> customer id, organization, plan), in `auth.rs`. A missing or
//! unknown key is `401` and a failed authentication of the client's
//! address (axum's `ConnectInfo`), itself a keyrate limiter: after
//! [`Limits::auth_failure_burst`] failures the address gets `429` with
//! `Retry-After`, whatever key it sends, so guessing keys and floods of
//! random keys are throttled, and reach no other limiter. A key header
//! above 256 bytes is `431`. The limiters are keyed by customer id (or
//! org id), never by the key: no limiter, metric or log holds a key.
//!
//! Each customer has two budgets and a concurrency limit:
//!
//! - **connections** (a [`TokenBucketLimiter`]): one token to open a
//!   WebSocket (spent by the [`RateLimitLayer`] on the upgrade request) and
//!   one per synthesis context opened on it. A voice agent opens a
//!   connection and several contexts back-to-back at call start: the burst
//!   covers that.
//! - **synthesis** (a [`keyrate::CompoundLimiter`], `synthesis.rs`): one
//!   token per character to speak, on the WebSocket (`speak` messages) and
//!   over plain HTTP (`POST /v1/tts`, one per byte of the declared body),
//!   charged all or nothing to the customer's plan, per second (with its
//!   burst) and per day, and to its organization's ceiling, which all the
//!   org's customers share. A call denied by one of them spends from none;
//!   the denial names the scope and quota that bound it.
//! - **streams** (a [`ConcurrencyLimiter`]): the WebSockets a customer
//!   holds open at once (free 2, pro 20). The [`ConcurrencyLimitLayer`] on
//!   the upgrade route takes a permit before the connections budget is
//!   spent (a refused stream costs no token; `429` with
//!   `X-Concurrency-Limit`), and the WebSocket handler takes the permit
//!   from the request ([`keyrate::layer::HeldPermit`]) into the stream's
//!   task, which holds it until the socket closes.
//!
//! `POST /v1/tts` charges its declared length: a [`DeclaredLengthLayer`]
//! in front refuses a body without `Content-Length` (a chunked upload)
//! with `411` before anything is charged, and cuts off a body longer than
//! it declared.
//!
//! The WebSocket protocol (`ws.rs`) is JSON text frames. Client to server:
//!
//! ```text
//! {"type":"open","context_id":"c1"}
//! {"type":"speak","context_id":"c1","text":"Hello!"}
//! {"type":"close","context_id":"c1"}
//! ```
//!
//! Server to client: `context_opened`, `audio` and `context_closed`, with
//! the budget's `remaining` tokens (on `audio`, also `customer_remaining`
//! and `org_remaining`), or an error frame:
//!
//! ```text
//! {"type":"error","code":"rate_limited","budget":"synthesis","scope":"org","quota":"org",
//!  "context_id":"c1","cost":600,"retry_after":0.35,"retry_after_ms":350,"strikes":1,"max_strikes":5}
//! ```
//!
//! Bounds: a message (and a frame) is at most [`Limits::max_message_bytes`]
//! (64 KiB; above it the stream is closed with 1009, "message too big"), a
//! context id at most 64 bytes (`context_id_too_long`), a stream holds
//! at most 8 contexts open (`too_many_contexts`), and
//! [`Limits::max_refused`] (32) messages in a row refused without spending
//! a budget close it with 1008.
//!
//! **Plans** (`plans.rs`). The key table puts each customer on `free` or
//! `pro`; each plan has its own quotas for both budgets, applied per
//! request (`RateLimitLayer::with_quota`) and per message, and its own
//! streams limit (`ConcurrencyLimitLayer::with_max`). `PUT
//! /admin/plans/{free,pro}` changes a plan live, body
//! `{"connect_rate":1,"connect_burst":5,"synth_rate":500,"synth_burst":2000,"daily_chars":200000,"max_streams":2}`
//! (each within [`PLAN_BOUNDS`]; `daily_chars` and `max_streams`
//! optional; another plan name is refused with 404; a lowered
//! `max_streams` closes no stream); customers that already have buckets
//! keep their time until full, turned into tokens by the new quota.
//! `GET /admin/plans` lists them.
//!
//! **Tokens.** The admin routes exist only when the app is given an admin
//! token ([`App::with_admin_token`]), and `/metrics` only when it is given
//! a metrics token ([`App::with_metrics_token`], sent as `Authorization:
//! Bearer`, as Prometheus does); each is compared in constant time from
//! the headers, before any body is read (admin bodies above 4 KiB are
//! refused). `/metrics` names top offenders by their customer id's (or,
//! for failed authentications, address's) fingerprint; no key reaches it.
//! Each limiter holds at most [`Limits::max_buckets`] buckets (a handle's
//! too; the streams limiter as many customers): a WebSocket upgrade
//! refused at the cap gets 503 with `Retry-After`.
//!
//! A request denied while the client should still be waiting (before the
//! retry-after of an earlier denial) is a strike; an admitted request clears
//! them. At `max_strikes` the server closes the connection with code 1008
//! (policy violation). Not 1013 (try again later): 1013 says the *server*
//! has a temporary condition, and invites an immediate reconnect; here the
//! *client* broke the protocol's rule, and its next connection is rate
//! limited by the connections budget anyway.

// Each user of this module (the example, the test) uses a different part.
#![allow(dead_code, unused_imports)]

#[path = "auth.rs"]
pub mod auth;
#[path = "plans.rs"]
pub mod plans;
#[path = "serve.rs"]
pub mod serve;
#[path = "synthesis.rs"]
pub mod synthesis;
#[path = "ws.rs"]
pub mod ws;

use axum::extract::DefaultBodyLimit;
use axum::http::request::Parts;
use axum::middleware;
use axum::routing::{get, post, put};
use axum::Router;
use keyrate::layer::{ConcurrencyLimitLayer, DeclaredLengthLayer, RateLimitLayer};
use keyrate::prometheus::{Metrics, CONTENT_TYPE};
use keyrate::{Clock, ConcurrencyLimiter, TokenBucketLimiter};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

pub use self::auth::{Customer, KeyTable, Token, DEMO_KEYS, MIN_TOKEN_LEN};
pub use self::plans::{Plan, Plans, PLAN_BOUNDS};
pub use self::serve::spawn;
pub use self::synthesis::Synthesis;
pub use self::ws::MESSAGE_TOO_BIG;

/// The close code for a key that keeps ignoring `retry_after` (RFC 6455,
/// 7.4.1: "a message that violates its policy").
pub const POLICY_VIOLATION: u16 = 1008;

/// Budgets, patience and bounds: the free plan's quotas, the
/// organizations' ceiling, and the server's bounds on client input.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections and contexts opened per second, sustained.
    pub connect_rate: f64,
    /// Connections and contexts opened back-to-back.
    pub connect_burst: u64,
    /// Characters synthesized per second, sustained.
    pub synth_rate: f64,
    /// Characters synthesized back-to-back.
    pub synth_burst: u64,
    /// Characters synthesized per day (refilled over the day).
    pub daily_chars: u64,
    /// Characters per second that all of an organization's customers
    /// share, sustained.
    pub org_synth_rate: f64,
    /// Characters that all of an organization's customers share,
    /// back-to-back.
    pub org_synth_burst: u64,
    /// How long a `speak` may wait server-side for its characters before
    /// it is denied (absorbs jitter; zero denies at once).
    pub max_queue: Duration,
    /// Denials ignored in a row before the connection is closed.
    pub max_strikes: u32,
    /// WebSocket messages refused in a row without spending any budget
    /// (malformed, unknown context, above capacity...) before the
    /// connection is closed (1008).
    pub max_refused: u32,
    /// Buckets each limiter holds at most (handles included), and keys
    /// the streams limiter tracks at most: the memory bound under a flood
    /// of new keys.
    pub max_buckets: usize,
    /// WebSocket streams a customer holds open at once (at least 1).
    pub max_streams: u32,
    /// Failed authentications per second a client address may make,
    /// sustained, before it gets 429.
    pub auth_failure_rate: f64,
    /// Failed authentications a client address may make back-to-back.
    pub auth_failure_burst: u64,
    /// The largest WebSocket message (and frame), in bytes.
    pub max_message_bytes: usize,
    /// The longest context id, in bytes.
    pub max_context_id_bytes: usize,
    /// Contexts open at once on one stream.
    pub max_contexts: usize,
    /// HTTP connections open at once (WebSockets included until their
    /// upgrade); one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// How long a request head may take to arrive whole (from when the
    /// connection is ready for it, idle keep-alive included).
    pub header_timeout: Duration,
    /// How long a `POST /v1/tts` body may take to arrive whole (408 after).
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect_rate: 1.0,
            connect_burst: 5,
            synth_rate: 500.0,
            synth_burst: 2000,
            daily_chars: 200_000,
            org_synth_rate: 2_000.0,
            org_synth_burst: 10_000,
            max_queue: Duration::from_millis(50),
            max_strikes: 5,
            max_refused: 32,
            max_buckets: 100_000,
            max_streams: 2,
            auth_failure_rate: 0.1,
            auth_failure_burst: 5,
            max_message_bytes: 64 * 1024,
            max_context_id_bytes: 64,
            max_contexts: 8,
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// The largest admin request body read.
const ADMIN_BODY_LIMIT: usize = 4 * 1024;

/// The app's state: the key table, the plans, and the limiters shared by
/// every connection, each keyed by customer (or org) id, never by key.
#[derive(Debug, Clone)]
pub struct App {
    pub limits: Limits,
    pub keys: KeyTable,
    pub plans: Arc<Plans>,
    /// Connections and contexts, per customer.
    pub connections: Arc<TokenBucketLimiter>,
    /// Characters, per customer (per second and per day) and per org.
    pub synthesis: Arc<Synthesis>,
    /// The WebSockets each customer holds open (the free plan's limit by
    /// default; each plan's per request).
    pub streams: Arc<ConcurrencyLimiter>,
    /// Failed authentications, per client address (an IPv6 one per `/64`:
    /// [`auth::client_key`]).
    pub auth_failures: Arc<TokenBucketLimiter>,
    /// The token every admin route needs in `X-Admin-Token`; `None`: the
    /// admin routes are off.
    admin_token: Option<Token>,
    /// The token `/metrics` needs as `Authorization: Bearer`; `None`:
    /// `/metrics` is off.
    metrics_token: Option<Token>,
    /// The limiters' clock, for telling when a client retries too early.
    pub clock: Arc<dyn Clock>,
}

impl App {
    /// Makes the limiters, reading time from `clock` (clones of a clock
    /// share its time), for the customers of `keys`.
    ///
    /// # Panics
    ///
    /// If `limits.max_streams` is 0 or a quota of `limits` is invalid.
    pub fn new(limits: Limits, keys: KeyTable, clock: impl Clock + Clone + 'static) -> Self {
        App {
            plans: Arc::new(Plans::new(&limits)),
            keys,
            admin_token: None,
            metrics_token: None,
            limits,
            connections: Arc::new(
                TokenBucketLimiter::new(limits.connect_rate, limits.connect_burst)
                    .with_top_offenders(true)
                    .with_max_buckets(limits.max_buckets)
                    .with_clock(clock.clone()),
            ),
            synthesis: Arc::new(Synthesis::new(&limits, clock.clone())),
            streams: Arc::new(
                ConcurrencyLimiter::new(limits.max_streams).with_max_keys(limits.max_buckets),
            ),
            auth_failures: Arc::new(
                TokenBucketLimiter::new(limits.auth_failure_rate, limits.auth_failure_burst)
                    .with_top_offenders(true)
                    .with_max_buckets(limits.max_buckets)
                    .with_clock(clock.clone()),
            ),
            clock: Arc::new(clock),
        }
    }

    /// Turns the admin routes on, behind `token` (from the operator's
    /// configuration); `None` or an empty token leaves them off.
    pub fn with_admin_token(mut self, token: Option<&str>) -> Self {
        self.admin_token = Token::admin(token);
        self
    }

    /// Turns `/metrics` on, behind `token` as `Authorization: Bearer`;
    /// `None` or an empty token leaves it off.
    pub fn with_metrics_token(mut self, token: Option<&str>) -> Self {
        self.metrics_token = Token::bearer(token);
        self
    }

    /// Whether the admin routes are on.
    pub fn admin_routes(&self) -> bool {
        self.admin_token.is_some()
    }

    /// Whether `/metrics` is on.
    pub fn metrics_route(&self) -> bool {
        self.metrics_token.is_some()
    }

    /// The routes: `GET /v1/stream` (WebSocket) and `POST /v1/tts` (HTTP),
    /// both behind the key table; with a metrics token, `GET /metrics`
    /// (Prometheus text: the connections and failed authentications'
    /// counters and top offenders by fingerprint, the streams in flight,
    /// synthesis denials by quota, and the layers' responses by status,
    /// the `411` and `400` of `POST /v1/tts` under `limiter="tts_length"`);
    /// with an admin token, `GET /admin/plans` and `PUT /admin/plans/{name}`.
    pub fn router(&self) -> Router {
        let customer = |parts: &Parts| parts.extensions.get::<Customer>().cloned();
        let customer_id = move |parts: &Parts| customer(parts).map(|c| c.id.to_string());
        let plans = Arc::clone(&self.plans);
        let connect_layer = RateLimitLayer::new(Arc::clone(&self.connections), customer_id)
            .with_policy_name("connections")
            .with_quota(move |parts: &Parts| Some(plans.get(&customer(parts)?.plan).connections));
        let plans = Arc::clone(&self.plans);
        let streams_layer = ConcurrencyLimitLayer::new(Arc::clone(&self.streams), customer_id)
            .with_max(move |parts: &Parts| Some(plans.get(&customer(parts)?.plan).streams));
        let length_layer = DeclaredLengthLayer::new();
        let api = Router::new()
            // The streams limit first (the outer layer): a stream refused
            // for it spends no connection token.
            .route(
                "/v1/stream",
                get(ws::stream)
                    .route_layer(connect_layer.clone())
                    .route_layer(streams_layer.clone()),
            )
            // A body that declares no length is refused (411) before the
            // synthesis budget is charged its length.
            .route(
                "/v1/tts",
                post(synthesis::tts).route_layer(length_layer.clone()),
            )
            // Authentication outermost: nothing is limited by a key
            // that is not in the table.
            .route_layer(middleware::from_fn_with_state(
                self.clone(),
                auth::authenticate,
            ));
        let mut router = api;
        if let Some(token) = &self.metrics_token {
            // Offenders are labelled by their customer id's fingerprint
            // (the default `KeyLabels`), failed authentications by their
            // address's: the limiters never see an API key.
            let metrics = Arc::new(
                Metrics::new()
                    .limiter("connections", self.connections.clone())
                    .limiter("auth_failures", self.auth_failures.clone())
                    .concurrency("streams", self.streams.clone())
                    .layer("connections", &connect_layer)
                    .concurrency_layer("streams", &streams_layer)
                    .length_layer("tts_length", &length_layer),
            );
            let synthesis = Arc::clone(&self.synthesis);
            let scrape = get(move || async move {
                let mut text = metrics.render();
                synthesis.render(&mut text);
                ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text)
            })
            .route_layer(middleware::from_fn_with_state(
                (token.clone(), self.clone()),
                auth::require_token,
            ));
            router = router.route("/metrics", scrape);
        }
        if let Some(token) = &self.admin_token {
            // Every admin route, checked before any body is read.
            let admin = Router::new()
                .route("/admin/plans", get(plans::list_plans))
                .route("/admin/plans/{name}", put(plans::set_plan))
                .route_layer(middleware::from_fn_with_state(
                    (token.clone(), self.clone()),
                    auth::require_token,
                ))
                .layer(DefaultBodyLimit::max(ADMIN_BODY_LIMIT));
            router = router.merge(admin);
        }
        router.with_state(self.clone())
    }
}

/// An error frame or body.
pub fn error(code: &str, message: &str) -> Value {
    json!({ "type": "error", "code": code, "message": message })
}

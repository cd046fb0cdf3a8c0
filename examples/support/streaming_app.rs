//! The streaming endpoint that `examples/streaming_server.rs` runs and
//! `tests/server.rs` drives: an axum app modelling a real-time TTS service
//! over WebSockets, gated by per-customer API keys.
//!
//! Each API key has two budgets, both keyrate limiters:
//!
//! - **connections**: one token to open a WebSocket (spent by the
//!   [`RateLimitLayer`] on the upgrade request) and one per synthesis
//!   context opened on it. A voice agent opens a connection and several
//!   contexts back-to-back at call start: the burst covers that.
//! - **synthesis**: one token per character of text to speak, on the
//!   WebSocket (`speak` messages) and over plain HTTP (`POST /v1/tts`, where
//!   the layer's cost function charges the body's length).
//!
//! And a concurrency limit, a [`ConcurrencyLimiter`]: **streams**, the
//! WebSockets a key holds open at once (free 2, pro 20). The
//! [`ConcurrencyLimitLayer`] on the upgrade route takes a permit before
//! the connections budget is spent (a refused stream costs no token;
//! `429` with `X-Concurrency-Limit`), and the WebSocket handler takes the
//! permit from the request ([`HeldPermit`]) into the stream's task, which
//! holds it until the socket closes: by a close frame, or by the client
//! vanishing (the server sees the TCP connection end).
//!
//! The WebSocket protocol is JSON text frames. Client to server:
//!
//! ```text
//! {"type":"open","context_id":"c1"}
//! {"type":"speak","context_id":"c1","text":"Hello!"}
//! {"type":"close","context_id":"c1"}
//! ```
//!
//! Server to client: `context_opened`, `audio` and `context_closed`, each
//! with the budget's `remaining` tokens, or an error frame:
//!
//! ```text
//! {"type":"error","code":"rate_limited","budget":"synthesis","context_id":"c1",
//!  "cost":600,"retry_after":0.35,"retry_after_ms":350,"strikes":1,"max_strikes":5}
//! ```
//!
//! **Plans.** Keys starting `sk_pro_` are on the `pro` plan, every other
//! key on `free`; each plan has its own quotas for both budgets, applied
//! per request (`RateLimitLayer::with_quota`) and per message
//! (`BucketHandle::under`), and its own streams limit
//! (`ConcurrencyLimitLayer::with_max`). `PUT /admin/plans/{free,pro}`
//! changes a plan live, body
//! `{"connect_rate":1,"connect_burst":5,"synth_rate":500,"synth_burst":2000,"max_streams":2}`
//! (each within [`PLAN_BOUNDS`]; `max_streams` optional; another plan
//! name is refused with 404; a lowered `max_streams` closes no stream);
//! keys that already have buckets keep their time until full, turned into
//! tokens by the new quota. `GET /admin/plans` lists them.
//!
//! **Safe to copy.** The admin routes exist only when the app is given an
//! admin token ([`App::with_admin_token`]; the server reads it from
//! `KEYRATE_ADMIN_TOKEN` or `--admin-token`), and every one of them needs
//! it in `X-Admin-Token`, compared in constant time before the request's
//! body is read (bodies above 4 KiB are refused). `/metrics` names top
//! offenders by their key's fingerprint, never the key (and the streams
//! limiter's series name no key at all). Key headers above
//! 256 bytes get 431, and each limiter holds at most
//! [`Limits::max_buckets`] buckets (a handle's too; the streams limiter as
//! many keys): a WebSocket upgrade refused at the cap gets 503 with
//! `Retry-After`.
//!
//! A request denied while the client should still be waiting (before the
//! retry-after of an earlier denial) is a strike; an admitted request clears
//! them. At `max_strikes` the server closes the connection with code 1008
//! (policy violation). Not 1013 (try again later): 1013 says the *server*
//! has a temporary condition, and invites an immediate reconnect; here the
//! *client* broke the protocol's rule, and its next connection is rate
//! limited by the connections budget anyway.

// Each user of this module (the example, the test) uses a different part.
#![allow(dead_code)]

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use keyrate::layer::{
    api_key_header, bearer_token, ConcurrencyLimitLayer, HeldPermit, Limited, RateLimitLayer,
};
use keyrate::prometheus::{Metrics, CONTENT_TYPE};
use keyrate::{
    AsyncLimiter, BucketHandle, Clock, ConcurrencyLimiter, ConfigError, Decision, Denial, Limiter,
    Now, Permit, Quota, TokenBucketLimiter,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

/// The close code for a key that keeps ignoring `retry_after` (RFC 6455,
/// 7.4.1: "a message that violates its policy").
pub const POLICY_VIOLATION: u16 = 1008;

/// Budgets and patience, per API key.
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
    /// How long a `speak` may wait server-side for its characters before
    /// it is denied (absorbs jitter; zero denies at once).
    pub max_queue: Duration,
    /// Denials ignored in a row before the connection is closed.
    pub max_strikes: u32,
    /// Buckets each limiter holds at most (handles included), and keys
    /// the streams limiter tracks at most: the memory bound under a flood
    /// of new keys.
    pub max_buckets: usize,
    /// WebSocket streams a key holds open at once (at least 1).
    pub max_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect_rate: 1.0,
            connect_burst: 5,
            synth_rate: 500.0,
            synth_burst: 2000,
            max_queue: Duration::from_millis(50),
            max_strikes: 5,
            max_buckets: 100_000,
            max_streams: 2,
        }
    }
}

/// The most a plan may grant, per key: an admin mistake (or a stolen
/// admin token) cannot set a quota that makes the limits meaningless.
pub const PLAN_BOUNDS: Limits = Limits {
    connect_rate: 1_000.0,
    connect_burst: 10_000,
    synth_rate: 1_000_000.0,
    synth_burst: 10_000_000,
    max_queue: Duration::ZERO,
    max_strikes: 0,
    max_buckets: 0,
    max_streams: 1_000,
};

/// The largest admin request body read.
const ADMIN_BODY_LIMIT: usize = 4 * 1024;

/// One plan: the quota of each budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub connections: Quota,
    pub synthesis: Quota,
    /// WebSocket streams open at once (0: none).
    pub streams: u32,
}

impl Plan {
    /// The plan of these limits, if they are within [`PLAN_BOUNDS`].
    fn bounded(limits: &Limits) -> Result<Self, String> {
        let bounds = PLAN_BOUNDS;
        let within = limits.connect_rate <= bounds.connect_rate
            && limits.connect_burst <= bounds.connect_burst
            && limits.synth_rate <= bounds.synth_rate
            && limits.synth_burst <= bounds.synth_burst
            && limits.max_streams <= bounds.max_streams;
        if !within {
            return Err(format!(
                "quotas are bounded: connect_rate <= {}, connect_burst <= {}, \
                 synth_rate <= {}, synth_burst <= {}, max_streams <= {}",
                bounds.connect_rate,
                bounds.connect_burst,
                bounds.synth_rate,
                bounds.synth_burst,
                bounds.max_streams
            ));
        }
        Plan::from_limits(limits).map_err(|err| err.to_string())
    }

    /// The plan of these limits.
    pub fn from_limits(limits: &Limits) -> Result<Self, ConfigError> {
        Ok(Plan {
            connections: Quota::new(limits.connect_rate, limits.connect_burst)?,
            synthesis: Quota::new(limits.synth_rate, limits.synth_burst)?,
            streams: limits.max_streams,
        })
    }

    fn to_json(self) -> Value {
        json!({
            "connect_rate": self.connections.rate(), "connect_burst": self.connections.capacity(),
            "synth_rate": self.synthesis.rate(), "synth_burst": self.synthesis.capacity(),
            "max_streams": self.streams,
        })
    }
}

/// The plans by name, read on every request and changed by the admin route.
#[derive(Debug)]
pub struct Plans(RwLock<BTreeMap<String, Plan>>);

impl Plans {
    /// `free` from `limits`, and `pro` with five times the bursts and ten
    /// times the rates and streams.
    fn new(limits: &Limits) -> Self {
        let free = Plan::from_limits(limits).expect("valid limits");
        let pro = Plan::from_limits(&Limits {
            connect_rate: limits.connect_rate * 10.0,
            connect_burst: limits.connect_burst * 5,
            synth_rate: limits.synth_rate * 10.0,
            synth_burst: limits.synth_burst * 5,
            max_streams: limits.max_streams * 10,
            ..*limits
        })
        .expect("valid limits");
        let plans = BTreeMap::from([("free".to_owned(), free), ("pro".to_owned(), pro)]);
        Plans(RwLock::new(plans))
    }

    /// The plan an API key is on: `pro` for `sk_pro_` keys, else `free`.
    pub fn name_for(key: &str) -> &'static str {
        if key.starts_with("sk_pro_") {
            "pro"
        } else {
            "free"
        }
    }

    /// The plan called `name` now.
    pub fn get(&self, name: &str) -> Plan {
        let plans = self.0.read().expect("plans lock");
        plans
            .get(name)
            .or_else(|| plans.get("free"))
            .copied()
            .expect("a free plan")
    }

    /// Replaces the plan called `name`; false (and nothing changes) if
    /// there is no such plan: the plans are fixed, their quotas are not.
    fn set(&self, name: &str, plan: Plan) -> bool {
        match self.0.write().expect("plans lock").get_mut(name) {
            Some(old) => {
                *old = plan;
                true
            }
            None => false,
        }
    }
}

/// The app's state: both budgets' limiters and the streams limiter,
/// shared by every connection.
#[derive(Debug, Clone)]
pub struct App {
    pub limits: Limits,
    pub connections: Arc<TokenBucketLimiter>,
    pub synthesis: Arc<TokenBucketLimiter>,
    /// The WebSockets each key holds open (the free plan's limit by
    /// default; each plan's per request).
    pub streams: Arc<ConcurrencyLimiter>,
    pub plans: Arc<Plans>,
    /// The token every admin route needs in `X-Admin-Token`; `None`: the
    /// admin routes are off.
    admin_token: Option<AdminToken>,
    /// The limiters' clock, for telling when a client retries too early.
    pub clock: Arc<dyn Clock>,
}

impl App {
    /// Makes the limiters, reading time from `clock` (clones of a clock
    /// share its time).
    ///
    /// # Panics
    ///
    /// If `limits.max_streams` is 0.
    pub fn new(limits: Limits, clock: impl Clock + Clone + 'static) -> Self {
        App {
            plans: Arc::new(Plans::new(&limits)),
            admin_token: None,
            limits,
            connections: Arc::new(
                TokenBucketLimiter::new(limits.connect_rate, limits.connect_burst)
                    .with_top_offenders(true)
                    .with_max_buckets(limits.max_buckets)
                    .with_clock(clock.clone()),
            ),
            synthesis: Arc::new(
                TokenBucketLimiter::new(limits.synth_rate, limits.synth_burst)
                    .with_top_offenders(true)
                    .with_max_buckets(limits.max_buckets)
                    .with_clock(clock.clone()),
            ),
            streams: Arc::new(
                ConcurrencyLimiter::new(limits.max_streams).with_max_keys(limits.max_buckets),
            ),
            clock: Arc::new(clock),
        }
    }

    /// Turns the admin routes on, behind `token` (from the operator's
    /// configuration); `None` or an empty token leaves them off.
    pub fn with_admin_token(mut self, token: Option<&str>) -> Self {
        self.admin_token = token
            .filter(|t| !t.is_empty())
            .map(|t| AdminToken(Arc::from(t)));
        self
    }

    /// Whether the admin routes are on.
    pub fn admin_routes(&self) -> bool {
        self.admin_token.is_some()
    }

    /// The routes: `GET /v1/stream` (WebSocket), `POST /v1/tts` (HTTP),
    /// `GET /metrics` (Prometheus text: both budgets' counters and top
    /// offenders by fingerprint, the streams in flight, keys and
    /// refusals, and the three layers' responses by status),
    /// and, with an admin token, `GET /admin/plans` and
    /// `PUT /admin/plans/{name}`.
    pub fn router(&self) -> Router {
        let plans = Arc::clone(&self.plans);
        let connect_layer = RateLimitLayer::new(Arc::clone(&self.connections), api_key)
            .with_policy_name("connections")
            .with_quota(move |parts: &Parts| {
                Some(plans.get(Plans::name_for(&api_key(parts)?)).connections)
            });
        let plans = Arc::clone(&self.plans);
        let tts_layer = RateLimitLayer::new(Arc::clone(&self.synthesis), api_key)
            .with_policy_name("synthesis")
            .with_cost(declared_length)
            .with_quota(move |parts: &Parts| {
                Some(plans.get(Plans::name_for(&api_key(parts)?)).synthesis)
            });
        let plans = Arc::clone(&self.plans);
        let streams_layer = ConcurrencyLimitLayer::new(Arc::clone(&self.streams), api_key)
            .with_max(move |parts: &Parts| {
                Some(plans.get(Plans::name_for(&api_key(parts)?)).streams)
            });
        // Offenders are labelled by their key's fingerprint (the default
        // `KeyLabels`): the scrape never shows an API key. The streams
        // limiter has no per-key series.
        let metrics = Arc::new(
            Metrics::new()
                .limiter("connections", self.connections.clone())
                .limiter("synthesis", self.synthesis.clone())
                .concurrency("streams", self.streams.clone())
                .layer("connections", &connect_layer)
                .layer("synthesis", &tts_layer)
                .concurrency_layer("streams", &streams_layer),
        );
        let scrape = get(move || async move {
            (
                [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
                metrics.render(),
            )
        });
        let mut router = Router::new()
            // The streams limit first (the outer layer): a stream refused
            // for it spends no connection token.
            .route(
                "/v1/stream",
                get(stream)
                    .route_layer(connect_layer)
                    .route_layer(streams_layer),
            )
            .route("/v1/tts", post(tts).route_layer(tts_layer))
            .route("/metrics", scrape);
        if let Some(token) = &self.admin_token {
            // Every admin route, checked before any body is read.
            let admin = Router::new()
                .route("/admin/plans", get(list_plans))
                .route("/admin/plans/{name}", put(set_plan))
                .route_layer(middleware::from_fn_with_state(
                    token.clone(),
                    require_admin_token,
                ))
                .layer(DefaultBodyLimit::max(ADMIN_BODY_LIMIT));
            router = router.merge(admin);
        }
        router.with_state(self.clone())
    }
}

/// The admin token: a secret, so its `Debug` does not show it.
#[derive(Clone)]
struct AdminToken(Arc<str>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken([REDACTED])")
    }
}

/// Admin routes: `X-Admin-Token` must equal the configured token, compared
/// in constant time (`subtle`; only the lengths' equality shows), from the
/// headers alone: the body is not read before this passes.
async fn require_admin_token(
    State(AdminToken(token)): State<AdminToken>,
    request: Request,
    next: middleware::Next,
) -> Response {
    let given = request
        .headers()
        .get("x-admin-token")
        .map_or(&[][..], |v| v.as_bytes());
    if bool::from(given.ct_eq(token.as_bytes())) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            Json(error("unauthorized", "X-Admin-Token is missing or wrong")),
        )
            .into_response()
    }
}

/// Binds `127.0.0.1:port` (0 picks a free port) and serves the app in a
/// background task; returns the bound address.
pub async fn spawn(app: &App, port: u16) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let router = app.router();
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, router).await {
            eprintln!("server error: {err}");
        }
    });
    Ok(addr)
}

/// The API key: `Authorization: Bearer <key>`, else `X-API-Key: <key>`.
pub fn api_key(parts: &Parts) -> Option<String> {
    bearer_token(parts).or_else(|| api_key_header(parts))
}

/// The cost of `POST /v1/tts`: its declared body length, in bytes (the
/// handler refuses a body without one).
fn declared_length(parts: &Parts) -> u64 {
    parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

/// `GET /admin/plans`: every plan's quotas.
async fn list_plans(State(app): State<App>) -> Response {
    let plans = app.plans.0.read().expect("plans lock").clone();
    let plans: serde_json::Map<String, Value> = plans
        .into_iter()
        .map(|(name, plan)| (name, plan.to_json()))
        .collect();
    Json(Value::Object(plans)).into_response()
}

/// `PUT /admin/plans/{name}`: replaces a plan's quotas, live (the token
/// was checked first, by `require_admin_token`).
async fn set_plan(
    State(app): State<App>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let streams = match &body["max_streams"] {
        Value::Null => Some(app.plans.get(&name).streams),
        given => given.as_u64().and_then(|n| u32::try_from(n).ok()),
    };
    let (
        Some(connect_rate),
        Some(connect_burst),
        Some(synth_rate),
        Some(synth_burst),
        Some(max_streams),
    ) = (
        body["connect_rate"].as_f64(),
        body["connect_burst"].as_u64(),
        body["synth_rate"].as_f64(),
        body["synth_burst"].as_u64(),
        streams,
    )
    else {
        let message =
            "expected connect_rate, connect_burst, synth_rate, synth_burst (and max_streams)";
        return (StatusCode::BAD_REQUEST, Json(error("bad_request", message))).into_response();
    };
    let limits = Limits {
        connect_rate,
        connect_burst,
        synth_rate,
        synth_burst,
        max_streams,
        ..app.limits
    };
    let plan = match Plan::bounded(&limits) {
        Ok(plan) => plan,
        Err(message) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(error("invalid_quota", &message)),
            )
                .into_response()
        }
    };
    if !app.plans.set(&name, plan) {
        let message = "the plans are free and pro";
        return (StatusCode::NOT_FOUND, Json(error("unknown_plan", message))).into_response();
    }
    Json(plan.to_json()).into_response()
}

/// `POST /v1/tts`: synthesizes the body's text in one response (simulated).
async fn tts(parts: Parts, body: String) -> Response {
    if parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .is_none()
    {
        return StatusCode::LENGTH_REQUIRED.into_response();
    }
    Json(json!({ "characters": body.chars().count() })).into_response()
}

/// `GET /v1/stream`: the layers have admitted the connection; take its
/// streams permit for the socket's life, resolve the key's buckets once
/// (refused with 503 and `Retry-After` when a limiter holds its maximum
/// of buckets), then serve the socket.
async fn stream(State(app): State<App>, parts: Parts, ws: WebSocketUpgrade) -> Response {
    // The layer admitted the request under this key (bounded in size).
    let Some(Limited { key, .. }) = parts.extensions.get::<Limited>() else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    // Taken from the request, the permit is no longer given back with the
    // upgrade response (which ends at once): the session holds it.
    let permit = parts
        .extensions
        .get::<HeldPermit>()
        .and_then(HeldPermit::take);
    let handles = app
        .connections
        .try_bucket(key.as_str())
        .and_then(|connections| Ok((connections, app.synthesis.try_bucket(key.as_str())?)));
    let (connections, synthesis) = match handles {
        Ok(handles) => handles,
        Err(denial) => {
            let retry_after = keyrate::layer::LIMITER_FULL_RETRY_AFTER
                .as_secs()
                .to_string();
            let message = denial.to_string();
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, retry_after)],
                Json(error("unavailable", &message)),
            )
                .into_response();
        }
    };
    let session = Session {
        permit,
        connections,
        synthesis,
        plan: Plans::name_for(key),
        app,
        contexts: HashSet::new(),
        retry_at: None,
        strikes: 0,
    };
    ws.on_upgrade(move |socket| session.run(socket))
}

/// One connection: its key's streams permit and buckets, held for the
/// connection's life.
struct Session {
    app: App,
    /// One of the key's streams, given back when the session ends (the
    /// socket closed, cleanly or not, or its upgrade failed).
    permit: Option<Permit>,
    /// Spent with no map lookup on every message.
    connections: BucketHandle,
    synthesis: BucketHandle,
    /// The key's plan, looked up on every message so a change applies at
    /// once.
    plan: &'static str,
    contexts: HashSet<String>,
    /// When the last denial said the client could retry (on the clock).
    retry_at: Option<Duration>,
    /// Denials in a row that arrived before `retry_at`.
    strikes: u32,
}

/// What the session does after a message.
enum Next {
    Reply(Value),
    Close(Value, CloseFrame),
}

impl Session {
    async fn run(mut self, mut socket: WebSocket) {
        while let Some(Ok(message)) = socket.recv().await {
            let text = match message {
                Message::Text(text) => text,
                Message::Close(_) => break,
                // Pings are answered by axum; binary frames are not used.
                _ => continue,
            };
            let next = self.handle(text.as_str()).await;
            let (reply, close) = match next {
                Next::Reply(reply) => (reply, None),
                Next::Close(reply, frame) => (reply, Some(frame)),
            };
            if socket
                .send(Message::Text(reply.to_string().into()))
                .await
                .is_err()
            {
                break;
            }
            if let Some(frame) = close {
                let _ = socket.send(Message::Close(Some(frame))).await;
                break;
            }
        }
        // The stream is over: its permit goes back before the socket is
        // dropped, so a client that sees the connection end can count on it.
        drop(self.permit.take());
    }

    async fn handle(&mut self, text: &str) -> Next {
        let Ok(request) = serde_json::from_str::<Value>(text) else {
            return Next::Reply(error("bad_request", "expected a JSON object"));
        };
        let context = request["context_id"].as_str().unwrap_or("").to_owned();
        match request["type"].as_str() {
            Some("open") => {
                let quota = self.app.plans.get(self.plan).connections;
                let decision = Limiter::check(&self.connections.under(&quota), &(), Now, 1);
                self.decide("connections", &context, 1, decision, |this, remaining| {
                    this.contexts.insert(context.clone());
                    json!({ "type": "context_opened", "context_id": context, "remaining": remaining })
                })
            }
            Some("speak") if self.contexts.contains(&context) => {
                let text = request["text"].as_str().unwrap_or("");
                let cost = text.chars().count() as u64;
                let quota = self.app.plans.get(self.plan).synthesis;
                let max_queue = self.app.limits.max_queue;
                let decision =
                    AsyncLimiter::wait(&self.synthesis.under(&quota), &(), cost, max_queue).await;
                self.decide("synthesis", &context, cost, decision, |_, remaining| {
                    json!({ "type": "audio", "context_id": context, "characters": cost, "remaining": remaining })
                })
            }
            Some("close") if self.contexts.remove(&context) => {
                Next::Reply(json!({ "type": "context_closed", "context_id": context }))
            }
            Some("speak" | "close") => {
                Next::Reply(error("unknown_context", "open the context first"))
            }
            _ => Next::Reply(error("bad_request", "type must be open, speak or close")),
        }
    }

    /// Turns a budget's decision into the reply, counting strikes.
    fn decide(
        &mut self,
        budget: &str,
        context: &str,
        cost: u64,
        decision: Result<Decision, Denial>,
        admitted: impl FnOnce(&mut Self, u64) -> Value,
    ) -> Next {
        let retry_after = match decision {
            Ok(decision) => {
                self.strikes = 0;
                self.retry_at = None;
                return Next::Reply(admitted(self, decision.remaining()));
            }
            Err(Denial::InsufficientTokens { retry_after }) => retry_after,
            Err(Denial::ExceedsCapacity { capacity, .. }) => {
                return Next::Reply(json!({
                    "type": "error", "code": "exceeds_capacity", "budget": budget,
                    "context_id": context, "cost": cost, "capacity": capacity,
                }));
            }
            Err(denial) => return Next::Reply(error("unavailable", &denial.to_string())),
        };
        let now = self.app.clock.now();
        if self.retry_at.is_some_and(|at| now < at) {
            self.strikes += 1;
        }
        self.retry_at = Some(now + retry_after);
        let max_strikes = self.app.limits.max_strikes;
        let reply = json!({
            "type": "error", "code": "rate_limited", "budget": budget, "context_id": context,
            "cost": cost, "retry_after": retry_after.as_secs_f64(),
            "retry_after_ms": retry_after.as_nanos().div_ceil(1_000_000), // rounded up
            "strikes": self.strikes, "max_strikes": max_strikes,
        });
        if self.strikes >= max_strikes {
            let frame = CloseFrame {
                code: POLICY_VIOLATION,
                reason: format!("rate limit: {max_strikes} requests ignored retry_after").into(),
            };
            return Next::Close(reply, frame);
        }
        Next::Reply(reply)
    }
}

fn error(code: &str, message: &str) -> Value {
    json!({ "type": "error", "code": code, "message": message })
}

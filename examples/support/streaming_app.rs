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
//! (`BucketHandle::under`). `PUT /admin/plans/{name}` (header
//! `X-Admin-Token`) changes a plan live, body
//! `{"connect_rate":1,"connect_burst":5,"synth_rate":500,"synth_burst":2000}`;
//! keys that already have buckets keep their time until full, turned into
//! tokens by the new quota. `GET /admin/plans` lists them.
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
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use keyrate::layer::{api_key_header, bearer_token, RateLimitLayer};
use keyrate::prometheus::{Metrics, CONTENT_TYPE};
use keyrate::{
    AsyncLimiter, BucketHandle, Clock, ConfigError, Decision, Denial, Limiter, Now, Quota,
    TokenBucketLimiter,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
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
        }
    }
}

/// One plan: the quota of each budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub connections: Quota,
    pub synthesis: Quota,
}

impl Plan {
    /// The plan of these limits.
    pub fn from_limits(limits: &Limits) -> Result<Self, ConfigError> {
        Ok(Plan {
            connections: Quota::new(limits.connect_rate, limits.connect_burst)?,
            synthesis: Quota::new(limits.synth_rate, limits.synth_burst)?,
        })
    }

    fn to_json(self) -> Value {
        json!({
            "connect_rate": self.connections.rate(), "connect_burst": self.connections.capacity(),
            "synth_rate": self.synthesis.rate(), "synth_burst": self.synthesis.capacity(),
        })
    }
}

/// The plans by name, read on every request and changed by the admin route.
#[derive(Debug)]
pub struct Plans(RwLock<BTreeMap<String, Plan>>);

impl Plans {
    /// `free` from `limits`, and `pro` with five times the bursts and ten
    /// times the rates.
    fn new(limits: &Limits) -> Self {
        let free = Plan::from_limits(limits).expect("valid limits");
        let pro = Plan::from_limits(&Limits {
            connect_rate: limits.connect_rate * 10.0,
            connect_burst: limits.connect_burst * 5,
            synth_rate: limits.synth_rate * 10.0,
            synth_burst: limits.synth_burst * 5,
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

    fn set(&self, name: &str, plan: Plan) {
        self.0
            .write()
            .expect("plans lock")
            .insert(name.to_owned(), plan);
    }
}

/// The app's state: both budgets' limiters, shared by every connection.
#[derive(Debug, Clone)]
pub struct App {
    pub limits: Limits,
    pub connections: Arc<TokenBucketLimiter>,
    pub synthesis: Arc<TokenBucketLimiter>,
    pub plans: Arc<Plans>,
    /// The token `PUT /admin/plans/{name}` needs in `X-Admin-Token`.
    pub admin_token: Arc<str>,
    /// The limiters' clock, for telling when a client retries too early.
    pub clock: Arc<dyn Clock>,
}

impl App {
    /// Makes both limiters, reading time from `clock` (clones of a clock
    /// share its time).
    pub fn new(limits: Limits, clock: impl Clock + Clone + 'static) -> Self {
        App {
            plans: Arc::new(Plans::new(&limits)),
            admin_token: Arc::from("admin-secret"),
            limits,
            connections: Arc::new(
                TokenBucketLimiter::new(limits.connect_rate, limits.connect_burst)
                    .with_top_offenders(true)
                    .with_clock(clock.clone()),
            ),
            synthesis: Arc::new(
                TokenBucketLimiter::new(limits.synth_rate, limits.synth_burst)
                    .with_top_offenders(true)
                    .with_clock(clock.clone()),
            ),
            clock: Arc::new(clock),
        }
    }

    /// The routes: `GET /v1/stream` (WebSocket), `POST /v1/tts` (HTTP) and
    /// `GET /metrics` (Prometheus text: both budgets' counters and top
    /// offenders, and both layers' responses by status).
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
        // The example's API keys are labels here; a real service would key
        // its limiters by a non-secret customer id (see keyrate::prometheus).
        let metrics = Arc::new(
            Metrics::new()
                .limiter("connections", self.connections.clone())
                .limiter("synthesis", self.synthesis.clone())
                .layer("connections", &connect_layer)
                .layer("synthesis", &tts_layer),
        );
        let scrape = get(move || async move {
            (
                [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
                metrics.render(),
            )
        });
        Router::new()
            .route("/v1/stream", get(stream).route_layer(connect_layer))
            .route("/v1/tts", post(tts).route_layer(tts_layer))
            .route("/metrics", scrape)
            .route("/admin/plans", get(list_plans))
            .route("/admin/plans/{name}", put(set_plan))
            .with_state(self.clone())
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

/// `PUT /admin/plans/{name}`: replaces a plan's quotas, live.
async fn set_plan(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let token = headers.get("x-admin-token").and_then(|v| v.to_str().ok());
    if token != Some(&*app.admin_token) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let (Some(connect_rate), Some(connect_burst), Some(synth_rate), Some(synth_burst)) = (
        body["connect_rate"].as_f64(),
        body["connect_burst"].as_u64(),
        body["synth_rate"].as_f64(),
        body["synth_burst"].as_u64(),
    ) else {
        let message = "expected connect_rate, connect_burst, synth_rate, synth_burst";
        return (StatusCode::BAD_REQUEST, Json(error("bad_request", message))).into_response();
    };
    let limits = Limits {
        connect_rate,
        connect_burst,
        synth_rate,
        synth_burst,
        ..app.limits
    };
    match Plan::from_limits(&limits) {
        Ok(plan) => {
            app.plans.set(&name, plan);
            Json(plan.to_json()).into_response()
        }
        Err(err) => (
            StatusCode::BAD_REQUEST,
            Json(error("invalid_quota", &err.to_string())),
        )
            .into_response(),
    }
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

/// `GET /v1/stream`: the layer has admitted the connection; resolve the
/// key's buckets once, then serve the socket.
async fn stream(State(app): State<App>, parts: Parts, ws: WebSocketUpgrade) -> Response {
    // The layer refused requests without a key, so this is always `Some`.
    let Some(key) = api_key(&parts) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let session = Session {
        connections: app.connections.bucket(key.as_str()),
        synthesis: app.synthesis.bucket(key.as_str()),
        plan: Plans::name_for(&key),
        app,
        contexts: HashSet::new(),
        retry_at: None,
        strikes: 0,
    };
    ws.on_upgrade(move |socket| session.run(socket))
}

/// One connection: its key's buckets, held for the connection's life.
struct Session {
    app: App,
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

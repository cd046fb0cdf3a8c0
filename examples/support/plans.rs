//! Plans: the quotas a customer is held to, by plan name (the key table
//! says which plan a customer is on), and the admin routes that change
//! them live.

use super::{error, App, Limits};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use keyrate::{ConfigError, Policy, Quota};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Seconds in a day: the daily quota refills over one.
pub const DAY: f64 = 86_400.0;

/// The most a plan may grant, per customer: an admin mistake (or a
/// stolen admin token) cannot set a quota that makes the limits
/// meaningless.
pub const PLAN_BOUNDS: Limits = Limits {
    connect_rate: 1_000.0,
    connect_burst: 10_000,
    synth_rate: 1_000_000.0,
    synth_burst: 10_000_000,
    daily_chars: 1_000_000_000,
    org_synth_rate: 0.0,
    org_synth_burst: 0,
    max_queue: Duration::ZERO,
    max_strikes: 0,
    max_refused: 0,
    max_buckets: 0,
    max_streams: 1_000,
    auth_failure_rate: 0.0,
    auth_failure_burst: 0,
    max_message_bytes: 0,
    max_context_id_bytes: 0,
    max_contexts: 0,
    max_connections: 0,
    header_timeout: Duration::ZERO,
    body_timeout: Duration::ZERO,
};

/// One plan: the quotas of each budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub connections: Quota,
    /// Characters: per second (with its burst), and per day, charged
    /// together with the organization's ceiling, all or nothing.
    pub synthesis: Policy,
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
            && limits.daily_chars <= bounds.daily_chars
            && limits.max_streams <= bounds.max_streams;
        // From below too: a rate typed wrong (1e-10/s) would leave every
        // customer's bucket empty for centuries. A burst must refill within
        // a day, as the daily quota does.
        let refills_in_a_day = |burst: u64, rate: f64| rate > 0.0 && burst as f64 / rate <= DAY;
        if !refills_in_a_day(limits.connect_burst, limits.connect_rate)
            || !refills_in_a_day(limits.synth_burst, limits.synth_rate)
        {
            return Err(
                "quotas are bounded from below: each burst must refill within a day \
                 (burst / rate <= 86400 s)"
                    .to_owned(),
            );
        }
        if !within {
            return Err(format!(
                "quotas are bounded: connect_rate <= {}, connect_burst <= {}, \
                 synth_rate <= {}, synth_burst <= {}, daily_chars <= {}, max_streams <= {}",
                bounds.connect_rate,
                bounds.connect_burst,
                bounds.synth_rate,
                bounds.synth_burst,
                bounds.daily_chars,
                bounds.max_streams
            ));
        }
        Plan::from_limits(limits).map_err(|err| err.to_string())
    }

    /// The plan of these limits.
    pub fn from_limits(limits: &Limits) -> Result<Self, ConfigError> {
        Ok(Plan {
            connections: Quota::new(limits.connect_rate, limits.connect_burst)?,
            synthesis: Policy::new([
                Quota::new(limits.synth_rate, limits.synth_burst)?,
                Quota::new(limits.daily_chars as f64 / DAY, limits.daily_chars)?,
            ])?,
            streams: limits.max_streams,
        })
    }

    /// The per-second quota of synthesis.
    pub fn synth(&self) -> Quota {
        self.synthesis.quotas()[0]
    }

    /// The daily quota of synthesis.
    pub fn daily(&self) -> Quota {
        self.synthesis.quotas()[1]
    }

    fn to_json(&self) -> Value {
        json!({
            "connect_rate": self.connections.rate(), "connect_burst": self.connections.capacity(),
            "synth_rate": self.synth().rate(), "synth_burst": self.synth().capacity(),
            "daily_chars": self.daily().capacity(), "max_streams": self.streams,
        })
    }
}

/// The plans by name, read on every request and changed by the admin route.
#[derive(Debug)]
pub struct Plans(RwLock<BTreeMap<String, Arc<Plan>>>);

impl Plans {
    /// `free` from `limits`, and `pro` with five times the bursts and ten
    /// times the rates, streams and daily characters.
    pub fn new(limits: &Limits) -> Self {
        let free = Plan::from_limits(limits).expect("valid limits");
        let pro = Plan::from_limits(&Limits {
            connect_rate: limits.connect_rate * 10.0,
            connect_burst: limits.connect_burst * 5,
            synth_rate: limits.synth_rate * 10.0,
            synth_burst: limits.synth_burst * 5,
            daily_chars: limits.daily_chars * 10,
            max_streams: limits.max_streams * 10,
            ..*limits
        })
        .expect("valid limits");
        let plans = BTreeMap::from([
            ("free".to_owned(), Arc::new(free)),
            ("pro".to_owned(), Arc::new(pro)),
        ]);
        Plans(RwLock::new(plans))
    }

    /// Whether there is a plan called `name`.
    pub fn exists(&self, name: &str) -> bool {
        self.0.read().expect("plans lock").contains_key(name)
    }

    /// The plan called `name` now (a key table names only plans that
    /// exist, and plans are never removed).
    pub fn get(&self, name: &str) -> Arc<Plan> {
        let plans = self.0.read().expect("plans lock");
        let plan = plans.get(name).or_else(|| plans.get("free"));
        Arc::clone(plan.expect("a free plan"))
    }

    /// Replaces the plan called `name`; false (and nothing changes) if
    /// there is no such plan: the plans are fixed, their quotas are not.
    fn set(&self, name: &str, plan: Plan) -> bool {
        match self.0.write().expect("plans lock").get_mut(name) {
            Some(old) => {
                *old = Arc::new(plan);
                true
            }
            None => false,
        }
    }
}

/// `GET /admin/plans`: every plan's quotas (the token was checked first).
pub async fn list_plans(State(app): State<App>) -> Response {
    let plans = app.plans.0.read().expect("plans lock").clone();
    let plans: serde_json::Map<String, Value> = plans
        .into_iter()
        .map(|(name, plan)| (name, plan.to_json()))
        .collect();
    Json(Value::Object(plans)).into_response()
}

/// `PUT /admin/plans/{name}`: replaces a plan's quotas, live (the token
/// was checked first). `max_streams` and `daily_chars` may be left out
/// (unchanged).
pub async fn set_plan(
    State(app): State<App>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    if !app.plans.exists(&name) {
        let message = "the plans are free and pro";
        return (StatusCode::NOT_FOUND, Json(error("unknown_plan", message))).into_response();
    }
    let old = app.plans.get(&name);
    let streams = match &body["max_streams"] {
        Value::Null => Some(old.streams),
        given => given.as_u64().and_then(|n| u32::try_from(n).ok()),
    };
    let daily = match &body["daily_chars"] {
        Value::Null => Some(old.daily().capacity()),
        given => given.as_u64(),
    };
    let (
        Some(connect_rate),
        Some(connect_burst),
        Some(synth_rate),
        Some(synth_burst),
        Some(daily_chars),
        Some(max_streams),
    ) = (
        body["connect_rate"].as_f64(),
        body["connect_burst"].as_u64(),
        body["synth_rate"].as_f64(),
        body["synth_burst"].as_u64(),
        daily,
        streams,
    )
    else {
        let message = "expected connect_rate, connect_burst, synth_rate, synth_burst \
                       (and daily_chars, max_streams)";
        return (StatusCode::BAD_REQUEST, Json(error("bad_request", message))).into_response();
    };
    let limits = Limits {
        connect_rate,
        connect_burst,
        synth_rate,
        synth_burst,
        daily_chars,
        max_streams,
        ..app.limits
    };
    let plan = match Plan::bounded(&limits) {
        Ok(plan) => plan,
        Err(message) => {
            let body = Json(error("invalid_quota", &message));
            return (StatusCode::BAD_REQUEST, body).into_response();
        }
    };
    let json = plan.to_json();
    if !app.plans.set(&name, plan) {
        let message = "the plans are free and pro";
        return (StatusCode::NOT_FOUND, Json(error("unknown_plan", message))).into_response();
    }
    Json(json).into_response()
}

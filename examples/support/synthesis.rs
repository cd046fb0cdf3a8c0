//! The synthesis budget: characters charged, in one all-or-nothing
//! [`CompoundLimiter`] call, to the customer's plan (a per-second quota
//! with its burst, and a daily quota) and to the customer's
//! organization's ceiling, which all the org's customers share. A call
//! that one of them denies spends from none. `POST /v1/tts` is here too.

use super::auth::Customer;
use super::plans::Plan;
use super::{error, App, Limits};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use keyrate::layer::{declared_length, RATELIMIT, RATELIMIT_POLICY};
use keyrate::{Clock, CompoundDecision, CompoundDenial, CompoundLimiter, Now, Policy, Quota};
use serde_json::json;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The scopes of a synthesis call, in the order charged: a denial's
/// `scope` indexes this.
pub const SCOPES: [&str; 2] = ["customer", "org"];

/// The name of quota `quota` of scope `scope`, in error frames, metrics
/// and `RateLimit` fields.
pub fn quota_name(scope: usize, quota: usize) -> &'static str {
    match (scope, quota) {
        (0, 0) => "synthesis",
        (0, _) => "synthesis_daily",
        _ => "org",
    }
}

/// Every customer's and organization's synthesis buckets.
#[derive(Debug)]
pub struct Synthesis {
    limiter: CompoundLimiter,
    /// Every organization's ceiling.
    org: Policy,
    /// Denials for want of tokens, by the quota that bound them:
    /// per second, daily, the org's ceiling.
    denied: [AtomicU64; 3],
}

/// An admitted synthesis call.
#[derive(Debug, Clone, Copy)]
pub struct Charged {
    pub decision: CompoundDecision,
    /// The customer's least remaining over its plan's quotas, and the
    /// org's, after the call.
    pub customer: u64,
    pub org: u64,
}

impl Synthesis {
    /// # Panics
    ///
    /// If the org's ceiling in `limits` is not a valid quota.
    pub fn new(limits: &Limits, clock: impl Clock + 'static) -> Self {
        let org = Quota::new(limits.org_synth_rate, limits.org_synth_burst).expect("org ceiling");
        Synthesis {
            // Each customer and each org is one key.
            limiter: CompoundLimiter::new()
                .with_max_keys(limits.max_buckets)
                .with_clock(clock),
            org: Policy::from(org),
            denied: Default::default(),
        }
    }

    /// Charges `cost` characters to `customer` under `plan` and to its
    /// org, all or nothing, at the clock's now; a denial whose wait is
    /// within `max_queue` waits it once and tries again.
    pub async fn charge(
        &self,
        customer: &Customer,
        plan: &Plan,
        cost: u64,
        max_queue: Duration,
    ) -> Result<Charged, CompoundDenial> {
        let (id, org) = keys(customer);
        let scopes = [(id.as_str(), &plan.synthesis), (org.as_str(), &self.org)];
        let mut decided = self.limiter.check_scopes(&scopes, Now, cost);
        if let Err(CompoundDenial::InsufficientTokens { retry_after, .. }) = decided {
            if !retry_after.is_zero() && retry_after <= max_queue {
                tokio::time::sleep(retry_after).await;
                decided = self.limiter.check_scopes(&scopes, Now, cost);
            }
        }
        match decided {
            Ok(decision) => Ok(Charged {
                decision,
                customer: self.remaining(&id, &plan.synthesis),
                org: self.remaining(&org, &self.org),
            }),
            Err(denial) => {
                if let CompoundDenial::InsufficientTokens { scope, quota, .. } = denial {
                    let i = match (scope, quota) {
                        (0, 0) => 0,
                        (0, _) => 1,
                        _ => 2,
                    };
                    self.denied[i].fetch_add(1, Relaxed);
                }
                Err(denial)
            }
        }
    }

    fn remaining(&self, key: &str, policy: &Policy) -> u64 {
        self.limiter.remaining(key, policy, Now).unwrap_or(0)
    }

    /// The customer's least remaining over its plan's synthesis quotas,
    /// and its org's, now (reads only).
    pub fn remaining_of(&self, customer: &Customer, plan: &Plan) -> (u64, u64) {
        let (id, org) = keys(customer);
        (
            self.remaining(&id, &plan.synthesis),
            self.remaining(&org, &self.org),
        )
    }

    /// The denials by binding quota, as Prometheus text.
    pub fn render(&self, out: &mut String) {
        let name = "streaming_synthesis_denied_total";
        let _ = writeln!(
            out,
            "# HELP {name} Synthesis calls denied for want of tokens, by the quota that bound them."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (i, (scope, quota)) in [(0, 0), (0, 1), (1, 0)].into_iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{quota=\"{}\",scope=\"{}\"}} {}",
                quota_name(scope, quota),
                SCOPES[scope],
                self.denied[i].load(Relaxed)
            );
        }
    }

    /// `RateLimit-Policy` of a synthesis call under `plan`: each quota.
    fn policy_field(&self, plan: &Plan) -> String {
        let quotas = plan.synthesis.quotas().iter().enumerate();
        let customer = quotas.map(|(i, q)| (quota_name(0, i), *q));
        let org = self.org.quotas().iter().map(|q| (quota_name(1, 0), *q));
        customer
            .chain(org)
            .map(|(name, q)| {
                let w = q.refill_time().as_nanos().div_ceil(1_000_000_000);
                format!("\"{name}\";q={};w={w}", q.capacity())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The customer's and its org's keys in the compound limiter: distinct
/// by their prefixes, whatever the ids.
fn keys(customer: &Customer) -> (String, String) {
    (
        format!("customer:{}", customer.id),
        format!("org:{}", customer.org),
    )
}

fn secs(wait: Duration) -> u128 {
    wait.as_nanos().div_ceil(1_000_000_000)
}

fn value(text: String) -> HeaderValue {
    HeaderValue::from_str(&text).expect("visible ASCII")
}

/// `POST /v1/tts`: charges the declared body length (the
/// `DeclaredLengthLayer` in front refused a body without one, and holds
/// the body to it), all or nothing, then reads the body and synthesizes
/// it in one response (simulated). The customer was authenticated first.
pub async fn tts(
    State(app): State<App>,
    Extension(customer): Extension<Customer>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let cost = declared_length(&parts);
    let plan = app.plans.get(&customer.plan);
    let policy = value(app.synthesis.policy_field(&plan));
    let charged = app
        .synthesis
        .charge(&customer, &plan, cost, Duration::ZERO)
        .await;
    let charged = match charged {
        Ok(charged) => charged,
        Err(denial) => return refused(&denial, policy),
    };
    let limit = usize::try_from(cost).unwrap_or(usize::MAX);
    // A body that trickles in holds its connection: it has
    // `body_timeout` to arrive whole (it was charged all the same).
    let read = tokio::time::timeout(app.limits.body_timeout, axum::body::to_bytes(body, limit));
    let bytes = match read.await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            let message = "the body is not its declared length";
            return (StatusCode::BAD_REQUEST, Json(error("bad_request", message))).into_response();
        }
        Err(_) => {
            let message = "the body did not arrive in time";
            let body = Json(error("request_timeout", message));
            return (StatusCode::REQUEST_TIMEOUT, body).into_response();
        }
    };
    let characters = String::from_utf8_lossy(&bytes).chars().count();
    let decision = charged.decision;
    let name = quota_name(decision.scope(), decision.quota());
    let state = format!(
        "\"{name}\";r={};t={}",
        decision.remaining(),
        secs(decision.reset_after())
    );
    let reply = json!({
        "characters": characters,
        "customer_remaining": charged.customer,
        "org_remaining": charged.org,
    });
    let headers = [(RATELIMIT_POLICY, policy), (RATELIMIT, value(state))];
    (headers, Json(reply)).into_response()
}

/// The answer to a denied `POST /v1/tts`.
fn refused(denial: &CompoundDenial, policy: HeaderValue) -> Response {
    match *denial {
        CompoundDenial::InsufficientTokens {
            retry_after,
            scope,
            quota,
        } => {
            let wait = secs(retry_after).max(1);
            let name = quota_name(scope, quota);
            let body = json!({
                "type": "error", "code": "rate_limited", "scope": SCOPES[scope], "quota": name,
                "retry_after": retry_after.as_secs_f64(),
            });
            let headers = [
                (header::RETRY_AFTER, value(wait.to_string())),
                (RATELIMIT_POLICY, policy),
                (RATELIMIT, value(format!("\"{name}\";r=0;t={wait}"))),
            ];
            (StatusCode::TOO_MANY_REQUESTS, headers, Json(body)).into_response()
        }
        CompoundDenial::ExceedsCapacity {
            capacity,
            scope,
            quota,
            ..
        } => {
            let body = json!({
                "type": "error", "code": "exceeds_capacity", "scope": SCOPES[scope],
                "quota": quota_name(scope, quota), "capacity": capacity,
            });
            (StatusCode::PAYLOAD_TOO_LARGE, Json(body)).into_response()
        }
        ref other => {
            let retry_after = keyrate::layer::LIMITER_FULL_RETRY_AFTER.as_secs();
            let headers = [(header::RETRY_AFTER, value(retry_after.to_string()))];
            let body = Json(error("unavailable", &other.to_string()));
            (StatusCode::SERVICE_UNAVAILABLE, headers, body).into_response()
        }
    }
}

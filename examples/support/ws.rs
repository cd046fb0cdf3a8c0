//! `GET /v1/stream`: the WebSocket session of an authenticated customer,
//! its contexts and messages bounded, each budget charged per message.

use super::auth::Customer;
use super::synthesis::{quota_name, SCOPES};
use super::{error, App, POLICY_VIOLATION};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use keyrate::layer::HeldPermit;
use keyrate::{BucketHandle, CompoundDenial, Denial, Limiter, Now, Permit};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};

/// The close code for a message above the size bound (RFC 6455, 7.4.1:
/// "a message that is too big for it to process").
pub const MESSAGE_TOO_BIG: u16 = 1009;

/// `GET /v1/stream`: the layers have admitted the connection; take its
/// streams permit for the socket's life, resolve the customer's
/// connections bucket once (refused with 503 and `Retry-After` when the
/// limiter holds its maximum of buckets), then serve the socket, its
/// messages bounded by `max_message_bytes`.
pub async fn stream(
    State(app): State<App>,
    Extension(customer): Extension<Customer>,
    permit: Option<Extension<HeldPermit>>,
    ws: WebSocketUpgrade,
) -> Response {
    // Taken from the request, the permit is no longer given back with the
    // upgrade response (which ends at once): the session holds it.
    let permit = permit.and_then(|Extension(held)| held.take());
    let connections = match app.connections.try_bucket(&*customer.id) {
        Ok(handle) => handle,
        Err(denial) => {
            let retry_after = keyrate::layer::LIMITER_FULL_RETRY_AFTER.as_secs();
            let body = Json(error("unavailable", &denial.to_string()));
            let headers = [(axum::http::header::RETRY_AFTER, retry_after.to_string())];
            return (StatusCode::SERVICE_UNAVAILABLE, headers, body).into_response();
        }
    };
    let max = app.limits.max_message_bytes;
    let session = Session {
        permit,
        connections,
        customer,
        app,
        contexts: HashSet::new(),
        retry_at: None,
        strikes: 0,
        refused: 0,
    };
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| session.run(socket))
}

/// One connection: its customer's streams permit and connections
/// bucket, held for the connection's life.
struct Session {
    app: App,
    /// One of the customer's streams, given back when the session ends
    /// (the socket closed, cleanly or not, or its upgrade failed).
    permit: Option<Permit>,
    /// Spent with no map lookup on every `open`.
    connections: BucketHandle,
    /// Whose session; its plan is looked up on every message, so a
    /// change applies at once.
    customer: Customer,
    /// At most `max_contexts`, each id at most `max_context_id_bytes`.
    contexts: HashSet<String>,
    /// When the last denial said the client could retry (on the clock).
    retry_at: Option<Duration>,
    /// Denials in a row that arrived before `retry_at`.
    strikes: u32,
    /// Messages refused in a row without spending any budget (malformed,
    /// an unknown or existing context, an id too long, too many contexts,
    /// a cost above the capacity): free work for the server, so at most
    /// `max_refused` in a row before the connection is closed.
    refused: u32,
}

/// What the session does after a message.
enum Next {
    Reply(Value),
    Close(Value, CloseFrame),
}

/// A budget's answer to one message.
enum Outcome {
    Admitted(Value),
    /// For want of tokens: the wait, and what to say of it.
    Wait(Duration, Value),
    Refused(Value),
}

impl Session {
    async fn run(mut self, mut socket: WebSocket) {
        while let Some(received) = socket.recv().await {
            let text = match received {
                Ok(Message::Text(text)) => text,
                Ok(Message::Close(_)) => break,
                // Pings are answered by axum; binary frames are not used.
                Ok(_) => continue,
                Err(err) => {
                    let too_big = err.into_inner().downcast_ref::<WsError>().is_some_and(|e| {
                        matches!(e, WsError::Capacity(CapacityError::MessageTooLong { .. }))
                    });
                    if too_big {
                        let reason = format!(
                            "a message is at most {} bytes",
                            self.app.limits.max_message_bytes
                        );
                        let frame = CloseFrame {
                            code: MESSAGE_TOO_BIG,
                            reason: reason.into(),
                        };
                        let _ = socket.send(Message::Close(Some(frame))).await;
                    }
                    break;
                }
            };
            let (reply, close) = match self.handle(text.as_str()).await {
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
            return self.refuse(error("bad_request", "expected a JSON object"));
        };
        let context = request["context_id"].as_str().unwrap_or("");
        let limits = self.app.limits;
        if context.len() > limits.max_context_id_bytes {
            let message = format!(
                "a context_id is at most {} bytes",
                limits.max_context_id_bytes
            );
            return self.refuse(error("context_id_too_long", &message));
        }
        let context = context.to_owned();
        let plan = self.app.plans.get(&self.customer.plan);
        let (budget, cost, outcome) = match request["type"].as_str() {
            Some("open") if self.contexts.contains(&context) => {
                return self.refuse(error("context_exists", "this context is open already"));
            }
            Some("open") if self.contexts.len() >= limits.max_contexts => {
                let message = format!(
                    "at most {} contexts are open at once on a stream: close one first",
                    limits.max_contexts
                );
                return self.refuse(error("too_many_contexts", &message));
            }
            Some("open") => {
                let decision =
                    Limiter::check(&self.connections.under(&plan.connections), &(), Now, 1);
                let outcome = match decision {
                    Ok(decision) => {
                        self.contexts.insert(context.clone());
                        Outcome::Admitted(json!({
                            "type": "context_opened", "context_id": context,
                            "remaining": decision.remaining(),
                        }))
                    }
                    Err(denial) => connections_denied(&denial),
                };
                ("connections", 1, outcome)
            }
            Some("speak") if self.contexts.contains(&context) => {
                let text = request["text"].as_str().unwrap_or("");
                let cost = text.chars().count() as u64;
                let synthesis = &self.app.synthesis;
                let charged = synthesis
                    .charge(&self.customer, &plan, cost, limits.max_queue)
                    .await;
                let outcome = match charged {
                    Ok(charged) => Outcome::Admitted(json!({
                        "type": "audio", "context_id": context, "characters": cost,
                        "remaining": charged.decision.remaining(),
                        "customer_remaining": charged.customer, "org_remaining": charged.org,
                    })),
                    Err(denial) => synthesis_denied(&denial),
                };
                ("synthesis", cost, outcome)
            }
            Some("close") if self.contexts.remove(&context) => {
                // Free, but one per open, which was charged.
                self.refused = 0;
                return Next::Reply(json!({ "type": "context_closed", "context_id": context }));
            }
            Some("speak" | "close") => {
                return self.refuse(error("unknown_context", "open the context first"));
            }
            _ => return self.refuse(error("bad_request", "type must be open, speak or close")),
        };
        self.decide(budget, &context, cost, outcome)
    }

    /// Turns a budget's outcome into the reply, counting strikes.
    fn decide(&mut self, budget: &str, context: &str, cost: u64, outcome: Outcome) -> Next {
        let with = |mut reply: Value| {
            reply["budget"] = json!(budget);
            reply["context_id"] = json!(context);
            reply["cost"] = json!(cost);
            reply
        };
        let (retry_after, reply) = match outcome {
            Outcome::Admitted(reply) => {
                self.strikes = 0;
                self.retry_at = None;
                self.refused = 0;
                return Next::Reply(reply);
            }
            Outcome::Refused(reply) => return self.refuse(with(reply)),
            Outcome::Wait(retry_after, reply) => (retry_after, with(reply)),
        };
        let now = self.app.clock.now();
        if self.retry_at.is_some_and(|at| now < at) {
            self.strikes += 1;
        }
        self.retry_at = Some(now + retry_after);
        let max_strikes = self.app.limits.max_strikes;
        let mut reply = reply;
        reply["type"] = json!("error");
        reply["code"] = json!("rate_limited");
        reply["retry_after"] = json!(retry_after.as_secs_f64());
        // Rounded up.
        reply["retry_after_ms"] = json!(retry_after.as_nanos().div_ceil(1_000_000) as u64);
        reply["strikes"] = json!(self.strikes);
        reply["max_strikes"] = json!(max_strikes);
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

impl Session {
    /// A refusal that spent no budget: the reply, and the connection
    /// closed (1008) at the `max_refused`-th in a row. Each admitted
    /// message buys at most `max_refused - 1` refusals, so a flood of
    /// messages that cost nothing (each up to `max_message_bytes` of JSON
    /// parsed) is bounded by the budgets too.
    fn refuse(&mut self, reply: Value) -> Next {
        self.refused = self.refused.saturating_add(1);
        let max = self.app.limits.max_refused;
        if self.refused < max {
            return Next::Reply(reply);
        }
        let frame = CloseFrame {
            code: POLICY_VIOLATION,
            reason: format!("{max} messages in a row refused").into(),
        };
        Next::Close(reply, frame)
    }
}

fn connections_denied(denial: &Denial) -> Outcome {
    match *denial {
        Denial::InsufficientTokens { retry_after } => Outcome::Wait(retry_after, json!({})),
        Denial::ExceedsCapacity { capacity, .. } => Outcome::Refused(
            json!({ "type": "error", "code": "exceeds_capacity", "capacity": capacity }),
        ),
        ref other => Outcome::Refused(error("unavailable", &other.to_string())),
    }
}

fn synthesis_denied(denial: &CompoundDenial) -> Outcome {
    match *denial {
        CompoundDenial::InsufficientTokens {
            retry_after,
            scope,
            quota,
        } => {
            let which = json!({ "scope": SCOPES[scope], "quota": quota_name(scope, quota) });
            Outcome::Wait(retry_after, which)
        }
        CompoundDenial::ExceedsCapacity {
            capacity,
            scope,
            quota,
            ..
        } => Outcome::Refused(json!({
            "type": "error", "code": "exceeds_capacity", "capacity": capacity,
            "scope": SCOPES[scope], "quota": quota_name(scope, quota),
        })),
        ref other => Outcome::Refused(error("unavailable", &other.to_string())),
    }
}

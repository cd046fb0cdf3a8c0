#![cfg(not(loom))]
//! The example server's synthesis budget as a compound limit (issue 22):
//! each call charges the customer's plan (per second, with its burst, and
//! per day) and its organization's ceiling, all or nothing. Real sockets
//! over loopback (harness: `tests/server_support/`).

mod server_support;

use serde_json::{json, Value};
use server_support::streaming_app::Limits;
use server_support::*;
use std::time::Duration;
use tokio_tungstenite::tungstenite::http::StatusCode;

async fn speak(socket: &mut Socket, text: &str) -> Value {
    frame(
        send(
            socket,
            json!({"type": "speak", "context_id": "c", "text": text}),
        )
        .await,
    )
}

async fn open(server: &Server, key: &str) -> Socket {
    let (mut socket, _) = server.connect(key).await.unwrap();
    let reply = frame(send(&mut socket, json!({"type": "open", "context_id": "c"})).await);
    assert_eq!(reply["type"], "context_opened", "{reply}");
    socket
}

#[tokio::test]
async fn two_keys_of_one_org_share_its_ceiling_and_a_denial_spends_nothing() {
    let server = start().await;
    let burst = LIMITS.synth_burst; // 300 each
    let ceiling = LIMITS.org_synth_burst; // 400 for the org
    let mut a = open(&server, "acme_a").await;
    let mut b = open(&server, "acme_b").await;

    let reply = speak(&mut a, &"a".repeat(burst as usize)).await;
    assert_eq!(reply["type"], "audio", "{reply}");
    assert_eq!(reply["customer_remaining"], 0);
    assert_eq!(reply["org_remaining"], ceiling - burst);

    // acme_b has its whole burst, but the org has 100 left: 200 is denied
    // by the org's ceiling, with the org's exact wait.
    let reply = speak(&mut b, &"b".repeat(200)).await;
    assert_eq!(reply["code"], "rate_limited", "{reply}");
    assert_eq!(
        (&reply["scope"], &reply["quota"]),
        (&json!("org"), &json!("org"))
    );
    assert_eq!(reply["retry_after"], 100.0 / LIMITS.org_synth_rate);
    // ... and spent nothing: its own bucket is whole, the org's 100 too.
    let plan = server.app.plans.get("free");
    let customer = server.app.keys.customer("acme_b").unwrap();
    let remaining = server.app.synthesis.remaining_of(customer, &plan);
    assert_eq!(remaining, (burst, ceiling - burst));
    let reply = speak(&mut b, &"b".repeat(100)).await;
    assert_eq!(reply["type"], "audio", "{reply}");
    assert_eq!(reply["customer_remaining"], burst - 100);
    assert_eq!(reply["org_remaining"], 0);

    // Over HTTP too: the org is empty, acme_b's own bucket is not.
    let response = server.tts("acme_b", "hello").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "ratelimit"), "\"org\";r=0;t=1");
    let body = body_json(response).await;
    assert_eq!(body["scope"], "org");

    // Another org is untouched.
    let mut other = open(&server, "agent").await;
    let reply = speak(&mut other, &"o".repeat(burst as usize)).await;
    assert_eq!(reply["type"], "audio", "{reply}");
    assert_eq!(reply["org_remaining"], ceiling - burst);

    let text = server.scrape().await;
    let series = r#"streaming_synthesis_denied_total{quota="org",scope="org"}"#;
    assert_eq!(sample(&text, series), Some(2.0), "{text}");
}

#[tokio::test]
async fn the_daily_quota_binds_when_the_burst_has_refilled() {
    let limits = Limits {
        daily_chars: 500,
        ..LIMITS
    };
    let server = start_with(limits, None).await;
    let burst = LIMITS.synth_burst;
    let mut socket = open(&server, "agent").await;
    let reply = speak(&mut socket, &"a".repeat(burst as usize)).await;
    assert_eq!(reply["type"], "audio", "{reply}");

    // The per-second bucket and the org's are full again after 4 s; the
    // day's has 200 and a sliver left.
    server.clock.advance(Duration::from_secs(4));
    let reply = speak(&mut socket, &"a".repeat(burst as usize)).await;
    assert_eq!(reply["code"], "rate_limited", "{reply}");
    assert_eq!(
        (&reply["scope"], &reply["quota"]),
        (&json!("customer"), &json!("synthesis_daily"))
    );
    // The wait is the day's: 100 characters short, less 4 s of refill.
    let per_char = 86_400.0 / 500.0;
    let wait = reply["retry_after"].as_f64().unwrap();
    assert!((wait - (100.0 * per_char - 4.0)).abs() < 1e-6, "{wait}");
    // 200 still fit: the denial spent nothing.
    let reply = speak(&mut socket, &"a".repeat(200)).await;
    assert_eq!(reply["type"], "audio", "{reply}");
    assert_eq!(reply["remaining"], 0);
}

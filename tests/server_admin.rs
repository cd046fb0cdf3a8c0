#![cfg(not(loom))]
//! The example server's plans and admin routes over loopback: each plan
//! its own quotas, changed live; every admin route behind the configured
//! token, checked before the body; bounded quotas; no admin routes
//! without a token (harness: `tests/server_support/`).

mod server_support;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use server_support::*;
use std::time::Duration;
use tokio_tungstenite::tungstenite::http::StatusCode;

#[tokio::test]
async fn plans_get_their_own_bursts_and_change_live() {
    let server = start().await;
    let client = client();
    let admin = |name: &str, token: &str, body: Value| {
        let request = http::Request::put(format!("http://{}/admin/plans/{name}", server.addr))
            .header("x-admin-token", token)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        within("an answer from the server", client.request(request))
    };

    // Each plan its own burst: free as LIMITS, pro five times as large.
    let free = LIMITS.connect_burst;
    assert_eq!(connections_admitted(&server, "sk_free_1").await, free);
    assert_eq!(connections_admitted(&server, "sk_pro_1").await, 5 * free);
    let (_, response) = server.connect("sk_pro_2").await.unwrap();
    let pro_policy = policy("connections", 5 * free, 10.0 * LIMITS.connect_rate);
    assert_eq!(header(&response, "ratelimit-policy"), pro_policy);

    // A wrong admin token changes nothing; a bad quota is refused.
    let doubled = json!({
        "connect_rate": LIMITS.connect_rate, "connect_burst": 2 * free,
        "synth_rate": LIMITS.synth_rate, "synth_burst": LIMITS.synth_burst,
    });
    let response = admin("free", "wrong", doubled.clone()).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let mut bad = doubled.clone();
    bad["connect_burst"] = json!(0);
    let response = admin("free", ADMIN_TOKEN, bad).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(connections_admitted(&server, "sk_free_1").await, 0);

    // Double the free burst, live. sk_free_1 spent its whole burst at the
    // same instant: it misses `free` tokens' time, which is half of the new
    // bucket, so it gets `free` more at once; a new free key gets 2 * free.
    let response = admin("free", ADMIN_TOKEN, doubled).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(connections_admitted(&server, "sk_free_1").await, free);
    assert_eq!(connections_admitted(&server, "sk_free_2").await, 2 * free);
    let (_, response) = {
        server.clock.advance(Duration::from_secs(3600));
        server.connect("sk_free_1").await.unwrap()
    };
    let free_policy = policy("connections", 2 * free, LIMITS.connect_rate);
    assert_eq!(header(&response, "ratelimit-policy"), free_policy);
}

#[tokio::test]
async fn every_admin_route_needs_the_token_checked_before_the_body() {
    let server = start().await;
    let client = client();
    let send = |method: &str, path: &str, token: Option<&str>, body: &'static str| {
        within(
            "an answer from the server",
            client.request(admin_request(&server, method, path, token, body)),
        )
    };
    let plan = r#"{"connect_rate":1,"connect_burst":5,"synth_rate":500,"synth_burst":2000}"#;

    // Listing the plans needs the token too.
    for token in [
        None,
        Some("wrong"),
        Some(&ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1]),
    ] {
        let response = send("GET", "/admin/plans", token, "").await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    // Each was a failed authentication of this address, and it has none
    // left: the right token gets 429 until they refill, so that a guess
    // cannot tell a hit.
    assert_eq!(LIMITS.auth_failure_burst, 3);
    let response = send("GET", "/admin/plans", Some(ADMIN_TOKEN), "")
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    server.clock.advance(REFILLED);
    let response = send("GET", "/admin/plans", Some(ADMIN_TOKEN), "")
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let plans: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(plans["free"]["connect_burst"], LIMITS.connect_burst);

    // A wrong token is refused before the body is looked at: a body that
    // is not JSON, or too large to read, still gets 401.
    let response = send("PUT", "/admin/plans/free", Some("wrong"), "not json")
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let huge = admin_request(
        &server,
        "PUT",
        "/admin/plans/free",
        None,
        "x".repeat(1 << 20),
    );
    assert_eq!(
        within("an answer from the server", client.request(huge))
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );
    // With the token, the body is read: too large is refused, bad JSON too
    // (the two failures above left this address one).
    let huge = "x".repeat(1 << 20);
    let huge = admin_request(&server, "PUT", "/admin/plans/free", Some(ADMIN_TOKEN), huge);
    assert_eq!(
        within("an answer from the server", client.request(huge))
            .await
            .unwrap()
            .status(),
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let response = send("PUT", "/admin/plans/free", Some(ADMIN_TOKEN), "not json")
        .await
        .unwrap();
    assert!(response.status().is_client_error());

    // Only the plans that exist can be changed.
    let response = send("PUT", "/admin/plans/enterprise", Some(ADMIN_TOKEN), plan)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = send("GET", "/admin/plans", Some(ADMIN_TOKEN), "")
        .await
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let plans: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(plans.as_object().unwrap().len(), 2, "{plans}");

    // Quotas are bounded.
    let unbounded =
        r#"{"connect_rate":1,"connect_burst":5,"synth_rate":500,"synth_burst":1000000000000}"#;
    let response = send("PUT", "/admin/plans/free", Some(ADMIN_TOKEN), unbounded)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let daily = r#"{"connect_rate":1,"connect_burst":5,"synth_rate":500,"synth_burst":2000,"daily_chars":1000000001}"#;
    let response = send("PUT", "/admin/plans/free", Some(ADMIN_TOKEN), daily)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let fast = r#"{"connect_rate":1e9,"connect_burst":5,"synth_rate":500,"synth_burst":2000}"#;
    let response = send("PUT", "/admin/plans/pro", Some(ADMIN_TOKEN), fast)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // And from below: a rate typed wrong would lock every customer out
    // for centuries (a burst of 5 at 1e-10/s refills in 1,585 years).
    for slow in [
        r#"{"connect_rate":1e-10,"connect_burst":5,"synth_rate":500,"synth_burst":2000}"#,
        r#"{"connect_rate":1,"connect_burst":5,"synth_rate":0.01,"synth_burst":2000}"#,
    ] {
        let response = send("PUT", "/admin/plans/pro", Some(ADMIN_TOKEN), slow)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{slow}");
    }
    let response = send("PUT", "/admin/plans/pro", Some(ADMIN_TOKEN), plan)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn without_an_admin_token_the_admin_routes_are_off() {
    let server = start_with(LIMITS, None).await;
    let client = client();
    let plan = r#"{"connect_rate":1,"connect_burst":50,"synth_rate":500,"synth_burst":2000}"#;
    // Not even the old default token opens them.
    for token in [None, Some("admin-secret"), Some("")] {
        let list = admin_request(&server, "GET", "/admin/plans", token, "");
        assert_eq!(
            within("an answer from the server", client.request(list))
                .await
                .unwrap()
                .status(),
            StatusCode::NOT_FOUND
        );
        let set = admin_request(&server, "PUT", "/admin/plans/free", token, plan);
        assert_eq!(
            within("an answer from the server", client.request(set))
                .await
                .unwrap()
                .status(),
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(
        connections_admitted(&server, "sk_free_1").await,
        LIMITS.connect_burst
    );
}

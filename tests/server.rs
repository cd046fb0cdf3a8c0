#![cfg(not(loom))]
//! The streaming endpoint end to end over loopback sockets: budgets,
//! strikes, streams, the bucket cap. The harness is in
//! `tests/server_support/`; the plans and admin routes are in
//! `tests/server_admin.rs`, the security bounds in
//! `tests/server_security.rs`, the compound synthesis budget in
//! `tests/server_compound.rs`.

mod server_support;

use axum::body::Bytes;
use futures_util::StreamExt;
use http_body_util::Full;
use serde_json::json;
use server_support::streaming_app::{Limits, POLICY_VIOLATION};
use server_support::*;
use std::time::Duration;
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::MaybeTlsStream;

#[tokio::test]
async fn call_start_burst_is_admitted_then_denied_until_the_refill() {
    let server = start().await;
    let burst = LIMITS.connect_burst;
    let token = 1.0 / LIMITS.connect_rate;

    // The connection spends one token; the upgrade response says so.
    let (mut socket, response) = server.connect("agent").await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let state = format!("\"connections\";r={};t={}", burst - 1, ceil(token));
    assert_eq!(header(&response, "ratelimit"), state);
    let expected_policy = policy("connections", burst, LIMITS.connect_rate);
    assert_eq!(header(&response, "ratelimit-policy"), expected_policy);

    // The rest of the burst: contexts opened back-to-back, all admitted.
    for n in 1..burst {
        let open = json!({"type": "open", "context_id": format!("c{n}")});
        let reply = frame(send(&mut socket, open).await);
        assert_eq!(reply["type"], "context_opened", "{reply}");
        assert_eq!(reply["context_id"], format!("c{n}"));
        assert_eq!(reply["remaining"], burst - 1 - n);
    }
    // One more: a structured error frame with the exact wait.
    let reply = frame(send(&mut socket, json!({"type": "open", "context_id": "extra"})).await);
    assert_eq!(reply["type"], "error");
    assert_eq!(reply["code"], "rate_limited");
    assert_eq!(reply["budget"], "connections");
    assert_eq!(reply["context_id"], "extra");
    assert_eq!(reply["retry_after"], token);
    assert_eq!(reply["retry_after_ms"], (token * 1000.0) as u64);
    assert_eq!(reply["strikes"], 0);

    // A second connection for the same key is refused at the HTTP level.
    let refused = server.connect("agent").await.unwrap_err();
    let WsError::Http(refused) = refused else {
        panic!("expected an HTTP refusal, got {refused}");
    };
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), ceil(token).to_string());
    let state = format!("\"connections\";r=0;t={}", ceil(token));
    assert_eq!(header(&refused, "ratelimit"), state);
    assert_eq!(header(&refused, "ratelimit-policy"), expected_policy);

    // After the wait the same socket is admitted again.
    server.clock.advance(Duration::from_millis(
        reply["retry_after_ms"].as_u64().unwrap(),
    ));
    let reply = frame(send(&mut socket, json!({"type": "open", "context_id": "extra"})).await);
    assert_eq!(reply["type"], "context_opened", "{reply}");
    assert_eq!(reply["remaining"], 0);

    // Synthesis has its own budget, charged by characters.
    let text = "a".repeat(LIMITS.synth_burst as usize);
    let speak = json!({"type": "speak", "context_id": "extra", "text": text});
    let reply = frame(send(&mut socket, speak).await);
    assert_eq!(reply["type"], "audio", "{reply}");
    assert_eq!(reply["characters"], LIMITS.synth_burst);
    assert_eq!(reply["remaining"], 0);
    let speak = json!({"type": "speak", "context_id": "extra", "text": "hello"});
    let reply = frame(send(&mut socket, speak.clone()).await);
    assert_eq!(reply["code"], "rate_limited");
    assert_eq!(reply["budget"], "synthesis");
    assert_eq!(reply["cost"], 5);
    let wait = 5.0 / LIMITS.synth_rate;
    assert_eq!(reply["retry_after"], wait);
    assert_eq!(reply["retry_after_ms"], (wait * 1000.0).ceil() as u64);
    server.clock.advance(Duration::from_millis(
        reply["retry_after_ms"].as_u64().unwrap(),
    ));
    let reply = frame(send(&mut socket, speak).await);
    assert_eq!(reply["type"], "audio", "{reply}");

    // A context never opened, and text beyond any burst.
    let reply = frame(send(&mut socket, json!({"type": "speak", "context_id": "nope"})).await);
    assert_eq!(reply["code"], "unknown_context");
    let long = "a".repeat(LIMITS.synth_burst as usize + 1);
    let speak = json!({"type": "speak", "context_id": "extra", "text": long});
    let reply = frame(send(&mut socket, speak).await);
    assert_eq!(reply["code"], "exceeds_capacity");
    assert_eq!(reply["capacity"], LIMITS.synth_burst);
    socket.close(None).await.unwrap();
}

#[tokio::test]
async fn a_key_that_keeps_hammering_is_disconnected_with_1008() {
    let server = start().await;
    let (mut socket, _) = server.connect("abuser").await.unwrap();
    let reply = frame(send(&mut socket, json!({"type": "open", "context_id": "c"})).await);
    assert_eq!(reply["type"], "context_opened");
    let text = "x".repeat(100);
    let speak = json!({"type": "speak", "context_id": "c", "text": text});

    let mut admitted = 0;
    let mut denied = 0;
    let close = loop {
        match send(&mut socket, speak.clone()).await {
            Reply::Frame(reply) if reply["type"] == "audio" => admitted += 1,
            Reply::Frame(reply) => {
                assert_eq!(reply["code"], "rate_limited", "{reply}");
                // The first denial is no strike; each one ignoring it is.
                assert_eq!(reply["strikes"], denied);
                assert_eq!(reply["max_strikes"], LIMITS.max_strikes);
                denied += 1;
                // Mid-attack, the operator's scrape counts the denials by
                // the quota that bound them, and shows no key.
                let text = server.scrape().await;
                assert!(!text.contains("abuser"), "{text}");
                let series =
                    r#"streaming_synthesis_denied_total{quota="synthesis",scope="customer"}"#;
                assert_eq!(sample(&text, series), Some(denied as f64), "{text}");
                let series = r#"streaming_synthesis_denied_total{quota="org",scope="org"}"#;
                assert_eq!(sample(&text, series), Some(0.0));
            }
            Reply::Closed(code, reason) => break (code, reason),
        }
        assert!(admitted + denied <= 100, "never disconnected");
    };
    assert_eq!(admitted, LIMITS.synth_burst / 100);
    assert_eq!(denied, u64::from(LIMITS.max_strikes) + 1);
    assert_eq!(close.0, POLICY_VIOLATION);
    assert!(close.1.contains("retry_after"), "{}", close.1);
    // The server has closed its side: the stream ends.
    assert!(matches!(
        within("the server's close", socket.next()).await,
        None | Some(Err(_))
    ));
}

#[tokio::test]
async fn a_client_that_honours_retry_after_is_never_disconnected() {
    let server = start().await;
    let open = json!({"type": "open", "context_id": "c"});
    let (mut polite, _) = server.connect("polite").await.unwrap();
    assert_eq!(
        frame(send(&mut polite, open.clone()).await)["type"],
        "context_opened"
    );
    // A second connection of the same key shares its buckets.
    let (mut other, _) = server.connect("polite").await.unwrap();
    assert_eq!(
        frame(send(&mut other, open).await)["type"],
        "context_opened"
    );
    let all = "y".repeat(LIMITS.synth_burst as usize);
    let big = json!({"type": "speak", "context_id": "c", "text": all});
    let small = json!({"type": "speak", "context_id": "c", "text": "z"});
    assert_eq!(frame(send(&mut polite, big.clone()).await)["type"], "audio");
    // Denied again and again, more than max_strikes times in a row, but
    // each time it waited as told: the other connection took part of the
    // refill first. No strikes, no disconnection.
    for _ in 0..=LIMITS.max_strikes * 2 {
        let reply = frame(send(&mut polite, big.clone()).await);
        assert_eq!(reply["code"], "rate_limited", "{reply}");
        assert_eq!(reply["strikes"], 0);
        let wait = reply["retry_after_ms"].as_u64().unwrap();
        server.clock.advance(Duration::from_millis(wait));
        assert_eq!(
            frame(send(&mut other, small.clone()).await)["type"],
            "audio"
        );
    }
}

/// The seconds until a daily bucket that was charged `spent` characters
/// at once is full again.
fn daily_refill(spent: u64) -> u64 {
    (spent * 86_400).div_ceil(LIMITS.daily_chars)
}

#[tokio::test]
async fn http_requests_get_401_429_with_headers_and_recover() {
    let server = start().await;
    let client = client();
    let url = format!("http://{}/v1/tts", server.addr);
    let post = |key: Option<&str>, body: String| {
        let mut request = http::Request::post(url.as_str());
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        within(
            "an answer from the server",
            client.request(request.body(Full::new(Bytes::from(body))).unwrap()),
        )
    };
    // Every quota of the call: the customer's per second and per day, and
    // the org's ceiling.
    let expected_policy = format!(
        "{}, \"synthesis_daily\";q={};w=86400, {}",
        policy("synthesis", LIMITS.synth_burst, LIMITS.synth_rate),
        LIMITS.daily_chars,
        policy("org", LIMITS.org_synth_burst, LIMITS.org_synth_rate),
    );

    let response = post(None, "hello".into()).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&response, "www-authenticate"), "Bearer");

    // The binding quota is the per-second one; the call is full again when
    // the daily one is.
    let burst = LIMITS.synth_burst;
    let response = post(Some("http-key"), "b".repeat(burst as usize))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"synthesis\";r=0;t={}", daily_refill(burst))
    );
    assert_eq!(header(&response, "ratelimit-policy"), expected_policy);
    let body = body_json(response).await;
    assert_eq!(body["characters"], burst);
    assert_eq!(body["customer_remaining"], 0);
    assert_eq!(body["org_remaining"], LIMITS.org_synth_burst - burst);

    let cost = 50;
    let wait = cost as f64 / LIMITS.synth_rate;
    let response = post(Some("http-key"), "c".repeat(cost)).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "retry-after"), ceil(wait).to_string());
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"synthesis\";r=0;t={}", ceil(wait))
    );
    assert_eq!(header(&response, "ratelimit-policy"), expected_policy);
    let body = body_json(response).await;
    assert_eq!(
        (&body["scope"], &body["quota"]),
        (&json!("customer"), &json!("synthesis"))
    );

    server
        .clock
        .advance(Duration::from_millis((wait * 1000.0).ceil() as u64));
    let response = post(Some("http-key"), "c".repeat(cost)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The daily bucket's time until full, less the half second passed.
    let until_full = (daily_refill(burst + cost as u64) * 2 - 1).div_ceil(2);
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"synthesis\";r=0;t={until_full}")
    );

    // Bearer works too; another customer has its own budget.
    let request = http::Request::post(url.as_str())
        .header("authorization", "Bearer other-key")
        .body(Full::new(Bytes::from("hi")))
        .unwrap();
    let response = within("an answer from the server", client.request(request))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"synthesis\";r={};t={}", burst - 2, daily_refill(2))
    );

    let response = post(Some("http-key"), "d".repeat(burst as usize + 1))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // A key header above the bound: 431, before anything is spent.
    let response = post(Some(&"k".repeat(10_000)), "hi".into()).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );

    // One denial for want of tokens, by the quota that bound it (the 413
    // is none: it spent nothing), and no key in the scrape.
    let text = server.scrape().await;
    for (quota, scope, count) in [
        ("synthesis", "customer", 1.0),
        ("synthesis_daily", "customer", 0.0),
        ("org", "org", 0.0),
    ] {
        let series =
            format!(r#"streaming_synthesis_denied_total{{quota="{quota}",scope="{scope}"}}"#);
        assert_eq!(sample(&text, &series), Some(count), "{series}\n{text}");
    }
    assert!(
        !text.contains("http-key") && !text.contains("other-key"),
        "{text}"
    );
}

#[tokio::test]
async fn at_the_bucket_cap_new_keys_get_503_with_retry_after() {
    let limits = Limits {
        max_buckets: 2,
        ..LIMITS
    };
    let server = start_with(limits, None).await;
    let (_first, _) = server.connect("first").await.unwrap();
    let (_second, _) = server.connect("second").await.unwrap();
    let refused = server.connect("third").await.unwrap_err();
    let WsError::Http(refused) = refused else {
        panic!("expected an HTTP refusal, got {refused}");
    };
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&refused, "retry-after"), "1");
    // The keys that hold buckets are unaffected.
    let (mut socket, _) = server.connect("first").await.unwrap();
    let reply = frame(send(&mut socket, json!({"type": "open", "context_id": "c"})).await);
    assert_eq!(reply["type"], "context_opened", "{reply}");
}

#[tokio::test]
async fn a_free_keys_third_stream_is_refused_until_one_closes() {
    let server = start().await;
    let (mut first, _) = server.connect("sk_free_s").await.unwrap();
    let (_second, _) = server.connect("sk_free_s").await.unwrap();

    // The third is refused by the streams limit, spending no connection
    // token: no rate-limit fields, the limit in X-Concurrency-Limit.
    let refused = refusal(server.connect("sk_free_s").await.unwrap_err());
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "x-concurrency-limit"), "2");
    assert_eq!(header(&refused, "x-concurrency-held"), "2");
    assert!(refused.headers().get("ratelimit").is_none());
    assert!(refused.headers().get("retry-after").is_none());

    // A pro key has 20: a third stream of its own is admitted.
    let pro: Vec<_> = futures_util::future::join_all((0..3).map(|_| server.connect("sk_pro_s")))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(server.streams_in_flight(5).await);

    // Closing one (a close frame) lets the next in, once the server has
    // seen the close.
    first.close(None).await.unwrap();
    assert!(server.streams_in_flight(4).await);
    let (mut next, _) = server.connect("sk_free_s").await.unwrap();
    let reply = frame(send(&mut next, json!({"type": "open", "context_id": "c"})).await);
    assert_eq!(reply["type"], "context_opened", "{reply}");

    // The scrape: the streams in flight, the refusal, and no key.
    let text = server.scrape().await;
    assert_eq!(sample(&text, STREAMS_IN_FLIGHT), Some(5.0), "{text}");
    let refused = r#"keyrate_concurrency_refused_total{limiter="streams",reason="at_limit"}"#;
    assert_eq!(sample(&text, refused), Some(1.0), "{text}");
    let status = r#"keyrate_http_responses_total{limiter="streams",status="429"}"#;
    assert_eq!(sample(&text, status), Some(1.0), "{text}");
    assert!(!text.contains("sk_free_s") && !text.contains("sk_pro_s"));
    // The refused upgrade never reached the connections budget: six
    // upgrades spent a token (two free, three pro, the next), none was
    // refused for it.
    let connections = |status: &str| {
        let series =
            format!(r#"keyrate_http_responses_total{{limiter="connections",status="{status}"}}"#);
        sample(&text, &series)
    };
    assert_eq!(
        (connections("200"), connections("429")),
        (Some(6.0), Some(0.0))
    );
    drop(pro);
}

#[tokio::test]
async fn a_client_killed_abruptly_gets_its_permit_back() {
    let server = start().await;
    let (killed, _) = server.connect("sk_free_k").await.unwrap();
    let (_kept, _) = server.connect("sk_free_k").await.unwrap();
    let refused = refusal(server.connect("sk_free_k").await.unwrap_err());
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // The client dies: its TCP stream goes, with no close frame.
    let tcp = match killed.into_inner() {
        MaybeTlsStream::Plain(tcp) => tcp,
        _ => unreachable!("ws:// is plain TCP"),
    };
    drop(tcp);

    // The server sees the socket end and gives the stream's permit back.
    assert!(server.streams_in_flight(1).await);
    let (mut next, _) = server.connect("sk_free_k").await.unwrap();
    let reply = frame(send(&mut next, json!({"type": "open", "context_id": "c"})).await);
    assert_eq!(reply["type"], "context_opened", "{reply}");
}

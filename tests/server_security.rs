#![cfg(not(loom))]
//! The example server is safe to copy: keys are authenticated before they
//! are limited (and failed attempts are limited per address), the plan
//! comes from the key table, `/metrics` needs its token and shows no key,
//! WebSocket input is bounded, and a chunked upload is not synthesized for
//! free. Real sockets over loopback (harness: `tests/server_support/`).

mod server_support;

use serde_json::json;
use server_support::streaming_app::{Limits, MESSAGE_TOO_BIG};
use server_support::*;
use std::time::Duration;
use tokio_tungstenite::tungstenite::http::StatusCode;

#[tokio::test]
async fn unknown_keys_get_401_then_the_address_gets_429() {
    let server = start().await;
    // Each guess is a failed authentication of this address: 401 while it
    // has failures left (no key is a failure too).
    for n in 0..LIMITS.auth_failure_burst {
        let response = server.tts(&format!("sk_guess_{n}"), "hi").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "guess {n}");
        assert_eq!(header(&response, "www-authenticate"), "Bearer");
    }
    // Then 429, whatever the key: a right one too, so that a guess cannot
    // tell a hit while the address is throttled.
    let wait = 1.0 / LIMITS.auth_failure_rate;
    for key in ["sk_guess_x", "http-key"] {
        let response = server.tts(key, "hi").await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{key}");
        assert_eq!(header(&response, "retry-after"), ceil(wait).to_string());
        let body = body_json(response).await;
        assert_eq!(body["code"], "too_many_failed_authentications");
    }
    let refused = refusal(server.connect("agent").await.unwrap_err());
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // After the wait, one more attempt: a right key is served, and spent
    // nothing of the address's failures.
    server.clock.advance(Duration::from_secs_f64(wait));
    let response = server.tts("http-key", "hi").await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = server.tts("sk_guess_y", "hi").await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = server.tts("http-key", "hi").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);

    // The scrape counts the failures by address (a fingerprint), and no
    // guessed key reached a limiter or the scrape. (It comes from the same
    // address, which is out of failures: it would get 429 with the right
    // token too, so its failures refill first.)
    server.clock.advance(REFILLED);
    let text = server.scrape().await;
    assert!(!text.contains("sk_guess"), "{text}");
    let series = format!(
        r#"keyrate_offender_denials{{key="{}",limiter="auth_failures"}}"#,
        label("127.0.0.1")
    );
    assert_eq!(sample(&text, &series), Some(4.0), "{text}");
    let series = r#"keyrate_buckets{limiter="connections"}"#;
    assert_eq!(sample(&text, series), Some(0.0), "{text}");
}

#[tokio::test]
async fn the_plan_comes_from_the_table_and_limits_key_customers() {
    let server = start().await;
    let free = LIMITS.connect_burst;
    // A key that looks pro is on the plan the table gives it: free; one
    // that does not is on pro.
    assert_eq!(connections_admitted(&server, "sk_pro_free").await, free);
    assert_eq!(connections_admitted(&server, "premium").await, 5 * free);

    // Two keys of one customer share its buckets: the limiters are keyed
    // by customer id, not by key.
    assert_eq!(connections_admitted(&server, "alice_laptop").await, free);
    assert_eq!(connections_admitted(&server, "alice_phone").await, 0);

    // The scrape lists offenders by their customer id's fingerprint and
    // shows no API key.
    let text = server.scrape().await;
    let series = format!(
        r#"keyrate_offender_denials{{key="{}",limiter="connections"}}"#,
        label("cust_alice")
    );
    assert_eq!(sample(&text, &series), Some(2.0), "{text}");
    for key in ["sk_pro_free", "premium", "alice_laptop", "alice_phone"] {
        assert!(!text.contains(key), "{key} in\n{text}");
    }
}

#[tokio::test]
async fn metrics_need_their_token() {
    let server = start().await;
    let client = client();
    let get = |authorization: Option<&str>| {
        let mut request = http::Request::get(format!("http://{}/metrics", server.addr));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        within(
            "an answer from the server",
            client.request(request.body(Default::default()).unwrap()),
        )
    };
    let wrong = format!("Bearer {}", &METRICS_TOKEN[1..]);
    let admin = format!("Bearer {ADMIN_TOKEN}");
    for authorization in [
        None,
        Some("Bearer "),
        Some(wrong.as_str()),
        Some(admin.as_str()),
    ] {
        // Each is a failed authentication of this address: refilled
        // first, so that every one is judged on its own (throttling is
        // the next test's).
        server.clock.advance(REFILLED);
        let response = get(authorization).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{authorization:?}"
        );
    }
    let basic = format!("Basic {METRICS_TOKEN}");
    server.clock.advance(REFILLED);
    assert_eq!(
        get(Some(&basic)).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let bearer = format!("bearer {METRICS_TOKEN}");
    assert_eq!(get(Some(&bearer)).await.unwrap().status(), StatusCode::OK);

    // With no metrics token configured, there is no /metrics.
    let clock = keyrate::ManualClock::new();
    let app = server_support::streaming_app::App::new(LIMITS, keys(), clock);
    let addr = server_support::streaming_app::spawn(&app, 0).await.unwrap();
    let request = http::Request::get(format!("http://{addr}/metrics"))
        .header("authorization", format!("Bearer {METRICS_TOKEN}"))
        .body(Default::default())
        .unwrap();
    let response = within("an answer from the server", client.request(request))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn guessed_route_tokens_share_the_address_budget_of_failures() {
    let server = start().await;
    let client = client();
    let get = |path: &str, header: (&str, String)| {
        let request = http::Request::get(format!("http://{}{path}", server.addr))
            .header(header.0, header.1)
            .body(Default::default())
            .unwrap();
        within("an answer from the server", client.request(request))
    };
    let metrics = |token: &str| get("/metrics", ("authorization", format!("Bearer {token}")));
    let admin = |token: &str| get("/admin/plans", ("x-admin-token", token.to_owned()));
    // Guesses at either token, and at API keys, spend one budget.
    let guesses = LIMITS.auth_failure_burst;
    assert!(guesses >= 3, "a guess of each kind below");
    assert_eq!(
        metrics("guess-0").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        admin("guess-1").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    for n in 2..guesses {
        let response = server.tts(&format!("sk_guess_{n}"), "hi").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "guess {n}");
    }
    // None left: 429 with the wait, even for the right tokens.
    for response in [
        metrics("guess-x").await.unwrap(),
        admin("guess-y").await.unwrap(),
        metrics(METRICS_TOKEN).await.unwrap(),
        admin(ADMIN_TOKEN).await.unwrap(),
    ] {
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            header(&response, "retry-after"),
            ceil(1.0 / LIMITS.auth_failure_rate).to_string()
        );
    }
    // Refilled, the right tokens open their routes again.
    server.clock.advance(REFILLED);
    assert_eq!(
        metrics(METRICS_TOKEN).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(admin(ADMIN_TOKEN).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn websocket_messages_context_ids_and_contexts_are_bounded() {
    let limits = Limits {
        connect_burst: 20, // room for every context below
        ..LIMITS
    };
    let server = start_with(limits, None).await;
    let (mut socket, _) = server.connect("agent").await.unwrap();

    // A context id of 64 bytes is fine; of 65, refused, and not kept.
    let longest = "c".repeat(LIMITS.max_context_id_bytes);
    let reply = frame(send(&mut socket, json!({"type": "open", "context_id": longest})).await);
    assert_eq!(reply["type"], "context_opened", "{reply}");
    let too_long = "c".repeat(LIMITS.max_context_id_bytes + 1);
    for kind in ["open", "speak", "close"] {
        let request = json!({"type": kind, "context_id": too_long, "text": "hi"});
        let reply = frame(send(&mut socket, request).await);
        assert_eq!(reply["code"], "context_id_too_long", "{kind}: {reply}");
    }
    // Opening an open context is refused, not charged twice.
    let reply = frame(send(&mut socket, json!({"type": "open", "context_id": longest})).await);
    assert_eq!(reply["code"], "context_exists", "{reply}");

    // At most 8 contexts open at once: the 9th is refused, until one closes.
    for n in 1..LIMITS.max_contexts {
        let open = json!({"type": "open", "context_id": format!("c{n}")});
        assert_eq!(
            frame(send(&mut socket, open).await)["type"],
            "context_opened"
        );
    }
    let ninth = json!({"type": "open", "context_id": "ninth"});
    let reply = frame(send(&mut socket, ninth.clone()).await);
    assert_eq!(reply["code"], "too_many_contexts", "{reply}");
    let close = json!({"type": "close", "context_id": "c1"});
    assert_eq!(
        frame(send(&mut socket, close).await)["type"],
        "context_closed"
    );
    let reply = frame(send(&mut socket, ninth).await);
    assert_eq!(reply["type"], "context_opened", "{reply}");
    // 1 connection and 9 contexts spent: the refusals spent nothing.
    assert_eq!(reply["remaining"], 20 - 10);

    // A message of the largest size is read (and refused as text too long
    // for the burst); one byte more closes the stream with 1009.
    let fits = json!({"type": "speak", "context_id": "c2", "text": ""}).to_string();
    let text = "a".repeat(LIMITS.max_message_bytes - fits.len());
    let largest = json!({"type": "speak", "context_id": "c2", "text": text}).to_string();
    assert_eq!(largest.len(), LIMITS.max_message_bytes);
    let reply = frame(send_text(&mut socket, largest).await);
    assert_eq!(reply["code"], "exceeds_capacity", "{reply}");
    let over = json!({"type": "speak", "context_id": "c2", "text": format!("{text}a")});
    match send_text(&mut socket, over.to_string()).await {
        Reply::Closed(code, reason) => {
            assert_eq!(code, MESSAGE_TOO_BIG);
            assert!(reason.contains("at most"), "{reason}");
        }
        Reply::Frame(reply) => panic!("answered {reply}"),
    }
    // The stream's permit is back.
    assert!(server.streams_in_flight(0).await);
}

/// A chunked `POST /v1/tts` of `chunks` chunks of `size` bytes, on a
/// connection that closes after it.
fn chunked_post(key: &str, chunks: usize, size: usize) -> Vec<u8> {
    let mut request = format!(
        "POST /v1/tts HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {key}\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    for _ in 0..chunks {
        request.push_str(&format!("{size:x}\r\n{}\r\n", "x".repeat(size)));
    }
    request.push_str("0\r\n\r\n");
    request.into_bytes()
}

fn declared_post(key: &str, len: usize) -> Vec<u8> {
    format!(
        "POST /v1/tts HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {key}\r\n\
         Content-Length: {len}\r\nConnection: close\r\n\r\n{}",
        "x".repeat(len)
    )
    .into_bytes()
}

#[tokio::test]
async fn a_chunked_upload_is_refused_before_it_is_charged() {
    // A 100-character bucket, and uploads of 120 bytes.
    let limits = Limits {
        synth_burst: 100,
        ..LIMITS
    };
    let server = start_with(limits, None).await;
    for _ in 0..4 {
        let (status, head) = server.raw(&chunked_post("http-key", 4, 30)).await;
        // 411 before the synthesis budget is charged: no rate-limit field.
        assert_eq!(status, 411, "{head}");
        assert!(!head.contains("ratelimit"), "{head}");
    }
    // Counted as the other refusals are, by the scrape.
    let text = server.scrape().await;
    let series = r#"keyrate_http_responses_total{limiter="tts_length",status="411"}"#;
    assert_eq!(sample(&text, series), Some(4.0), "{text}");
    // Declared, the same 120 bytes never fit; 100 fit once, in full.
    let (status, head) = server.raw(&declared_post("http-key", 120)).await;
    assert_eq!(status, 413, "{head}");
    let (status, head) = server.raw(&declared_post("http-key", 100)).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("ratelimit: \"synthesis\";r=0;"), "{head}");
    let (status, head) = server.raw(&declared_post("http-key", 1)).await;
    assert_eq!(status, 429, "{head}");
}

#![cfg(not(loom))]
//! The streaming endpoint end to end over loopback sockets: the example's
//! app on a real port, driven by a real WebSocket client
//! (tokio-tungstenite) and a real HTTP client (hyper-util). The server's
//! limiters read a manual clock that the test moves, so the test waits for
//! refills without sleeping, and every expected number follows from the
//! limits.

#[path = "../examples/support/streaming_app.rs"]
mod streaming_app;

use axum::body::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrate::ManualClock;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use streaming_app::{App, Limits, POLICY_VIOLATION};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{Response, StatusCode};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{connect_async, MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

const LIMITS: Limits = Limits {
    connect_rate: 0.5, // a connection or context every 2 s
    connect_burst: 4,
    synth_rate: 100.0, // characters per second
    synth_burst: 300,
    max_queue: Duration::ZERO, // deny at once: the clock only moves when told
    max_strikes: 3,
    max_buckets: 1000,
    max_streams: 2, // a free key's streams at once; pro: 20
};

/// The series of the streams the server holds open.
const STREAMS_IN_FLIGHT: &str = r#"keyrate_concurrency_in_flight{limiter="streams"}"#;

/// The admin token the test server is configured with.
const ADMIN_TOKEN: &str = "test-admin-token-7d1f0c2a";

struct Server {
    addr: SocketAddr,
    clock: ManualClock,
}

async fn start() -> Server {
    start_with(LIMITS, Some(ADMIN_TOKEN)).await
}

async fn start_with(limits: Limits, admin_token: Option<&str>) -> Server {
    let clock = ManualClock::new();
    let app = App::new(limits, clock.clone()).with_admin_token(admin_token);
    let addr = streaming_app::spawn(&app, 0)
        .await
        .expect("bind a loopback port");
    assert!(addr.ip().is_loopback());
    Server { addr, clock }
}

impl Server {
    /// `GET /metrics`: checks the content type, and the text with the real
    /// `promtool check metrics` when it is installed (CI installs it, and
    /// sets `CI`, which makes it required).
    async fn scrape(&self) -> String {
        let text = self.metrics().await;
        promtool_check(&text);
        text
    }

    /// `GET /metrics`, its content type checked, not linted.
    async fn metrics(&self) -> String {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let url = format!("http://{}/metrics", self.addr);
        let response = client.get(url.parse().unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header(&response, "content-type"),
            keyrate::prometheus::CONTENT_TYPE
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// Polls `/metrics` until the server holds `n` streams (it gives a
    /// permit back when it sees the socket close): true once it does,
    /// false if it still does not after a bounded number of tries.
    async fn streams_in_flight(&self, n: u64) -> bool {
        for _ in 0..500 {
            let text = self.metrics().await;
            if sample(&text, STREAMS_IN_FLIGHT) == Some(n as f64) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    async fn connect(&self, key: &str) -> Result<(Socket, Response<Option<Vec<u8>>>), WsError> {
        let mut request = format!("ws://{}/v1/stream", self.addr).into_client_request()?;
        let value = format!("Bearer {key}").parse().unwrap();
        request.headers_mut().insert("authorization", value);
        connect_async(request).await
    }
}

/// What the server answered to one frame.
#[derive(Debug)]
enum Reply {
    Frame(Value),
    Closed(u16, String),
}

async fn send(socket: &mut Socket, request: Value) -> Reply {
    let sent = socket.send(Message::text(request.to_string())).await;
    loop {
        match socket.next().await.expect("an answer") {
            Ok(Message::Text(text)) => return Reply::Frame(serde_json::from_str(&text).unwrap()),
            Ok(Message::Close(Some(frame))) => {
                return Reply::Closed(frame.code.into(), frame.reason.to_string())
            }
            Ok(Message::Close(None)) => return Reply::Closed(1005, String::new()),
            Ok(_) => continue,
            Err(err) => panic!("socket error {err} (send: {sent:?})"),
        }
    }
}

fn frame(reply: Reply) -> Value {
    match reply {
        Reply::Frame(frame) => frame,
        Reply::Closed(code, reason) => panic!("closed {code} {reason}"),
    }
}

fn header<'a, B>(response: &'a http::Response<B>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// Runs `promtool check metrics` on `text`, if promtool is installed (in
/// CI it must be).
fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(err) => {
            assert!(std::env::var_os("CI").is_none(), "CI needs promtool: {err}");
            eprintln!("promtool not found ({err}): the scrape is not linted");
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `key` label `/metrics` shows for `key`: its fingerprint (the test
/// and the server share the process's default secret).
fn label(key: &str) -> String {
    keyrate::KeyLabels::fingerprint().label(key)
}

/// The value of the series `series` (name and labels, as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
}

fn ceil(secs: f64) -> u64 {
    secs.ceil() as u64
}

fn policy(name: &str, capacity: u64, rate: f64) -> String {
    format!("\"{name}\";q={capacity};w={}", ceil(capacity as f64 / rate))
}

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
                // Mid-attack, the operator's scrape names the abuser, with
                // its exact count (one server thread: one sketch, not full).
                // By its fingerprint: the scrape never shows the key.
                let text = server.scrape().await;
                assert!(!text.contains("abuser"), "{text}");
                let series = format!(
                    r#"keyrate_offender_denials{{key="{}",limiter="synthesis"}}"#,
                    label("abuser")
                );
                assert_eq!(sample(&text, &series), Some(denied as f64), "{text}");
                let series =
                    r#"keyrate_denied_total{limiter="synthesis",reason="insufficient_tokens"}"#;
                assert_eq!(sample(&text, series), Some(denied as f64));
                let series = r#"keyrate_offenders_max_error{limiter="synthesis"}"#;
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
    assert!(matches!(socket.next().await, None | Some(Err(_))));
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

#[tokio::test]
async fn http_requests_get_401_429_with_headers_and_recover() {
    let server = start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let url = format!("http://{}/v1/tts", server.addr);
    let post = |key: Option<&str>, body: String| {
        let mut request = http::Request::post(url.as_str());
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        client.request(request.body(Full::new(Bytes::from(body))).unwrap())
    };
    let expected_policy = policy("synthesis", LIMITS.synth_burst, LIMITS.synth_rate);

    let response = post(None, "hello".into()).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&response, "www-authenticate"), "Bearer");

    let burst = LIMITS.synth_burst;
    let response = post(Some("http-key"), "b".repeat(burst as usize))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let until_full = ceil(burst as f64 / LIMITS.synth_rate);
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"synthesis\";r=0;t={until_full}")
    );
    assert_eq!(header(&response, "ratelimit-policy"), expected_policy);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["characters"], burst);

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

    server
        .clock
        .advance(Duration::from_millis((wait * 1000.0).ceil() as u64));
    let response = post(Some("http-key"), "c".repeat(cost)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"synthesis\";r=0;t={until_full}")
    );

    // Bearer works too; another key has its own budget.
    let request = http::Request::post(url.as_str())
        .header("authorization", "Bearer other-key")
        .body(Full::new(Bytes::from("hi")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"synthesis\";r={};t=1", burst - 2)
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

    // The layer counted each response by status.
    let text = server.scrape().await;
    for (status, count) in [
        ("200", 3.0),
        ("401", 1.0),
        ("413", 1.0),
        ("429", 1.0),
        ("431", 1.0),
        ("503", 0.0),
    ] {
        let series =
            format!(r#"keyrate_http_responses_total{{limiter="synthesis",status="{status}"}}"#);
        assert_eq!(sample(&text, &series), Some(count), "{series}\n{text}");
    }
    // The 413 is no offence (it spent nothing): one 429, by fingerprint.
    assert!(!text.contains("http-key"), "{text}");
    let series = format!(
        r#"keyrate_offender_denials{{key="{}",limiter="synthesis"}}"#,
        label("http-key")
    );
    assert_eq!(sample(&text, &series), Some(1.0), "{text}");
}

/// Upgrade requests in a row for `key` until one is refused; how many were
/// admitted (each spends one connection token). The sockets are closed,
/// each before the next is opened (no other stream may be open: it waits
/// until the server holds none, so the streams limit never refuses).
async fn connections_admitted(server: &Server, key: &str) -> u64 {
    let mut admitted = 0;
    loop {
        match server.connect(key).await {
            Ok((mut socket, _)) => {
                admitted += 1;
                let _ = socket.close(None).await;
                assert!(server.streams_in_flight(0).await, "a stream stays open");
            }
            Err(WsError::Http(response)) => {
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                assert!(response.headers().get("ratelimit").is_some());
                return admitted;
            }
            Err(err) => panic!("unexpected {err}"),
        }
        assert!(admitted <= 1000, "never refused");
    }
}

#[tokio::test]
async fn plans_get_their_own_bursts_and_change_live() {
    let server = start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let admin = |name: &str, token: &str, body: Value| {
        let request = http::Request::put(format!("http://{}/admin/plans/{name}", server.addr))
            .header("x-admin-token", token)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        client.request(request)
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

/// An HTTP request with an optional admin token and a raw body.
fn admin_request(
    server: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: impl Into<Bytes>,
) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", server.addr))
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("x-admin-token", token);
    }
    request.body(Full::new(body.into())).unwrap()
}

#[tokio::test]
async fn every_admin_route_needs_the_token_checked_before_the_body() {
    let server = start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let send = |method: &str, path: &str, token: Option<&str>, body: &'static str| {
        client.request(admin_request(&server, method, path, token, body))
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
        client.request(huge).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    // With the token, the body is read: too large is refused, bad JSON too.
    let huge = "x".repeat(1 << 20);
    let huge = admin_request(&server, "PUT", "/admin/plans/free", Some(ADMIN_TOKEN), huge);
    assert_eq!(
        client.request(huge).await.unwrap().status(),
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
    let fast = r#"{"connect_rate":1e9,"connect_burst":5,"synth_rate":500,"synth_burst":2000}"#;
    let response = send("PUT", "/admin/plans/pro", Some(ADMIN_TOKEN), fast)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = send("PUT", "/admin/plans/pro", Some(ADMIN_TOKEN), plan)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn without_an_admin_token_the_admin_routes_are_off() {
    let server = start_with(LIMITS, None).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let plan = r#"{"connect_rate":1,"connect_burst":50,"synth_rate":500,"synth_burst":2000}"#;
    // Not even the old default token opens them.
    for token in [None, Some("admin-secret"), Some("")] {
        let list = admin_request(&server, "GET", "/admin/plans", token, "");
        assert_eq!(
            client.request(list).await.unwrap().status(),
            StatusCode::NOT_FOUND
        );
        let set = admin_request(&server, "PUT", "/admin/plans/free", token, plan);
        assert_eq!(
            client.request(set).await.unwrap().status(),
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(
        connections_admitted(&server, "sk_free_1").await,
        LIMITS.connect_burst
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

/// How a refused upgrade answered.
fn refusal(refused: WsError) -> Response<Option<Vec<u8>>> {
    match refused {
        WsError::Http(response) => *response,
        other => panic!("expected an HTTP refusal, got {other}"),
    }
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

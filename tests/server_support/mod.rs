//! The harness of the example server's loopback tests: the app on a real
//! port, a real WebSocket client (tokio-tungstenite) and real HTTP clients
//! (hyper-util, and raw TCP for what hyper's client will not send). The
//! server's limiters read a manual clock that the test moves, so the test
//! waits for refills without sleeping, and every expected number follows
//! from the limits.

// Each test file uses a different part.
#![allow(dead_code)]

#[path = "../../examples/support/streaming_app.rs"]
pub mod streaming_app;

#[path = "../common/sync.rs"]
mod sync;
pub use sync::{within, PATIENCE};

use axum::body::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrate::ManualClock;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use streaming_app::{App, KeyTable, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{Response, StatusCode};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{connect_async, MaybeTlsStream, WebSocketStream};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub const LIMITS: Limits = Limits {
    connect_rate: 0.5, // a connection or context every 2 s
    connect_burst: 4,
    synth_rate: 100.0, // characters per second
    synth_burst: 300,
    daily_chars: 10_000,
    org_synth_rate: 100.0,
    org_synth_burst: 400,      // a customer's burst and a third
    max_queue: Duration::ZERO, // deny at once: the clock only moves when told
    max_strikes: 3,
    max_refused: 8,
    max_buckets: 1000,
    max_streams: 2,         // a free customer's streams at once; pro: 20
    auth_failure_rate: 0.5, // a failed authentication every 2 s
    auth_failure_burst: 3,
    max_message_bytes: 4096,
    max_context_id_bytes: 64,
    max_contexts: 8,
    max_connections: 64,
    header_timeout: Duration::from_secs(10),
    body_timeout: Duration::from_secs(30),
};

/// The test's key table: `key customer org plan`. Most keys are their
/// own customer in their own org; the plan comes from here, whatever the
/// key looks like (`sk_pro_free` is on free, `premium` on pro).
pub const KEYS: &str = "\
agent        cust_agent    org_agent    free
abuser       cust_abuser   org_abuser   free
polite       cust_polite   org_polite   free
http-key     cust_http     org_http     free
other-key    cust_other    org_other    free
sk_free_1    cust_free_1   org_free_1   free
sk_free_2    cust_free_2   org_free_2   free
sk_pro_1     cust_pro_1    org_pro_1    pro
sk_pro_2     cust_pro_2    org_pro_2    pro
sk_pro_free  cust_sneaky   org_sneaky   free
premium      cust_premium  org_premium  pro
first        cust_first    org_first    free
second       cust_second   org_second   free
third        cust_third    org_third    free
sk_free_s    cust_s        org_s        free
sk_pro_s     cust_pro_s    org_pro_s    pro
sk_free_k    cust_k        org_k        free
alice_laptop cust_alice    org_alice    free
alice_phone  cust_alice    org_alice    free
acme_a       cust_acme_a   org_acme     free
acme_b       cust_acme_b   org_acme     free
";

/// The series of the streams the server holds open.
pub const STREAMS_IN_FLIGHT: &str = r#"keyrate_concurrency_in_flight{limiter="streams"}"#;

/// Long enough for an address's failed authentications to refill (on the
/// server's `ManualClock`).
pub const REFILLED: std::time::Duration = std::time::Duration::from_secs(3600);

/// The admin token the test server is configured with.
pub const ADMIN_TOKEN: &str = "test-admin-token-7d1f0c2a";
/// The metrics token the test server is configured with.
pub const METRICS_TOKEN: &str = "test-metrics-token-93be";

pub struct Server {
    pub addr: SocketAddr,
    pub clock: ManualClock,
    pub app: App,
}

pub async fn start() -> Server {
    start_with(LIMITS, Some(ADMIN_TOKEN)).await
}

pub fn keys() -> KeyTable {
    KeyTable::parse(KEYS, &["free", "pro"]).expect("the test's key table")
}

pub async fn start_with(limits: Limits, admin_token: Option<&str>) -> Server {
    let clock = ManualClock::new();
    let app = App::new(limits, keys(), clock.clone())
        .with_admin_token(admin_token)
        .with_metrics_token(Some(METRICS_TOKEN));
    let addr = streaming_app::spawn(&app, 0)
        .await
        .expect("bind a loopback port");
    assert!(addr.ip().is_loopback());
    Server { addr, clock, app }
}

pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>()
}

pub async fn body_json<B>(response: http::Response<B>) -> Value
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let body = within("the response body", response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&body).unwrap()
}

impl Server {
    /// `GET /metrics`: checks the content type, and the text with the real
    /// `promtool check metrics` when it is installed (CI installs it, and
    /// sets `CI`, which makes it required).
    pub async fn scrape(&self) -> String {
        let text = self.metrics().await;
        promtool_check(&text);
        text
    }

    /// `GET /metrics` with the metrics token, its content type checked,
    /// not linted.
    pub async fn metrics(&self) -> String {
        let request = http::Request::get(format!("http://{}/metrics", self.addr))
            .header("authorization", format!("Bearer {METRICS_TOKEN}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = within("GET /metrics", client().request(request))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header(&response, "content-type"),
            keyrate::prometheus::CONTENT_TYPE
        );
        let body = within("the /metrics body", response.into_body().collect())
            .await
            .unwrap()
            .to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// Polls `/metrics` until the server holds `n` streams (it gives a
    /// permit back when it sees the socket close, on its own time): true
    /// once it does, false if it still does not after [`PATIENCE`]. A
    /// deadline, not a count of tries, so that a busy machine is only
    /// slower.
    pub async fn streams_in_flight(&self, n: u64) -> bool {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let text = self.metrics().await;
            if sample(&text, STREAMS_IN_FLIGHT) == Some(n as f64) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn connect(&self, key: &str) -> Result<(Socket, Response<Option<Vec<u8>>>), WsError> {
        let mut request = format!("ws://{}/v1/stream", self.addr).into_client_request()?;
        let value = format!("Bearer {key}").parse().unwrap();
        request.headers_mut().insert("authorization", value);
        within("the WebSocket upgrade", connect_async(request)).await
    }

    /// `POST /v1/tts` with `X-API-Key: key` and a `Content-Length` body.
    pub async fn tts(
        &self,
        key: &str,
        text: &str,
    ) -> http::Response<impl http_body::Body<Error = impl std::fmt::Debug>> {
        let request = http::Request::post(format!("http://{}/v1/tts", self.addr))
            .header("x-api-key", key)
            .body(Full::new(Bytes::from(text.to_owned())))
            .unwrap();
        within("POST /v1/tts", client().request(request))
            .await
            .unwrap()
    }

    /// Sends `request` as is on a new TCP connection (it should say
    /// `Connection: close`) and returns the status and the head's lines.
    pub async fn raw(&self, request: &[u8]) -> (u16, String) {
        let mut tcp = within("a TCP connection", TcpStream::connect(self.addr))
            .await
            .unwrap();
        within("the request's write", tcp.write_all(request))
            .await
            .unwrap();
        let mut answer = Vec::new();
        // The server must answer and close: the request says
        // `Connection: close`.
        within("the answer and the close", tcp.read_to_end(&mut answer))
            .await
            .unwrap();
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let head = answer
            .split("\r\n\r\n")
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {answer:?}"));
        (status, head)
    }
}

/// What the server answered to one frame.
#[derive(Debug)]
pub enum Reply {
    Frame(Value),
    Closed(u16, String),
}

pub async fn send(socket: &mut Socket, request: Value) -> Reply {
    send_text(socket, request.to_string()).await
}

pub async fn send_text(socket: &mut Socket, text: String) -> Reply {
    let sent = within("the frame's send", socket.send(Message::text(text))).await;
    loop {
        match within("an answer to the frame", socket.next())
            .await
            .expect("an answer")
        {
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

pub fn frame(reply: Reply) -> Value {
    match reply {
        Reply::Frame(frame) => frame,
        Reply::Closed(code, reason) => panic!("closed {code} {reason}"),
    }
}

pub fn header<'a, B>(response: &'a http::Response<B>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// Runs `promtool check metrics` on `text`, if promtool is installed (in
/// CI it must be). Without it the scrape is not linted; libtest hides the
/// message below, so `scripts/test.sh` says so at the end of its run, as
/// it does for skipped Redis tests.
pub fn promtool_check(text: &str) {
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

/// The `key` label `/metrics` shows for a limiter key (a customer id):
/// its fingerprint (the test and the server share the process's default
/// secret).
pub fn label(key: &str) -> String {
    keyrate::KeyLabels::fingerprint().label(key)
}

/// The value of the series `series` (name and labels, as rendered).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
}

pub fn ceil(secs: f64) -> u64 {
    secs.ceil() as u64
}

pub fn policy(name: &str, capacity: u64, rate: f64) -> String {
    format!("\"{name}\";q={capacity};w={}", ceil(capacity as f64 / rate))
}

/// Upgrade requests in a row for `key` until one is refused; how many were
/// admitted (each spends one connection token). The sockets are closed,
/// each before the next is opened (no other stream may be open: it waits
/// until the server holds none, so the streams limit never refuses).
pub async fn connections_admitted(server: &Server, key: &str) -> u64 {
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

/// How a refused upgrade answered.
pub fn refusal(refused: WsError) -> Response<Option<Vec<u8>>> {
    match refused {
        WsError::Http(response) => *response,
        other => panic!("expected an HTTP refusal, got {other}"),
    }
}

/// An HTTP request with an optional admin token and a raw body.
pub fn admin_request(
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

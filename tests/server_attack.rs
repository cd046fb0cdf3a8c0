#![cfg(not(loom))]
//! The example server read as an attacker would, past what
//! `tests/server_security.rs` covers: a client that owns an IPv6 network
//! does not get a fresh budget of key guesses per address (the app called
//! in process with the peer address a real connection would give it:
//! loopback cannot originate from many IPv6 addresses), a WebSocket
//! flood of messages that spend no budget is closed, and connections that
//! never finish a request head are bounded in number and in time.

mod server_support;

use axum::body::Body;
use axum::extract::ConnectInfo;
use serde_json::json;
use server_support::streaming_app::auth::client_key;
use server_support::streaming_app::App;
use server_support::streaming_app::Limits;
use server_support::{
    frame, keys, send, send_text, start, start_with, within, Reply, LIMITS, PATIENCE,
};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::http::StatusCode;
use tower::ServiceExt;

/// A `POST /v1/tts` with a guessed key, from `peer`.
fn guess(peer: IpAddr, n: u64) -> http::Request<Body> {
    let mut request = http::Request::post("/v1/tts")
        .header("x-api-key", format!("sk_guess_{n}"))
        .header("content-length", "2")
        .body(Body::from("hi"))
        .unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(peer, 40_000)));
    request
}

/// Address `host` of the IPv6 network `net` (its first 64 bits).
fn v6(net: u16, host: u64) -> IpAddr {
    let mut segments = [0x2001, 0xdb8, 0, net, 0, 0, 0, 0];
    for (i, segment) in segments[4..].iter_mut().enumerate() {
        *segment = (host >> (48 - 16 * i)) as u16;
    }
    IpAddr::V6(Ipv6Addr::from(segments))
}

/// Each guess from a new address of one `/64` is charged to the network:
/// after the burst, 429, whatever the address. Another network still has
/// its own budget.
#[tokio::test]
async fn guesses_from_one_ipv6_network_share_one_budget() {
    let app = App::new(LIMITS, keys(), keyrate::ManualClock::new());
    let router = app.router();
    let burst = LIMITS.auth_failure_burst;
    for n in 0..burst {
        let peer = v6(1, n * 7919 + 1);
        let response = router.clone().oneshot(guess(peer, n)).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "guess {n}");
    }
    for n in burst..burst + 3 {
        let peer = v6(1, u64::MAX - n);
        let response = router.clone().oneshot(guess(peer, n)).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "guess {n} from {peer}"
        );
    }
    let response = router.clone().oneshot(guess(v6(2, 1), 0)).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "another /64");
}

#[test]
fn client_keys_are_ipv4_addresses_and_ipv6_networks() {
    assert_eq!(client_key("192.0.2.7".parse().unwrap()), "192.0.2.7");
    assert_eq!(client_key("::ffff:192.0.2.7".parse().unwrap()), "192.0.2.7");
    assert_eq!(client_key(v6(1, 1)), "2001:db8:0:1::/64");
    assert_eq!(client_key(v6(1, u64::MAX)), client_key(v6(1, 1)));
    assert_ne!(client_key(v6(2, 1)), client_key(v6(1, 1)));
    assert_eq!(client_key("::1".parse().unwrap()), "0:0:0:0::/64");
}

/// Messages refused without spending a budget (malformed, an unknown
/// context, a cost above the capacity) are free work for the server: at
/// the `max_refused`-th in a row the stream is closed with 1008. One that
/// spends (an admitted open) starts the count again.
#[tokio::test]
async fn a_flood_of_refused_messages_closes_the_stream() {
    let server = start().await;
    let (mut socket, _) = server.connect("agent").await.unwrap();
    let max = LIMITS.max_refused;
    let refusals = [
        "not json".to_owned(),
        json!({"type": "speak", "context_id": "nope", "text": "hi"}).to_string(),
        json!({"type": "dance"}).to_string(),
    ];
    for n in 0..max - 1 {
        let text = refusals[n as usize % refusals.len()].clone();
        let reply = frame(send_text(&mut socket, text).await);
        assert_eq!(reply["type"], "error", "{reply}");
    }
    let open = json!({"type": "open", "context_id": "c"});
    assert_eq!(
        frame(send(&mut socket, open).await)["type"],
        "context_opened"
    );
    // Above the burst's capacity: refused, charged nothing.
    let text = "a".repeat(LIMITS.synth_burst as usize + 1);
    let too_big = json!({"type": "speak", "context_id": "c", "text": text});
    for _ in 0..max - 1 {
        let reply = frame(send(&mut socket, too_big.clone()).await);
        assert_eq!(reply["code"], "exceeds_capacity", "{reply}");
    }
    // The last one is answered, then the stream is closed.
    let reply = frame(send(&mut socket, too_big).await);
    assert_eq!(reply["code"], "exceeds_capacity", "{reply}");
    match send_text(&mut socket, "not json".to_owned()).await {
        Reply::Closed(code, reason) => {
            assert_eq!(code, server_support::streaming_app::POLICY_VIOLATION);
            assert!(reason.contains("refused"), "{reason}");
        }
        Reply::Frame(reply) => panic!("still answering: {reply}"),
    }
    assert!(server.streams_in_flight(0).await, "its permit is back");
}

/// The start of a request head, never finished.
const PARTIAL_HEAD: &[u8] = b"GET /v1/tts HTTP/1.1\r\nHost: localhost\r\nX-Api-";

/// A whole request, answered 401 (no key) by a server that serves it.
const WHOLE_REQUEST: &[u8] =
    b"GET /v1/tts HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// What the server sends on a new connection after `request`, until it
/// closes it.
async fn answer(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    // A reset is a close too.
    let _ = stream.read_to_end(&mut answer).await;
    answer
}

/// Connections that hold a request head open take the connection slots;
/// at the cap, a new connection is closed unanswered, and a slot given
/// back serves the next one.
#[tokio::test]
async fn connections_are_capped() {
    let limits = Limits {
        max_connections: 2,
        ..LIMITS
    };
    let server = start_with(limits, None).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream.write_all(PARTIAL_HEAD).await.unwrap();
        held.push(stream);
    }
    // Accepted in order: the two held connections have the slots. A
    // server that left the third waiting (no longer accepting at the cap)
    // instead of closing it fails here, rather than hanging the test.
    let refused = within(
        "a connection over the cap: neither answered nor closed",
        answer(server.addr, WHOLE_REQUEST),
    )
    .await;
    assert!(refused.is_empty(), "{}", String::from_utf8_lossy(&refused));

    drop(held.pop());
    // The server sees the close on its own time: attempts, each answered
    // or closed, until a deadline far beyond an honest wait.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let served = loop {
        let answer = within(
            "a connection after a slot was freed: neither answered nor closed",
            answer(server.addr, WHOLE_REQUEST),
        )
        .await;
        if !answer.is_empty() {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a freed slot served no new connection within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        served.starts_with(b"HTTP/1.1 401"),
        "{}",
        String::from_utf8_lossy(&served)
    );
}

/// A request head that never arrives whole ends its connection after
/// `header_timeout`, a connection that sends nothing too. Under tokio's
/// paused clock: the server's timer and the test's hour-long guard are
/// ordered exactly, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn a_head_that_never_ends_is_timed_out() {
    let server = start().await;
    for request in [PARTIAL_HEAD, b""] {
        let guard = Duration::from_secs(3600);
        let answer = tokio::time::timeout(guard, answer(server.addr, request))
            .await
            .expect("the server closes the connection before the guard");
        let text = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{text}"
        );
    }
}

/// A charged `POST /v1/tts` whose body trickles in is answered 408 after
/// `body_timeout`, and its connection freed (paused clock, as above).
#[tokio::test(start_paused = true)]
async fn a_body_that_never_ends_is_timed_out() {
    let server = start().await;
    let request = b"POST /v1/tts HTTP/1.1\r\nHost: localhost\r\nX-API-Key: http-key\r\n\
                    Content-Length: 10\r\nConnection: close\r\n\r\nab";
    let guard = Duration::from_secs(3600);
    let answer = tokio::time::timeout(guard, answer(server.addr, request))
        .await
        .expect("the server answers before the guard");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
}

#![cfg(not(loom))]
//! The example server read as an attacker would, past what
//! `tests/server_security.rs` covers: a client that owns an IPv6 network
//! does not get a fresh budget of key guesses per address (the app called
//! in process with the peer address a real connection would give it:
//! loopback cannot originate from many IPv6 addresses), and a WebSocket
//! flood of messages that spend no budget is closed.

mod server_support;

use axum::body::Body;
use axum::extract::ConnectInfo;
use serde_json::json;
use server_support::streaming_app::auth::client_key;
use server_support::streaming_app::App;
use server_support::{frame, keys, send, send_text, start, Reply, LIMITS};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
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

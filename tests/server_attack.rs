#![cfg(not(loom))]
//! The example server read as an attacker would, past what
//! `tests/server_security.rs` covers: a client that owns an IPv6 network
//! does not get a fresh budget of key guesses per address. The app is
//! called in process with the peer address a real connection would give
//! it (loopback cannot originate from many IPv6 addresses).

mod server_support;

use axum::body::Body;
use axum::extract::ConnectInfo;
use server_support::streaming_app::auth::client_key;
use server_support::streaming_app::App;
use server_support::{keys, LIMITS};
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

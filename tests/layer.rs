#![cfg(not(loom))]
//! The tower layer: keys, costs, status codes and rate-limit headers, on a
//! manual clock so that every expected value follows from the quota.

use http::request::Parts;
use http::{Request, Response, StatusCode};
use keyrate::layer::{api_key_header, bearer_token, Limited, RateLimitLayer, RateLimitService};
use keyrate::{ManualClock, TokenBucketLimiter};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tower::{service_fn, Layer, Service, ServiceExt};

/// The inner service: counts its calls, answers 200 "ok".
fn inner(
    calls: &Arc<AtomicUsize>,
) -> impl Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<String>, Infallible>> + Send,
> + Clone
       + Send
       + 'static {
    let calls = Arc::clone(calls);
    service_fn(move |_request: Request<()>| {
        calls.fetch_add(1, Relaxed);
        async { Ok::<_, Infallible>(Response::new(String::from("ok"))) }
    })
}

fn bearer(key: &str) -> Request<()> {
    Request::get("/")
        .header("authorization", format!("Bearer {key}"))
        .body(())
        .unwrap()
}

fn header<'a>(response: &'a Response<String>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn call<S>(service: &mut S, request: Request<()>) -> Response<String>
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

fn ceil_secs(secs: f64) -> String {
    (secs.ceil() as u64).to_string()
}

#[tokio::test]
async fn admits_the_burst_then_answers_429_until_the_refill() {
    let (rate, capacity) = (0.4, 3); // a token every 2.5 s
    let clock = ManualClock::new();
    let limiter = Arc::new(TokenBucketLimiter::new(rate, capacity).with_clock(clock.clone()));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimitLayer::new(Arc::clone(&limiter), bearer_token).layer(inner(&calls));
    let policy = format!(
        "\"default\";q={capacity};w={}",
        ceil_secs(capacity as f64 / rate)
    );

    for spent in 1..=capacity {
        let response = call(&mut service, bearer("alice")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.body(), "ok");
        let left = capacity - spent;
        let state = format!("\"default\";r={left};t={}", ceil_secs(spent as f64 / rate));
        assert_eq!(header(&response, "ratelimit"), Some(state.as_str()));
        assert_eq!(header(&response, "ratelimit-policy"), Some(policy.as_str()));
        assert_eq!(header(&response, "retry-after"), None);
    }
    let limited = call(&mut service, bearer("alice")).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait = ceil_secs(1.0 / rate);
    assert_eq!(header(&limited, "retry-after"), Some(wait.as_str()));
    let state = format!("\"default\";r=0;t={wait}");
    assert_eq!(header(&limited, "ratelimit"), Some(state.as_str()));
    assert_eq!(header(&limited, "ratelimit-policy"), Some(policy.as_str()));
    assert_eq!(
        calls.load(Relaxed),
        capacity as usize,
        "429s never reach the inner service"
    );

    // Other keys are unaffected.
    assert_eq!(
        call(&mut service, bearer("bob")).await.status(),
        StatusCode::OK
    );

    // 2.5 s is not yet whole seconds: still 429, now with 1 s to go.
    clock.advance(Duration::from_millis(1500));
    let limited = call(&mut service, bearer("alice")).await;
    assert_eq!(header(&limited, "retry-after"), Some("1"));
    clock.advance(Duration::from_secs(1));
    let admitted = call(&mut service, bearer("alice")).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    let state = format!("\"default\";r=0;t={}", ceil_secs(capacity as f64 / rate));
    assert_eq!(header(&admitted, "ratelimit"), Some(state.as_str()));
}

#[tokio::test]
async fn requests_without_a_key_get_401_and_spend_nothing() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1).with_clock(ManualClock::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimitLayer::new(Arc::clone(&limiter), bearer_token).layer(inner(&calls));
    let anonymous = [
        Request::get("/").body(()).unwrap(),
        Request::get("/")
            .header("authorization", "Basic YWxhZGRpbjpvcGVuc2VzYW1l")
            .body(())
            .unwrap(),
        Request::get("/")
            .header("authorization", "Bearer   ")
            .body(())
            .unwrap(),
        Request::get("/")
            .header("x-api-key", "not read by bearer_token")
            .body(())
            .unwrap(),
    ];
    for request in anonymous {
        let response = call(&mut service, request).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(header(&response, "www-authenticate"), Some("Bearer"));
    }
    assert_eq!(calls.load(Relaxed), 0);
    assert!(limiter.is_empty());
}

#[test]
fn extractors_read_bearer_tokens_and_api_keys() {
    let parts = |name: &str, value: &str| -> Parts {
        let request = Request::get("/").header(name, value).body(()).unwrap();
        request.into_parts().0
    };
    let bearer = |value| bearer_token(&parts("authorization", value));
    assert_eq!(bearer("Bearer abc").as_deref(), Some("abc"));
    assert_eq!(bearer("bearer abc").as_deref(), Some("abc"));
    assert_eq!(bearer("BEARER  abc ").as_deref(), Some("abc"));
    assert_eq!(bearer("Bearer"), None);
    assert_eq!(bearer("Token abc"), None);
    assert_eq!(bearer_token(&parts("x-api-key", "abc")), None);
    let api_key = |value| api_key_header(&parts("x-api-key", value));
    assert_eq!(api_key("sk_123").as_deref(), Some("sk_123"));
    assert_eq!(api_key(" sk_123 ").as_deref(), Some("sk_123"));
    assert_eq!(api_key(""), None);
    assert_eq!(api_key_header(&parts("authorization", "Bearer abc")), None);
}

#[tokio::test]
async fn costs_come_from_the_request() {
    let capacity = 10;
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, capacity).with_clock(ManualClock::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let cost = |parts: &Parts| -> u64 {
        let value = parts.headers.get("x-cost").unwrap().to_str().unwrap();
        value.parse().unwrap()
    };
    let layer = RateLimitLayer::new(Arc::clone(&limiter), api_key_header)
        .with_cost(cost)
        .with_policy_name("tts");
    let mut service = layer.layer(inner(&calls));
    let request = |cost: u64| {
        Request::get("/")
            .header("x-api-key", "k")
            .header("x-cost", cost.to_string())
            .body(())
            .unwrap()
    };

    let response = call(&mut service, request(0)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let full = format!("\"tts\";r={capacity};t=0");
    assert_eq!(header(&response, "ratelimit"), Some(full.as_str()));

    let too_big = call(&mut service, request(capacity + 1)).await;
    assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&too_big, "retry-after"), None, "no wait can help");

    let response = call(&mut service, request(7)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let state = format!("\"tts\";r={};t=7", capacity - 7);
    assert_eq!(header(&response, "ratelimit"), Some(state.as_str()));

    let limited = call(&mut service, request(5)).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&limited, "retry-after"), Some("2")); // 5 - 3 tokens at 1/s
    assert_eq!(calls.load(Relaxed), 2);
}

#[tokio::test]
async fn every_clone_and_every_layered_service_share_one_limiter() {
    let capacity = 6;
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, capacity).with_clock(ManualClock::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(Arc::clone(&limiter), bearer_token);
    let first = layer.layer(inner(&calls));
    let second = layer.clone().layer(inner(&calls));
    // The layer, its clones, the services it made and their clones share
    // one part that holds the limiter: 1 reference here, 1 there.
    let clones: Vec<_> = (0..3).map(|_| first.clone()).collect();
    assert_eq!(Arc::strong_count(&limiter), 2);

    let mut services: Vec<_> = clones.into_iter().chain([first, second]).collect();
    let mut admitted = 0;
    for _ in 0..3 {
        for service in &mut services {
            let response = call(service, bearer("shared")).await;
            if response.status() == StatusCode::OK {
                admitted += 1;
            }
        }
    }
    assert_eq!(admitted, capacity, "one bucket across all services");
    assert_eq!(calls.load(Relaxed), capacity as usize);
}

#[tokio::test]
async fn policy_names_are_quoted_structured_field_strings() {
    let limiter = Arc::new(TokenBucketLimiter::new(2.0, 4).with_clock(ManualClock::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimitLayer::new(limiter, bearer_token)
        .with_policy_name("per \"key\"")
        .layer(inner(&calls));
    let response = call(&mut service, bearer("k")).await;
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"per \\\"key\\\"\";q=4;w=2")
    );
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"per \\\"key\\\"\";r=3;t=1")
    );
}

#[test]
#[should_panic(expected = "invalid policy name")]
fn rejects_policy_names_a_header_cannot_carry() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1));
    let _ = RateLimitLayer::new(limiter, bearer_token).with_policy_name("tab\there");
}

#[test]
fn layer_and_service_are_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1));
    let layer = RateLimitLayer::new(limiter, bearer_token);
    send_sync(&layer);
    assert!(format!("{layer:?}").starts_with("RateLimitLayer"));
    let calls = Arc::new(AtomicUsize::new(0));
    let service: RateLimitService<_, _, _> = layer.layer(inner(&calls));
    send_sync(&service);
}

#[tokio::test]
async fn a_full_limiter_answers_503_for_new_keys_only() {
    let limiter = Arc::new(
        TokenBucketLimiter::new(1.0, 2)
            .with_clock(ManualClock::new())
            .with_max_buckets(1),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimitLayer::new(limiter, bearer_token).layer(inner(&calls));
    assert_eq!(
        call(&mut service, bearer("first")).await.status(),
        StatusCode::OK
    );
    let refused = call(&mut service, bearer("second")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    // A documented small wait: room comes back as the sweep evicts.
    assert_eq!(header(&refused, "retry-after"), Some("1"));
    assert_eq!(
        keyrate::layer::LIMITER_FULL_RETRY_AFTER,
        Duration::from_secs(1)
    );
    // The key that holds a bucket is unaffected.
    assert_eq!(
        call(&mut service, bearer("first")).await.status(),
        StatusCode::OK
    );
    assert_eq!(calls.load(Relaxed), 2);
}

/// A backend that can never decide: what the layer sees of Redis down
/// under a fail-closed policy.
#[derive(Debug)]
struct Down;

#[derive(Debug)]
struct Unreachable;

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("backend unreachable")
    }
}

impl std::error::Error for Unreachable {}

impl keyrate::Refusal for Unreachable {
    fn denial(&self) -> Option<&keyrate::Denial> {
        None
    }
}

impl keyrate::AsyncLimiter<String> for Down {
    type Error = Unreachable;

    fn quota(&self) -> keyrate::Quota {
        keyrate::Quota::new(1.0, 5).unwrap()
    }

    async fn check_under(
        &self,
        _: &String,
        _: keyrate::At,
        _: u64,
        _: &keyrate::Quota,
    ) -> Result<keyrate::Decision, Unreachable> {
        Err(Unreachable)
    }

    async fn remaining_under(
        &self,
        _: &String,
        _: keyrate::At,
        _: &keyrate::Quota,
    ) -> Result<u64, Unreachable> {
        Err(Unreachable)
    }
}

#[tokio::test]
async fn a_backend_that_cannot_decide_gets_503_and_the_inner_service_is_not_called() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(Arc::new(Down), bearer_token);
    let mut service = layer.layer(inner(&calls));
    let response = call(&mut service, bearer("alice")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(header(&response, "retry-after").is_none());
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"default\";q=5;w=5")
    );
    assert_eq!(calls.load(Relaxed), 0);
    assert_eq!(layer.responses().unavailable, 1);
}

/// Key headers above the bound (256 bytes by default) get 431 before the
/// key function runs: nothing is copied, spent or created.
#[tokio::test]
async fn oversized_key_headers_get_431_and_spend_nothing() {
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5).with_clock(ManualClock::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let extracted = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&extracted);
    let layer = RateLimitLayer::new(Arc::clone(&limiter), move |parts: &Parts| {
        counted.fetch_add(1, Relaxed);
        bearer_token(parts).or_else(|| api_key_header(parts))
    });
    let mut service = layer.layer(inner(&calls));
    let api_key = |key: &str| Request::get("/").header("x-api-key", key).body(()).unwrap();
    let max = keyrate::layer::DEFAULT_MAX_KEY_LEN;
    assert_eq!(max, 256);

    let fits = "k".repeat(max);
    assert_eq!(
        call(&mut service, bearer(&fits)).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&mut service, api_key(&fits)).await.status(),
        StatusCode::OK
    );
    let over = "k".repeat(max + 1);
    for request in [bearer(&over), api_key(&over), bearer(&"k".repeat(200_000))] {
        let response = call(&mut service, request).await;
        assert_eq!(
            response.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        assert_eq!(header(&response, "retry-after"), None);
    }
    // Any scheme: the token is measured, not parsed.
    let basic = Request::get("/")
        .header("authorization", format!("Basic {over}"))
        .body(())
        .unwrap();
    let response = call(&mut service, basic).await;
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(calls.load(Relaxed), 2);
    assert_eq!(extracted.load(Relaxed), 2);
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.stats().buckets_created, 1);
    let responses = layer.responses();
    assert_eq!((responses.admitted, responses.key_too_large), (2, 4));

    // The bound is the layer's to set.
    let wide = RateLimitLayer::new(Arc::clone(&limiter), bearer_token).with_max_key_len(1024);
    let mut wide = wide.layer(inner(&calls));
    assert_eq!(
        call(&mut wide, bearer(&over)).await.status(),
        StatusCode::OK
    );
}

/// What the inner service sees of the key: the key itself, in
/// `Limited`, whose `Debug` (say, a request logged whole) shows a
/// fingerprint.
#[tokio::test]
async fn limited_debug_shows_a_fingerprint() {
    let key = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 5));
    let service = RateLimitLayer::new(limiter, bearer_token).layer(service_fn(
        |request: Request<()>| async move {
            let limited = request.extensions().get::<Limited>().unwrap();
            let shown = format!("{limited:?} {:?}", request.extensions());
            Ok::<_, Infallible>(Response::new(format!("{}\n{shown}", limited.key)))
        },
    ));
    let response = service.oneshot(bearer(key)).await.unwrap();
    let (own, shown) = response.body().split_once('\n').unwrap();
    assert_eq!(own, key);
    assert!(!shown.contains("4eC39"), "{shown}");
    let label = keyrate::KeyLabels::fingerprint().label(key);
    assert!(shown.contains(&label), "{shown}");
}

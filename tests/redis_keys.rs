//! The Redis names of buckets: a namespace of its own per limiter unless
//! one is named, names that cannot collide across namespaces, keys that
//! cannot pick a hash slot, and (by default) keys that do not show.
//!
//! Needs `KEYRATE_REDIS_URL` (see `redis_support`). The cluster side (one
//! slot by a deliberate hash tag, never by a key's braces) is in
//! `tests/cluster.rs`.
#![cfg(not(loom))]

mod redis_support;

use keyrate::{AsyncLimiter, KeyNames, KeySecret, Quota, RedisLimiter, RedisLimiterError};
use redis_support::{raw, unique_prefix, url, TEST_TIMEOUT};
use std::time::Duration;

fn quota() -> Quota {
    Quota::new(1.0, 3).unwrap()
}

async fn connect() -> RedisLimiter {
    RedisLimiter::connect(&url(), quota())
        .await
        .expect("the test server answers")
        .with_min_ttl(Duration::from_secs(3600))
        .with_timeout(TEST_TIMEOUT)
}

/// Two limiters that name no namespace do not share buckets: they used to
/// share every one, on the default prefix.
#[tokio::test]
async fn limiters_left_unnamed_share_nothing() {
    let (a, b) = (connect().await, connect().await);
    assert!(a.allow_n("sk_live_1", 0.0, 3).await);
    assert_eq!(b.remaining("sk_live_1", 0.0).await.unwrap(), 3);
    assert!(b.allow_n("sk_live_1", 0.0, 3).await);
    assert_ne!(a.bucket_key("sk_live_1"), b.bucket_key("sk_live_1"));
    assert_ne!(a.namespace(), b.namespace());
    // Clones share their limiter's namespace.
    assert_eq!(a.clone().bucket_key("k"), a.bucket_key("k"));
}

/// Named the same way, limiters share: the way several processes share a
/// budget. A different secret, or readable names, is another bucket.
#[tokio::test]
async fn limiters_named_alike_share() {
    let (a, b, c, d) = (
        connect().await,
        connect().await,
        connect().await,
        connect().await,
    );
    let namespace = unique_prefix("shared");
    let secret = || KeySecret::new(format!("{namespace} and some secret bytes")).unwrap();
    let a = a.with_namespace(&namespace, KeyNames::Hashed(secret()));
    let b = b.with_namespace(&namespace, KeyNames::Hashed(secret()));
    let other_secret = c.with_namespace(
        &namespace,
        KeyNames::Hashed(KeySecret::new([9u8; 16]).unwrap()),
    );
    let readable = d.with_namespace(&namespace, KeyNames::Encoded);
    assert!(a.allow_n("k", 0.0, 2).await);
    assert_eq!(b.remaining("k", 0.0).await.unwrap(), 1);
    assert_eq!(other_secret.remaining("k", 0.0).await.unwrap(), 3);
    assert_eq!(readable.remaining("k", 0.0).await.unwrap(), 3);
    assert_eq!(a.bucket_key("k"), b.bucket_key("k"));
}

/// `"rl:"` + `"tts:x"` and `"rl:tts:"` + `"x"` were one Redis key.
#[tokio::test]
async fn namespaces_cannot_collide() {
    let (a, b) = (connect().await, connect().await);
    let base = unique_prefix("collide");
    let short = a.with_namespace(&base, keyrate::KeyNames::Encoded);
    let long = b.with_namespace(format!("{base}tts:"), keyrate::KeyNames::Encoded);
    assert_ne!(short.bucket_key("tts:x"), long.bucket_key("x"));
    assert!(short.allow_n("tts:x", 0.0, 3).await);
    assert_eq!(long.remaining("x", 0.0).await.unwrap(), 3);
}

/// A key cannot choose its hash slot: its braces are encoded, and the
/// only braces in a name are the limiter's own hash tag.
#[tokio::test]
async fn keys_cannot_inject_a_hash_tag() {
    let limiter = connect().await;
    let readable = limiter
        .clone()
        .with_namespace(unique_prefix("tags"), keyrate::KeyNames::Encoded);
    for l in [&limiter, &readable] {
        let name = l.bucket_key("{victim}:sk_1");
        assert!(!name.contains(['{', '}']), "{name}");
    }
    let tagged = readable.with_hash_tag(true);
    let name = tagged.bucket_key("{victim}:sk_1");
    assert!(name.starts_with('{'));
    assert_eq!(name.matches('{').count(), 1, "{name}");
    assert!(tagged.allow("{victim}:sk_1", 0.0).await);
}

/// By default a key does not show in Redis: not in its name, and not in
/// anything `SCAN` finds.
#[tokio::test]
async fn keys_do_not_show_by_default() {
    let (url, limiter) = (url(), connect().await);
    let key = format!("sk_live_{}", unique_prefix("secret").replace(':', "_"));
    assert!(limiter.allow(&key, 0.0).await);
    let name = limiter.bucket_key(&key);
    assert!(!name.contains(&key));
    let mut conn = raw(&url).await;
    let found = redis_support::keys(&mut conn, "").await;
    assert!(found.contains(&name), "the bucket is where bucket_key says");
    assert!(
        !found.iter().any(|k| k.contains(&key)),
        "the key shows in Redis"
    );
    let under_prefix = redis_support::keys(&mut conn, limiter.bucket_key_prefix()).await;
    assert_eq!(under_prefix, vec![name]);
}

#[test]
fn a_secret_never_prints_and_must_be_long_enough() {
    let secret = KeySecret::new("0123456789abcdef").unwrap();
    assert!(!format!("{secret:?}").contains("0123"));
    assert!(!format!("{:?}", KeyNames::Hashed(secret)).contains("0123"));
    let err: RedisLimiterError = KeySecret::new("0123456789abcde").unwrap_err();
    assert_eq!(err.kind(), keyrate::RedisErrorKind::Config);
    println!("{err}");
}

#[test]
fn new_public_types_are_send_sync_debug() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<KeySecret>();
    check::<KeyNames>();
    check::<keyrate::CircuitStats>();
}

//! Issue 24, secure by default: what keyrate shows of a key outside the
//! caller's code (fingerprints, never raw keys), and the offenders' list
//! that a flood of one-shot keys cannot pollute.
#![cfg(not(loom))]

use keyrate::{KeyLabels, TokenBucketLimiter, MAX_KEY_LABEL_LEN};
use std::sync::Arc;

/// A key that must never be shown outside the test.
const SECRET_KEY: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";

#[test]
fn debug_output_shows_fingerprints_never_raw_keys() {
    let limiter = TokenBucketLimiter::new(1.0, 1).with_top_offenders(true);
    let handle = limiter.bucket(SECRET_KEY);
    assert!(handle.allow(0.0));
    assert!(!handle.allow(0.0));
    assert!(!limiter.allow(SECRET_KEY, 0.0));

    let offenders = limiter.top_offenders(5);
    // In-process, the caller gets its keys back...
    assert_eq!(offenders.top, vec![(SECRET_KEY.to_owned(), 2)]);
    // ...but no Debug prints them.
    let label = KeyLabels::fingerprint().label(SECRET_KEY);
    for shown in [
        format!("{offenders:?}"),
        format!("{offenders:#?}"),
        format!("{limiter:?}"),
        format!("{handle:?}"),
        format!("{:?}", limiter.check(SECRET_KEY, 0.0, 1)),
        format!("{:?}", limiter.check(SECRET_KEY, 0.0, 5)),
    ] {
        assert!(!shown.contains("4eC39"), "{shown}");
    }
    assert!(format!("{offenders:?}").contains(&label), "{offenders:?}");
    assert!(label.starts_with("sk_live_#"), "{label}");
}

#[test]
fn exported_offenders_follow_the_label_policy() {
    let limiter = TokenBucketLimiter::new(1.0, 1).with_top_offenders(true);
    let long = format!("sk_live_{}", "x".repeat(300));
    for key in [SECRET_KEY, SECRET_KEY, long.as_str()] {
        let _ = limiter.allow(key, 0.0);
        let _ = limiter.allow(key, 0.0);
    }
    let offenders = limiter.top_offenders(5);

    let fingerprints = offenders.labelled(&KeyLabels::fingerprint());
    assert_eq!(fingerprints.top.len(), 2);
    for (label, _) in &fingerprints.top {
        assert!(
            label.starts_with("sk_live_#") && label.len() == 25,
            "{label}"
        );
    }
    // The same secret gives the same labels, another secret others.
    let vault = |secret: &[u8]| offenders.labelled(&KeyLabels::fingerprint_with_secret(secret));
    assert_eq!(vault(b"fleet secret"), vault(b"fleet secret"));
    assert_ne!(vault(b"fleet secret").top, vault(b"other secret").top);

    // Raw only when asked for, and cut to the label cap.
    let raw = offenders.labelled(&KeyLabels::raw());
    assert_eq!(raw.top[0], (SECRET_KEY.to_owned(), 3));
    assert_eq!(raw.top[1].0.len(), MAX_KEY_LABEL_LEN);
    // The caller's own function; keys that share a label count as one.
    let customer = offenders.labelled(&KeyLabels::with(|_| "acme".to_owned()));
    assert_eq!(customer.top, vec![("acme".to_owned(), 4)]);
    let long_names = offenders.labelled(&KeyLabels::with(|key| key.repeat(10)));
    assert!(long_names
        .top
        .iter()
        .all(|(l, _)| l.len() <= MAX_KEY_LABEL_LEN));
}

#[cfg(feature = "prometheus")]
#[test]
fn metrics_label_offenders_by_fingerprint() {
    use keyrate::prometheus::Metrics;

    let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1).with_top_offenders(true));
    let metrics = Metrics::new().limiter("api", limiter.clone());
    assert!(limiter.allow(SECRET_KEY, 0.0));
    assert!(!limiter.allow(SECRET_KEY, 0.0));
    let text = metrics.render();
    assert!(!text.contains("4eC39"), "{text}");
    let label = KeyLabels::fingerprint().label(SECRET_KEY);
    let series = format!(r#"keyrate_offender_denials{{key="{label}",limiter="api"}} 1"#);
    assert!(text.contains(&series), "{text}");

    let raw = Metrics::new()
        .with_key_labels(KeyLabels::raw())
        .limiter("api", limiter.clone());
    let series = format!(r#"keyrate_offender_denials{{key="{SECRET_KEY}",limiter="api"}} 1"#);
    assert!(raw.render().contains(&series));
    assert!(!format!("{raw:?}").contains("4eC39"));
}

/// A small deterministic generator for the flood's keys and costs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One real abuser (denied for want of tokens) and a flood of one-shot
/// random keys that spend nothing: costs above the capacity (413 at the
/// layer) and new keys at the cap (503). The flood is not an offence, so
/// the abuser stays listed, alone, with its exact count.
#[test]
fn one_abuser_stays_listed_under_a_flood_of_one_shot_keys() {
    let limiter = TokenBucketLimiter::new(1.0, 2)
        .with_top_offenders(true)
        .with_max_buckets(1);
    let abuser = "sk_live_abuser0000000000000000";
    assert!(limiter.allow_n(abuser, 1.0, 2));
    for _ in 0..50 {
        assert!(!limiter.allow(abuser, 1.0));
    }
    let mut rng = Rng(42);
    // One thread, so the flood goes through the abuser's own sketch.
    for i in 0..100_000 {
        let key = format!("sk_live_{:032x}", rng.next());
        let cost = if i % 2 == 0 { 3 } else { 1 };
        assert!(!limiter.allow_n(key.as_str(), 1.0, cost));
    }
    let offenders = limiter.top_offenders(5);
    assert_eq!(
        offenders.top,
        vec![(abuser.to_owned(), 50)],
        "{offenders:?}"
    );
    assert_eq!((offenders.denials, offenders.max_error), (50, 0));
    let stats = limiter.stats();
    assert_eq!(
        (stats.denied_exceeds_capacity, stats.denied_limiter_full),
        (50_000, 50_000)
    );
}

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<KeyLabels>();
    send_sync::<keyrate::Offenders<String>>();
    let _ = Arc::new(KeyLabels::default());
}

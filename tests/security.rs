//! Issue 24, secure by default: what keyrate shows of a key outside the
//! caller's code (fingerprints, never raw keys), the bucket cap that
//! handles count toward, and the offenders' list that a flood of one-shot
//! keys cannot pollute.
#![cfg(not(loom))]

mod common;

use common::api_key;
use keyrate::{Decision, Denial, KeyLabels, Quota, TokenBucketLimiter, MAX_KEY_LABEL_LEN};
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
    assert!(label.starts_with('#') && label.len() == 17, "{label}");
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
        assert!(label.starts_with('#') && label.len() == 17, "{label}");
    }
    // The same secret gives the same labels, another secret others.
    let vault =
        |secret: &[u8]| offenders.labelled(&KeyLabels::fingerprint_with_secret(secret).unwrap());
    assert_eq!(vault(b"the fleet's secret"), vault(b"the fleet's secret"));
    assert_ne!(
        vault(b"the fleet's secret").top,
        vault(b"another one's secret").top
    );
    // The type tags listed, and only those.
    let tagged = offenders.labelled(&KeyLabels::fingerprint().with_type_tags(["sk_live_"]));
    for ((tagged, _), (plain, _)) in tagged.top.iter().zip(&fingerprints.top) {
        assert_eq!(*tagged, format!("sk_live_{plain}"));
    }

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

/// A limiter at its cap, flooded with random keys by every kind of call
/// (keyed calls, `try_bucket`, `bucket`): the flood gets `LimiterFull`,
/// the buckets held never exceed the cap, and the keys that held buckets
/// before (keyed and through handles) get exactly the decisions that a
/// limiter without a cap and without the flood gives them.
#[test]
fn a_flood_of_random_keys_at_the_cap_changes_nothing_for_keys_with_buckets() {
    const KEYED: u64 = 16;
    const HANDLES: u64 = 16;
    const CAP: usize = (KEYED + HANDLES) as usize;
    let quota = Quota::new(20.0, 10).unwrap();
    let capped = TokenBucketLimiter::with_quota(quota).with_max_buckets(CAP);
    let reference = TokenBucketLimiter::with_quota(quota);
    let full = Denial::LimiterFull { max_buckets: CAP };

    // The keys that hold buckets: half keyed, half through handles, each
    // spent at 0 so that none is full (and evictable) when the flood
    // starts.
    let keyed: Vec<String> = (0..KEYED).map(api_key).collect();
    let handles: Vec<_> = (KEYED..KEYED + HANDLES)
        .map(|i| {
            let key = api_key(i);
            (capped.try_bucket(key.as_str()).unwrap(), key)
        })
        .collect();
    for key in &keyed {
        assert_eq!(
            capped.check(key.as_str(), 0.0, 5),
            reference.check(key.as_str(), 0.0, 5)
        );
    }
    for (handle, key) in &handles {
        assert_eq!(handle.check(0.0, 5), reference.check(key.as_str(), 0.0, 5));
    }
    assert_eq!(capped.len(), CAP);

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 1..=400u32 {
        let at = f64::from(round) * 0.05;
        // The flood: new keys every round, by every kind of call.
        for _ in 0..50 {
            let key = format!("sk_live_{:032x}", rng.next());
            let decided: Result<Decision, Denial> = match rng.next() % 3 {
                0 => capped.check(key.as_str(), at, 1 + rng.next() % 10),
                1 => capped
                    .try_bucket(key.as_str())
                    .map(|_| unreachable!("at the cap")),
                _ => capped.bucket(key.as_str()).check(at, 1),
            };
            assert_eq!(decided, Err(full));
        }
        assert!(capped.len() <= CAP, "{} buckets, cap {CAP}", capped.len());
        // The keys with buckets: exact, call for call.
        for key in &keyed {
            let cost = 1 + rng.next() % 3;
            let expected = reference.check(key.as_str(), at, cost);
            assert_eq!(
                capped.check(key.as_str(), at, cost),
                expected,
                "{key} at {at}"
            );
        }
        for (handle, key) in &handles {
            let cost = 1 + rng.next() % 3;
            let expected = reference.check(key.as_str(), at, cost);
            assert_eq!(handle.check(at, cost), expected, "{key} at {at}");
        }
    }
    let stats = capped.stats();
    assert_eq!(stats.buckets_created, CAP as u64);
    assert!(stats.denied_limiter_full >= 400 * 50 / 3);
}

#[test]
fn handles_count_toward_the_cap() {
    let limiter = TokenBucketLimiter::new(1.0, 2)
        .with_max_buckets(2)
        .with_auto_sweep(false);
    let a = limiter.bucket("a");
    let b = limiter.try_bucket("b").unwrap();
    let full = Denial::LimiterFull { max_buckets: 2 };
    assert_eq!(limiter.try_bucket("c").unwrap_err(), full);
    // `bucket` at the cap: a handle that refuses, and no bucket.
    let c = limiter.bucket("c");
    assert_eq!(c.check(0.0, 1), Err(full));
    assert!(!c.allow(0.0));
    assert_eq!(limiter.check("c", 0.0, 1), Err(full));
    assert_eq!(limiter.len(), 2);
    // A key that has a bucket gets handles at the cap.
    let a2 = limiter.try_bucket("a").unwrap();
    assert!(a.allow_n(0.0, 1) && a2.allow_n(0.0, 1) && !a.allow(0.0));
    assert!(b.allow(0.0));
    // Room comes back when pinned buckets are released and swept.
    drop((a, a2));
    assert_eq!(limiter.sweep(10.0), 1);
    assert!(limiter.try_bucket("c").is_ok());
    assert_eq!(limiter.len(), 2);
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

//! Unit tests of the Redis names: unambiguous, injection-free, placed.

use super::*;

fn encoded(text: &str) -> String {
    let mut out = String::new();
    encode_into(&mut out, text.as_bytes());
    out
}

#[test]
fn the_encoding_keeps_safe_bytes_and_escapes_the_rest() {
    assert_eq!(encoded("sk_live-1.a:b"), "sk_live-1.a:b");
    assert_eq!(
        encoded("{x}|#%*?[]\\ é"),
        "%7Bx%7D%7C%23%25%2A%3F%5B%5D%5C%20%C3%A9"
    );
}

#[test]
fn names_are_unambiguous() {
    let a = Names::new("rl:", KeyNames::Encoded, false);
    let b = Names::new("rl:tts:", KeyNames::Encoded, false);
    assert_ne!(a.bucket_key("tts:x"), b.bucket_key("x"));
    // A namespace cannot end early: its separator is escaped inside it.
    let c = Names::new("rl|x", KeyNames::Encoded, false);
    let d = Names::new("rl", KeyNames::Encoded, false);
    assert_ne!(c.bucket_key("y"), d.bucket_key("x|y"));
    let secret = KeySecret::new([1; 16]).unwrap();
    let hashed = Names::new("rl", KeyNames::Hashed(secret.clone()), false);
    assert_ne!(hashed.bucket_key("k"), d.bucket_key("k"));
    // The same settings name a key the same way in every process.
    let again = Names::new("rl", KeyNames::Hashed(secret), false);
    assert_eq!(hashed.bucket_key("k"), again.bucket_key("k"));
    let other = Names::new(
        "rl",
        KeyNames::Hashed(KeySecret::new([2; 16]).unwrap()),
        false,
    );
    assert_ne!(hashed.bucket_key("k"), other.bucket_key("k"));
}

#[test]
fn only_the_limiter_picks_braces() {
    for names in [
        Names::new("{ns}", KeyNames::Encoded, false),
        Names::new("ns", KeyNames::Hashed(KeySecret::random()), false),
    ] {
        let name = names.bucket_key("{victim}x");
        assert!(!name.contains(['{', '}']), "{name}");
    }
    let tagged = Names::new("a}b", KeyNames::Encoded, true);
    assert_eq!(tagged.bucket_key("{k}"), "{a%7Db}|%7Bk%7D");
}

#[test]
fn lease_sets_never_take_a_buckets_name() {
    let buckets = Names::new("rl", KeyNames::Encoded, false);
    let leases = buckets.leases();
    assert_eq!(leases.bucket_key("k"), "rl~|k");
    assert_ne!(leases.bucket_key("k"), buckets.bucket_key("k"));
    // `~` in a key or a namespace is escaped: no bucket ends in `~|`.
    assert_eq!(buckets.bucket_key("~|k"), "rl|%7E%7Ck");
    assert_eq!(Names::new("rl~", KeyNames::Encoded, false).head(), "rl%7E|");
    let tagged = leases.with_hash_tag(true);
    assert_eq!(tagged.bucket_key("k"), "{rl}~|k");
    let hashed = Names::new(
        "rl",
        KeyNames::Hashed(KeySecret::new([3; 16]).unwrap()),
        false,
    );
    assert!(hashed.leases().bucket_key("k").starts_with("rl~#"));
}

#[test]
fn placed_names_share_the_anchor_s_slot_and_nothing_else() {
    for keys in [KeyNames::Encoded, KeyNames::Hashed(KeySecret::random())] {
        let names = Names::new("rl", keys, false);
        let a = names.placed_key("{k}1", Some("org}{7"));
        let b = names.placed_key("k2", Some("org}{7"));
        let tag = |name: &str| {
            let open = name.find('{').unwrap();
            let close = open + name[open..].find('}').unwrap();
            name[open..=close].to_owned()
        };
        assert_eq!(tag(&a), tag(&b));
        assert_eq!(a.matches(['{', '}']).count(), 2, "{a}");
        // Another anchor, another tag; no anchor, the plain name.
        assert_ne!(tag(&a), tag(&names.placed_key("k2", Some("org7"))));
        assert_eq!(names.placed_key("k2", None), names.bucket_key("k2"));
        assert_ne!(b, names.bucket_key("k2"));
        assert!(b.starts_with("rl{@"));
    }
    // An empty anchor still makes a non-empty tag.
    let names = Names::new("rl", KeyNames::Encoded, false);
    assert_eq!(names.placed_key("k", Some("")), "rl{@}|k");
    // The namespace's own tag wins: one slot already.
    let tagged = Names::new("rl", KeyNames::Encoded, true);
    assert_eq!(tagged.placed_key("k", Some("a")), "{rl}|k");
    assert_eq!(tagged.scan_pattern(), "{rl}|*");
    assert_eq!(names.scan_pattern(), "rl[|{]*");
}

#[test]
fn private_namespaces_differ() {
    let (a, b) = (Names::private(), Names::private());
    assert_ne!(a.namespace(), b.namespace());
    assert_ne!(a.bucket_key("k"), b.bucket_key("k"));
    assert!(a.bucket_key("k").starts_with(a.head()));
}

//! Unit tests of the key labels.

use super::*;

#[test]
fn only_listed_type_tags_are_shown() {
    let tags = ["sk_live_".to_owned(), "sk_".to_owned(), "ghp_".to_owned()];
    let mut tags = tags.to_vec();
    tags.sort_by_key(|tag| std::cmp::Reverse(tag.len()));
    assert_eq!(
        type_tag("sk_live_4eC39HqLyjWDarjtT1zdp7dc", &tags),
        "sk_live_"
    );
    assert_eq!(type_tag("sk_test_4eC39HqLyjWDarjtT1zdp7dc", &tags), "sk_");
    assert_eq!(type_tag("ghp_abcdefghijklmnop", &tags), "ghp_");
    // Not listed: nothing, however tag-like.
    assert_eq!(type_tag("github_pat_11ABCDEFG0123456789", &tags), "");
    // At most half the key.
    assert_eq!(type_tag("sk_live_abc", &tags), "sk_");
    assert_eq!(type_tag("sk_ab", &tags), "");
    assert_eq!(type_tag("", &tags), "");
    assert_eq!(type_tag("sk_live_4eC39HqLyjWDarjtT1zdp7dc", &[]), "");
}

#[test]
fn a_default_fingerprint_shows_no_character_of_a_random_key() {
    // Random base64url keys (as `secrets.token_urlsafe`) have underscores
    // in their first bytes; a label guessed a "type tag" from such a
    // shape and showed up to 11 of the key's characters.
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let labels = KeyLabels::fingerprint();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut with_underscore = 0;
    for _ in 0..2_000 {
        let key: String = (0..43)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from(ALPHABET[(state >> 58) as usize])
            })
            .collect();
        with_underscore += usize::from(key[..12].contains('_'));
        let label = labels.label(&key);
        assert!(
            label.starts_with('#') && label.len() == 17,
            "{key}: {label}"
        );
    }
    // The keys did have the shape that leaked.
    assert!(with_underscore > 200, "{with_underscore}");
}

#[test]
fn short_label_secrets_are_refused() {
    for len in [0, 1, MIN_LABEL_SECRET_LEN - 1] {
        let secret = vec![7; len];
        assert_eq!(
            KeyLabels::fingerprint_with_secret(&secret).err(),
            Some(ConfigError::SecretTooShort { len })
        );
    }
    assert!(KeyLabels::fingerprint_with_secret(&[7; MIN_LABEL_SECRET_LEN]).is_ok());
}

#[test]
fn labels_are_cut_at_a_character_boundary() {
    let mut label = "ééé".to_owned();
    truncate(&mut label, 3);
    assert_eq!(label, "é");
}

#[test]
fn debug_of_a_string_key_is_its_default_label_quoted() {
    let key = "sk_live_4eC39HqLyjWDarjtT1zdp7dc".to_owned();
    let label = KeyLabels::fingerprint().label(&key);
    assert_eq!(format!("{:?}", Shown(&key)), format!("{label:?}"));
    assert_eq!(format!("{:?}", Shown(key.as_str())), format!("{label:?}"));
    // Another key type: the hash as well.
    let hash = default_secret().hash(&42_u64);
    assert_eq!(format!("{:?}", Shown(&42_u64)), format!("\"#{hash:016x}\""));
}

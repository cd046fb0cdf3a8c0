//! Unit tests of the key labels.

use super::*;

#[test]
fn prefixes_are_short_type_tags_only() {
    assert_eq!(prefix("sk_live_4eC39HqLyjWDarjtT1zdp7dc"), "sk_live_");
    assert_eq!(prefix("github_pat_11ABCDEFG0123456789"), "github_pat_");
    assert_eq!(prefix("ghp_abcdefghijklmnop"), "ghp_");
    assert_eq!(prefix("ci-abuser"), "");
    assert_eq!(prefix("sk_ci_abuser"), "sk_ci_");
    // A long first segment is key material, not a tag.
    assert_eq!(prefix("mysecretkey_x0000000000"), "");
    // At most half the key.
    assert_eq!(prefix("sk_live_abc"), "");
    // Only ASCII letters, digits and '_'.
    assert_eq!(prefix("a\"b_cdefghijklmn"), "");
    assert_eq!(prefix("é_abcdefghijklmn"), "");
    assert_eq!(prefix(""), "");
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
    // Another key type: the hash alone.
    let hash = default_secret().hash(&42_u64);
    assert_eq!(format!("{:?}", Shown(&42_u64)), format!("\"#{hash:016x}\""));
}

//! The Redis name of a bucket: a namespace per limiter, then the user's
//! key, encoded so that it can neither collide with another name, choose
//! its own Redis Cluster hash slot, nor (by default) show itself.
//!
//! A name is `NS` + `#` + the key's keyed hash ([`KeyNames::Hashed`]), or
//! `NS` + `|` + the key percent-encoded ([`KeyNames::Encoded`]); `NS` is
//! the namespace percent-encoded, wrapped in braces when the limiter asks
//! for one hash slot ([`with_hash_tag`](crate::RedisLimiter::with_hash_tag)).
//! A concurrency limiter's lease sets
//! ([`RedisConcurrencyLimiter`](crate::RedisConcurrencyLimiter)) put `~`
//! between the namespace and that separator (`NS~#...`, `NS~|...`): the
//! encoding escapes `~` too, so a lease set never has a bucket's name,
//! even in the same namespace.
//! The encoding keeps `A-Z a-z 0-9 - _ . :` and writes every other byte as
//! `%XX`, so an encoded string never holds `#`, `|`, `{`, `}` or a glob
//! character: the first `#` or `|` ends the namespace, the two forms never
//! meet, and the only braces in a name are the ones the limiter chose.

use super::error::RedisLimiterError;
use siphasher::sip128::SipHasher24;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// The bytes the encoding keeps as they are.
fn safe(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b':')
}

/// Appends `text` percent-encoded: safe bytes as they are, every other
/// byte as `%XX` (so `%` itself too). Injective, and the output holds no
/// `#`, `|`, `{`, `}`, `*`, `?`, `[`, `]` or `\`.
fn encode_into(out: &mut String, text: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &byte in text {
        if safe(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 15)]));
        }
    }
}

/// The secret of [`KeyNames::Hashed`]: the key of a SipHash-2-4 PRF, so
/// that a bucket's Redis name tells nothing about its key to anyone
/// without the secret. Its `Debug` never shows it.
///
/// Every process that shares a namespace must use the same secret (and
/// the same [`KeyNames`]), or they name the same key differently and do
/// not share its bucket.
///
/// # Examples
///
/// ```
/// use keyrate::KeySecret;
///
/// let secret = KeySecret::new("a secret of 16 bytes or more, from your vault").unwrap();
/// assert_eq!(format!("{secret:?}"), "KeySecret([REDACTED])");
/// assert!(KeySecret::new("short").is_err());
/// ```
#[derive(Clone)]
pub struct KeySecret {
    key: [u8; 16],
}

impl KeySecret {
    /// The fewest bytes a secret may have: the key labels' floor
    /// ([`MIN_LABEL_SECRET_LEN`](crate::MIN_LABEL_SECRET_LEN)), for the
    /// same reason.
    pub const MIN_LEN: usize = crate::MIN_LABEL_SECRET_LEN;

    /// A secret from `secret`, at least [`MIN_LEN`](Self::MIN_LEN) bytes of
    /// randomness (a random string from your secret store; its length is
    /// checked, its randomness cannot be). The PRF's 128-bit key is
    /// derived from it with SipHash-2-4-128 under a fixed key, so any
    /// length works.
    ///
    /// # Errors
    ///
    /// [`RedisErrorKind::Config`](crate::RedisErrorKind::Config) for a
    /// secret shorter than 16 bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{KeySecret, RedisErrorKind};
    ///
    /// assert!(KeySecret::new([7u8; 32]).is_ok());
    /// assert_eq!(KeySecret::new("").unwrap_err().kind(), RedisErrorKind::Config);
    /// ```
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, RedisLimiterError> {
        let secret = secret.as_ref();
        if secret.len() < Self::MIN_LEN {
            return Err(RedisLimiterError::config(format!(
                "a key secret needs at least {} bytes, got {}",
                Self::MIN_LEN,
                secret.len()
            )));
        }
        let derived = SipHasher24::new_with_key(b"keyrate key name").hash(secret);
        Ok(KeySecret {
            key: u128::from(derived).to_le_bytes(),
        })
    }

    /// A secret of 128 random bits that no other limiter has (from the
    /// operating system's randomness, through std's `RandomState`).
    fn random() -> Self {
        let mut key = [0; 16];
        for (i, half) in key.chunks_mut(8).enumerate() {
            let mut hasher = RandomState::new().build_hasher();
            hasher.write_usize(i);
            half.copy_from_slice(&hasher.finish().to_le_bytes());
        }
        KeySecret { key }
    }

    /// The keyed hash of `key`.
    fn hash(&self, key: &[u8]) -> u128 {
        u128::from(SipHasher24::new_with_key(&self.key).hash(key))
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret([REDACTED])")
    }
}

/// How a limiter writes a user's key into the Redis name of its bucket
/// (see [`RedisLimiter::with_namespace`](crate::RedisLimiter::with_namespace)).
///
/// # Examples
///
/// ```
/// use keyrate::{KeyNames, KeySecret};
///
/// let hashed = KeyNames::Hashed(KeySecret::new([42u8; 16]).unwrap());
/// let readable = KeyNames::Encoded;
/// # let _ = (hashed, readable);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum KeyNames {
    /// The key's SipHash-2-4 under the secret, 128 bits in hex: a name of
    /// fixed length that tells nothing about the key to anyone who can
    /// read Redis (`SCAN`, `MONITOR`, `SLOWLOG`, an RDB file, a replica)
    /// without the secret. Distinct keys collide with probability about
    /// `n^2 / 2^129` for `n` keys.
    Hashed(KeySecret),
    /// The key itself, percent-encoded (bytes other than
    /// `A-Z a-z 0-9 - _ . :` become `%XX`, braces included): readable by
    /// whoever reads Redis, and as long as the key, up to three times.
    Encoded,
}

/// A limiter's naming of its buckets: the namespace, already encoded, and
/// how keys follow it.
#[derive(Clone)]
pub(super) struct Names {
    /// The namespace as the caller gave it (for `namespace()`).
    namespace: Box<str>,
    /// What every name starts with: the encoded namespace (in braces with
    /// a hash tag) and the separator of its form.
    head: Box<str>,
    keys: KeyNames,
    hash_tag: bool,
    /// Names of lease sets (`~` before the separator), not of buckets.
    leases: bool,
}

impl Names {
    /// `namespace`, with keys named as `keys`, with or without a hash tag.
    pub(super) fn new(namespace: &str, keys: KeyNames, hash_tag: bool) -> Self {
        Self::of_kind(namespace, keys, hash_tag, false)
    }

    /// [`new`](Self::new) for buckets, or for a concurrency limiter's
    /// lease sets (`leases`).
    fn of_kind(namespace: &str, keys: KeyNames, hash_tag: bool, leases: bool) -> Self {
        let mut head = String::with_capacity(namespace.len() + 4);
        if hash_tag {
            head.push('{');
        }
        encode_into(&mut head, namespace.as_bytes());
        if hash_tag {
            head.push('}');
        }
        if leases {
            head.push('~');
        }
        head.push(match keys {
            KeyNames::Hashed(_) => '#',
            KeyNames::Encoded => '|',
        });
        Names {
            namespace: Box::from(namespace),
            head: head.into_boxed_str(),
            keys,
            hash_tag,
            leases,
        }
    }

    /// The same namespace and keys, naming lease sets.
    pub(super) fn leases(&self) -> Self {
        Self::of_kind(&self.namespace, self.keys.clone(), self.hash_tag, true)
    }

    /// A namespace of this limiter's own, `keyrate-private-` and 64 random
    /// bits, with keys hashed under a random secret: shared with no other
    /// limiter (only with this one's clones), and showing no key.
    pub(super) fn private() -> Self {
        let id = RandomState::new().build_hasher().finish();
        let namespace = format!("keyrate-private-{id:016x}");
        Self::new(&namespace, KeyNames::Hashed(KeySecret::random()), false)
    }

    /// The same names with the hash tag on or off.
    pub(super) fn with_hash_tag(&self, hash_tag: bool) -> Self {
        Self::of_kind(&self.namespace, self.keys.clone(), hash_tag, self.leases)
    }

    pub(super) fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(super) fn hash_tag(&self) -> bool {
        self.hash_tag
    }

    /// What every bucket name of this limiter starts with.
    pub(super) fn head(&self) -> &str {
        &self.head
    }

    /// The Redis name of `key`'s bucket.
    pub(super) fn bucket_key(&self, key: &str) -> String {
        let mut out = String::with_capacity(self.head.len() + 32);
        out.push_str(&self.head);
        self.key_into(&mut out, key);
        out
    }

    /// The Redis name of `key`'s bucket when its compound calls are placed
    /// by `anchor` (see `RedisLimiter::placed`): the namespace, then
    /// `{@` + the anchor hashed or encoded as keys are + `}`, a hash tag
    /// that puts every bucket placed by one anchor in one Redis Cluster
    /// slot, then the separator and the key. The anchor is encoded, so it
    /// can close no brace, and the `@` keeps the tag non-empty. Without an
    /// anchor, or when the namespace is already the hash tag
    /// ([`with_hash_tag`](Self::with_hash_tag): one slot for everything),
    /// the name is [`bucket_key`](Self::bucket_key)'s.
    pub(super) fn placed_key(&self, key: &str, anchor: Option<&str>) -> String {
        let Some(anchor) = anchor.filter(|_| !self.hash_tag) else {
            return self.bucket_key(key);
        };
        let (namespace, separator) = self.head.split_at(self.head.len() - 1);
        let mut out = String::with_capacity(self.head.len() + 72);
        out.push_str(namespace);
        out.push_str("{@");
        self.key_into(&mut out, anchor);
        out.push('}');
        out.push_str(separator);
        self.key_into(&mut out, key);
        out
    }

    /// The `SCAN MATCH` pattern of every name of this namespace: the
    /// head then anything, and the names placed by an anchor (the encoded
    /// namespace, then `{`). The encoding leaves no glob character in the
    /// namespace, and the separators are literal inside `[...]`.
    pub(super) fn scan_pattern(&self) -> String {
        if self.hash_tag {
            return format!("{}*", self.head);
        }
        let (namespace, separator) = self.head.split_at(self.head.len() - 1);
        format!("{namespace}[{separator}{{]*")
    }

    /// Appends `key` as this limiter names keys: hashed or encoded.
    fn key_into(&self, out: &mut String, key: &str) {
        match &self.keys {
            KeyNames::Hashed(secret) => {
                use fmt::Write;
                let _ = write!(out, "{:032x}", secret.hash(key.as_bytes()));
            }
            KeyNames::Encoded => encode_into(out, key.as_bytes()),
        }
    }
}

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Names")
            .field("namespace", &self.namespace)
            .field("keys", &self.keys)
            .field("hash_tag", &self.hash_tag)
            .field("leases", &self.leases)
            .finish()
    }
}

#[cfg(test)]
mod tests;

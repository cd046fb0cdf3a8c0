//! How keyrate shows a key outside the caller's code: metrics labels,
//! offender lists as exported, and the `Debug` of values that hold keys.
//!
//! API keys are secrets, so by default a key is shown as a fingerprint:
//! a keyed hash of the whole key (SipHash-1-3 under a 128-bit secret),
//! after the key's type tag (`sk_live_`) only when the operator lists the
//! tags to show. Two processes
//! given the same secret show a key the same way; without one, each
//! process draws its own at random. The raw key is shown only when the
//! caller asks for it ([`KeyLabels::raw`]), or the caller's own function
//! is applied ([`KeyLabels::with`], say key -> customer id).

use crate::error::ConfigError;
use siphasher::sip::SipHasher13;
use siphasher::sip128::{Hasher128, SipHasher13 as SipHasher13x128};
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, OnceLock};

/// The longest label shown, in bytes, unless
/// [`KeyLabels::with_max_len`] says otherwise: a label is cut to this
/// length at a character boundary.
pub const MAX_KEY_LABEL_LEN: usize = 64;

/// The shortest secret a fingerprint takes, in bytes (Redis's keyed bucket
/// names take the same floor, `KeySecret::MIN_LEN`): a shorter one can be
/// guessed, and with it every short key behind its label.
pub const MIN_LABEL_SECRET_LEN: usize = 16;

/// How keyrate shows a key outside the caller's code: a fingerprint (the
/// default), the raw key (asked for explicitly), or the caller's own
/// function of the key; always cut to [`MAX_KEY_LABEL_LEN`] bytes (or
/// [`with_max_len`](Self::with_max_len)).
///
/// Used for the `key` label of `keyrate_offender_denials`
/// (`keyrate::prometheus::Metrics::with_key_labels`, feature
/// `prometheus`) and by [`Offenders::labelled`](crate::Offenders::labelled).
/// The `Debug` of [`Offenders`](crate::Offenders) and of the layer's
/// `Limited` always shows the default fingerprint.
///
/// # The fingerprint
///
/// `#hash`: 16 hex digits of SipHash-1-3, a keyed pseudo-random function,
/// of the whole key under a 128-bit secret; without the secret, the label
/// tells nothing about the key, and telling whether a guessed key has a
/// given label takes the secret. Keys whose kind the operator wants to
/// see can keep a type tag the operator lists
/// ([`with_type_tags`](Self::with_type_tags)): `sk_live_#hash`. keyrate
/// does not guess tags from the key's shape: a random key in base64url
/// (`x7Qp2_Lm9z_...`) has underscores too, and any rule that shows a
/// "tag" it found would show its characters.
///
/// The secret is the process's default (see
/// [`set_default_secret`](Self::set_default_secret); random per process
/// unless set) or one given with
/// [`fingerprint_with_secret`](Self::fingerprint_with_secret). Give every
/// process of a fleet the same secret, so that their labels agree, and
/// keep it as secret as the keys: with it, a short or guessable key can be
/// found from its label by trying candidates.
///
/// # Examples
///
/// ```
/// use keyrate::KeyLabels;
///
/// let labels = KeyLabels::fingerprint_with_secret(b"from the operator's vault")?;
/// let label = labels.label("sk_live_4eC39HqLyjWDarjtT1zdp7dc");
/// assert!(label.starts_with('#') && label.len() == 17);
/// assert!(!label.contains("4eC39"));
/// // Another process with the same secret agrees.
/// assert_eq!(KeyLabels::fingerprint_with_secret(b"from the operator's vault")?
///     .label("sk_live_4eC39HqLyjWDarjtT1zdp7dc"), label);
/// // The tags the operator lists are shown.
/// let tagged = labels.with_type_tags(["sk_live_", "sk_test_"]);
/// assert_eq!(tagged.label("sk_live_4eC39HqLyjWDarjtT1zdp7dc"), format!("sk_live_{label}"));
///
/// assert_eq!(KeyLabels::raw().label("tenant-42"), "tenant-42");
/// let by_customer = KeyLabels::with(|key| format!("customer {}", key.len()));
/// assert_eq!(by_customer.label("abc"), "customer 3");
/// # Ok::<(), keyrate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct KeyLabels {
    show: Show,
    max_len: usize,
    /// The type tags a fingerprint shows (see
    /// [`with_type_tags`](Self::with_type_tags)); none by default.
    tags: Arc<[String]>,
}

#[derive(Clone)]
enum Show {
    /// Under this secret, or the process's default (`None`), read when a
    /// label is made.
    Fingerprint(Option<Secret>),
    Raw,
    With(Arc<dyn Fn(&str) -> String + Send + Sync>),
}

impl Default for KeyLabels {
    /// [`KeyLabels::fingerprint`].
    fn default() -> Self {
        Self::fingerprint()
    }
}

impl fmt::Debug for KeyLabels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        let show = match &self.show {
            Show::Fingerprint(None) => "fingerprint (default secret)",
            Show::Fingerprint(Some(_)) => "fingerprint (own secret)",
            Show::Raw => "raw",
            Show::With(_) => "caller's function",
        };
        f.debug_struct("KeyLabels")
            .field("show", &show)
            .field("max_len", &self.max_len)
            .finish()
    }
}

impl KeyLabels {
    /// Fingerprints under the process's default secret (see
    /// [`set_default_secret`](Self::set_default_secret)): the default.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::KeyLabels;
    ///
    /// let labels = KeyLabels::fingerprint();
    /// assert_eq!(labels.label("sk_test_abcdefgh"), labels.label("sk_test_abcdefgh"));
    /// assert_ne!(labels.label("sk_test_abcdefgh"), labels.label("sk_test_abcdefgi"));
    /// ```
    #[must_use]
    pub fn fingerprint() -> Self {
        KeyLabels::showing(Show::Fingerprint(None))
    }

    /// Fingerprints under a secret of the caller's (any bytes, at least
    /// [`MIN_LABEL_SECRET_LEN`] of them, random). Processes given the
    /// same secret show a key alike.
    ///
    /// # Errors
    ///
    /// [`ConfigError::SecretTooShort`] for a secret under
    /// [`MIN_LABEL_SECRET_LEN`] bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConfigError, KeyLabels};
    ///
    /// let a = KeyLabels::fingerprint_with_secret(b"0123456789abcdef")?;
    /// let b = KeyLabels::fingerprint_with_secret(b"another secret!!")?;
    /// assert_ne!(a.label("sk_live_xyz123456"), b.label("sk_live_xyz123456"));
    /// assert_eq!(
    ///     KeyLabels::fingerprint_with_secret(b"short").unwrap_err(),
    ///     ConfigError::SecretTooShort { len: 5 },
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn fingerprint_with_secret(secret: &[u8]) -> Result<Self, ConfigError> {
        Ok(KeyLabels::showing(Show::Fingerprint(Some(
            Secret::checked(secret)?,
        ))))
    }

    /// The raw key (cut to the maximum length): only for keys that are
    /// not secrets, such as tenant ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::KeyLabels;
    ///
    /// assert_eq!(KeyLabels::raw().label("tenant-7"), "tenant-7");
    /// assert_eq!(KeyLabels::raw().label(&"x".repeat(100)).len(), 64);
    /// ```
    #[must_use]
    pub fn raw() -> Self {
        KeyLabels::showing(Show::Raw)
    }

    /// The caller's own function of the key (say, key -> customer id),
    /// cut to the maximum length. Keys the function maps to the same
    /// label are counted as one in exported offender lists.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::KeyLabels;
    ///
    /// let labels = KeyLabels::with(|key| match key {
    ///     "sk_live_abc" | "sk_live_def" => "acme".to_owned(),
    ///     _ => "unknown".to_owned(),
    /// });
    /// assert_eq!(labels.label("sk_live_def"), "acme");
    /// ```
    #[must_use]
    pub fn with(label: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        KeyLabels::showing(Show::With(Arc::new(label)))
    }

    fn showing(show: Show) -> Self {
        KeyLabels {
            show,
            max_len: MAX_KEY_LABEL_LEN,
            tags: Arc::from([]),
        }
    }

    /// Shows a fingerprinted key's type tag before its hash when the key
    /// starts with one of `tags` (the longest that fits), and the tag is at
    /// most half the key: `sk_live_#...` for `sk_live_4eC3...` with
    /// `sk_live_` listed. List only tags that all your keys of that kind
    /// share (they are then no secret); a key that starts with none of
    /// them shows its hash alone. Raw keys and the caller's function are
    /// not changed.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::KeyLabels;
    ///
    /// let labels = KeyLabels::fingerprint().with_type_tags(["sk_live_", "sk_test_"]);
    /// assert!(labels.label("sk_test_4eC39HqLyjWDarjtT1zdp7dc").starts_with("sk_test_#"));
    /// assert!(labels.label("x7Qp2_Lm9z_rT4vB8nK1sW3e").starts_with('#'));
    /// // A tag longer than half the key would show most of it.
    /// assert!(labels.label("sk_live_abc").starts_with('#'));
    /// ```
    #[must_use]
    pub fn with_type_tags<T: Into<String>>(mut self, tags: impl IntoIterator<Item = T>) -> Self {
        let mut tags: Vec<String> = tags.into_iter().map(Into::into).collect();
        // Longest first: the first tag that fits is the longest.
        tags.sort_by_key(|tag| std::cmp::Reverse(tag.len()));
        self.tags = tags.into();
        self
    }

    /// Cuts labels to `max_len` bytes (at a character boundary) instead of
    /// [`MAX_KEY_LABEL_LEN`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::KeyLabels;
    ///
    /// assert_eq!(KeyLabels::raw().with_max_len(4).label("tenant-7"), "tena");
    /// ```
    #[must_use]
    pub fn with_max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// How `key` is shown.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::KeyLabels;
    ///
    /// let label = KeyLabels::fingerprint().label("ci-abuser");
    /// assert!(label.starts_with('#') && label.len() == 17); // no prefix
    /// ```
    #[must_use]
    pub fn label(&self, key: &str) -> String {
        let mut label = match &self.show {
            Show::Fingerprint(secret) => {
                let secret = secret.unwrap_or_else(default_secret);
                fingerprint(type_tag(key, &self.tags), secret.hash(key))
            }
            Show::Raw => key.to_owned(),
            Show::With(label) => label(key),
        };
        truncate(&mut label, self.max_len);
        label
    }

    /// Sets the process's default secret, which
    /// [`fingerprint`](Self::fingerprint) and every `Debug` of a key use.
    /// Call it at startup, before any key is shown: the first fingerprint
    /// made without it fixes a random secret for the life of the process.
    ///
    /// Returns `Ok(false)`, and changes nothing, if the default secret was
    /// already fixed (by an earlier call, or by a first use).
    ///
    /// # Errors
    ///
    /// [`ConfigError::SecretTooShort`], changing nothing, for a secret
    /// under [`MIN_LABEL_SECRET_LEN`] bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConfigError, KeyLabels};
    ///
    /// // At startup, from the operator's configuration:
    /// assert!(KeyLabels::set_default_secret(b"")
    ///     .is_err_and(|e| e == ConfigError::SecretTooShort { len: 0 }));
    /// let first = KeyLabels::set_default_secret(b"shared by the fleet")?;
    /// assert!(first);
    /// assert!(!KeyLabels::set_default_secret(b"too late, though long")?);
    /// assert_eq!(
    ///     KeyLabels::fingerprint().label("sk_live_abcdef123"),
    ///     KeyLabels::fingerprint_with_secret(b"shared by the fleet")?.label("sk_live_abcdef123"),
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn set_default_secret(secret: &[u8]) -> Result<bool, ConfigError> {
        let secret = Secret::checked(secret)?;
        let mut set = false;
        DEFAULT_SECRET.get_or_init(|| {
            set = true;
            secret
        });
        Ok(set)
    }
}

/// A SipHash key.
#[derive(Clone, Copy)]
struct Secret([u8; 16]);

/// The process's default secret: set once, or drawn at random on first use.
static DEFAULT_SECRET: OnceLock<Secret> = OnceLock::new();

fn default_secret() -> Secret {
    *DEFAULT_SECRET.get_or_init(Secret::random)
}

impl Secret {
    /// A 128-bit key from any bytes: SipHash-1-3-128 of them under a fixed
    /// key (domain separation), so every process derives the same key
    /// from the same secret.
    fn derive(secret: &[u8]) -> Secret {
        debug_assert!(secret.len() >= MIN_LABEL_SECRET_LEN);
        // "keyrate key lab" "el secret v1.."
        let mut hasher =
            SipHasher13x128::new_with_keys(0x6b65_7972_6174_6520, 0x6c61_6265_6c20_7631);
        hasher.write(secret);
        Secret(hasher.finish128().as_bytes())
    }

    /// [`derive`](Self::derive), for a secret of at least
    /// [`MIN_LABEL_SECRET_LEN`] bytes.
    fn checked(secret: &[u8]) -> Result<Secret, ConfigError> {
        if secret.len() < MIN_LABEL_SECRET_LEN {
            return Err(ConfigError::SecretTooShort { len: secret.len() });
        }
        Ok(Secret::derive(secret))
    }

    /// 128 random bits: std's `RandomState` is seeded from the operating
    /// system's randomness once per thread; two of them (their keys differ)
    /// hash a constant to two unpredictable words.
    fn random() -> Secret {
        let [a, b] = [RandomState::new(), RandomState::new()].map(|s| s.hash_one(0x6b65_7972_u64));
        let mut key = [0; 16];
        key[..8].copy_from_slice(&a.to_le_bytes());
        key[8..].copy_from_slice(&b.to_le_bytes());
        Secret(key)
    }

    /// SipHash-1-3 of `key` (through its `Hash`) under this secret.
    fn hash<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        let mut hasher = SipHasher13::new_with_key(&self.0);
        key.hash(&mut hasher);
        hasher.finish()
    }
}

/// `prefix#` and the hash in 16 hex digits.
fn fingerprint(prefix: &str, hash: u64) -> String {
    format!("{prefix}#{hash:016x}")
}

/// The longest of `tags` (longest first) that `key` starts with and that
/// is at most half of it, or `""`.
fn type_tag<'t>(key: &str, tags: &'t [String]) -> &'t str {
    tags.iter()
        .find(|tag| key.starts_with(tag.as_str()) && 2 * tag.len() <= key.len())
        .map_or("", String::as_str)
}

/// Cuts `label` to at most `max_len` bytes, at a character boundary.
fn truncate(label: &mut String, max_len: usize) {
    if label.len() > max_len {
        let mut end = max_len;
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        label.truncate(end);
    }
}

/// A key, shown by `Debug` as its fingerprint under the default secret
/// and with no type tag: for a string key, the same text as
/// [`KeyLabels::fingerprint`]'s label, quoted.
pub(crate) struct Shown<'a, K: ?Sized>(pub(crate) &'a K);

impl<K: Hash + ?Sized> fmt::Debug for Shown<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&fingerprint("", default_secret().hash(self.0)), f)
    }
}

#[cfg(test)]
mod tests;

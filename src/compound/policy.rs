//! A policy: the quotas one key is held to at once.

use crate::error::ConfigError;
use crate::gcra::Quota;
use crate::sync::unmodeled::{AtomicU64, Relaxed};
use std::fmt;

/// The most quotas a [`Policy`] holds.
pub const MAX_QUOTAS: usize = 8;

/// Several quotas held at once by one key: a call is admitted only if
/// every quota's bucket holds its cost, and then spends it from every one.
///
/// Quota `i` of a policy is charged to word `i` of the key's compound
/// bucket, so a key should keep one policy (or policies whose quotas keep
/// their places): a key whose policy changes keeps its words, read under
/// the new quotas.
///
/// # Examples
///
/// ```
/// use keyrate::{ConfigError, Policy, Quota};
///
/// // 20/s with bursts of 40, and 50,000 a day.
/// let policy = Policy::new([
///     Quota::new(20.0, 40).unwrap(),
///     Quota::new(50_000.0 / 86_400.0, 50_000).unwrap(),
/// ])
/// .unwrap();
/// assert_eq!(policy.quotas().len(), 2);
/// assert_eq!(Policy::new([]), Err(ConfigError::EmptyPolicy));
/// ```
#[derive(Clone)]
pub struct Policy {
    /// 1 to [`MAX_QUOTAS`] quotas, in the caller's order.
    quotas: Vec<Quota>,
    /// This policy's own number, shared only with its clones (which hold
    /// the same quotas): a thread's cache of hot cells tells a policy it
    /// decided on before by it, without comparing quotas.
    id: u64,
    /// The least capacity over the quotas: a cost up to it fits them all.
    least_capacity: u64,
}

/// Numbers policies; never reused.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Policies are equal when their quotas are, in order.
impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.quotas == other.quotas
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("quotas", &self.quotas)
            .finish()
    }
}

impl Policy {
    /// Makes a policy of `quotas`, in that order (a denial names a quota
    /// by its index here).
    ///
    /// # Errors
    ///
    /// [`ConfigError::EmptyPolicy`] for no quota,
    /// [`ConfigError::TooManyQuotas`] for more than [`MAX_QUOTAS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{ConfigError, Policy, Quota};
    ///
    /// let quota = Quota::new(1.0, 1).unwrap();
    /// assert!(Policy::new([quota]).is_ok());
    /// assert_eq!(
    ///     Policy::new([quota; 9]),
    ///     Err(ConfigError::TooManyQuotas { count: 9 })
    /// );
    /// ```
    pub fn new(quotas: impl IntoIterator<Item = Quota>) -> Result<Self, ConfigError> {
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        match quotas.len() {
            0 => Err(ConfigError::EmptyPolicy),
            count if count > MAX_QUOTAS => Err(ConfigError::TooManyQuotas { count }),
            _ => Ok(Policy::of(quotas)),
        }
    }

    /// The quotas, in the order given.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{Policy, Quota};
    ///
    /// let quota = Quota::new(2.0, 4).unwrap();
    /// assert_eq!(Policy::new([quota]).unwrap().quotas(), &[quota]);
    /// ```
    #[must_use]
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// This policy's number (see `id`).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The least capacity over the quotas: every quota can hold a cost up
    /// to it.
    #[inline]
    pub(crate) fn least_capacity(&self) -> u64 {
        self.least_capacity
    }

    /// A policy of `quotas` (1 to [`MAX_QUOTAS`]), newly numbered.
    fn of(quotas: Vec<Quota>) -> Self {
        Policy {
            least_capacity: quotas.iter().map(Quota::capacity).min().unwrap_or(0),
            quotas,
            // Relaxed: only uniqueness matters, and fetch_add gives it.
            id: NEXT_ID.fetch_add(1, Relaxed),
        }
    }
}

impl From<Quota> for Policy {
    /// A policy of one quota.
    fn from(quota: Quota) -> Self {
        Policy::of(vec![quota])
    }
}

//! A policy: the quotas one key is held to at once.

use crate::error::ConfigError;
use crate::gcra::Quota;

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
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// 1 to [`MAX_QUOTAS`] quotas, in the caller's order.
    quotas: Vec<Quota>,
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
            _ => Ok(Policy { quotas }),
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
}

impl From<Quota> for Policy {
    /// A policy of one quota.
    fn from(quota: Quota) -> Self {
        Policy {
            quotas: vec![quota],
        }
    }
}

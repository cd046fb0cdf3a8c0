//! Why a Redis limiter refused a compound call.

use super::super::error::RedisLimiterError;
use crate::compound::{CompoundDenial, CompoundRefusal};
use std::fmt;

/// Why a Redis limiter did not admit a compound call: the decision's
/// [`CompoundDenial`] (Redis's, the deny mirror's, or the checks made
/// before any round trip), or Redis's failure under a fail-closed
/// [`FailurePolicy`](crate::FailurePolicy).
///
/// # Examples
///
/// ```
/// use keyrate::{CompoundDenial, CompoundRefusal, RedisCompoundDenial};
///
/// let denied = RedisCompoundDenial::from(CompoundDenial::NoScopes);
/// assert_eq!(denied.denial(), Some(&CompoundDenial::NoScopes));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisCompoundDenial {
    /// Decided: denied, and nothing was spent.
    Denied(CompoundDenial),
    /// Redis could not decide and the failure policy is `Closed`. A
    /// timeout may have come after the script ran (all of it, or none).
    Failed(RedisLimiterError),
}

impl From<CompoundDenial> for RedisCompoundDenial {
    fn from(denial: CompoundDenial) -> Self {
        RedisCompoundDenial::Denied(denial)
    }
}

impl fmt::Display for RedisCompoundDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisCompoundDenial::Denied(denial) => denial.fmt(f),
            RedisCompoundDenial::Failed(err) => write!(f, "refused (fail closed): {err}"),
        }
    }
}

impl std::error::Error for RedisCompoundDenial {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisCompoundDenial::Denied(denial) => Some(denial),
            RedisCompoundDenial::Failed(err) => Some(err),
        }
    }
}

impl CompoundRefusal for RedisCompoundDenial {
    fn denial(&self) -> Option<&CompoundDenial> {
        match self {
            RedisCompoundDenial::Denied(denial) => Some(denial),
            RedisCompoundDenial::Failed(_) => None,
        }
    }
}

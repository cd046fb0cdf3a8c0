//! A default quota that can be replaced while other threads read it.

use crate::gcra::Quota;
use crossbeam_utils::atomic::AtomicCell;
use std::fmt;

/// The default quota of a limiter, shared with its handles.
pub(crate) struct LiveQuota {
    /// Replaced whole by `store`. `Quota` is 32 bytes, so the cell is a
    /// sequence lock: a load reads optimistically and writes nothing, and
    /// retries only if a store ran meanwhile.
    quota: AtomicCell<Quota>,
}

impl LiveQuota {
    pub(crate) fn new(quota: Quota) -> Self {
        LiveQuota {
            quota: AtomicCell::new(quota),
        }
    }

    #[inline]
    pub(crate) fn load(&self) -> Quota {
        self.quota.load()
    }

    pub(crate) fn store(&self, quota: Quota) {
        self.quota.store(quota);
    }
}

impl fmt::Debug for LiveQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.load().fmt(f)
    }
}

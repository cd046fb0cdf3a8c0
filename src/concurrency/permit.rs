//! A held permit: one of the streams its key may hold open at once.

use super::slot::Slot;
use crate::sync::Arc;
use std::fmt;

/// One permit of a key: held until dropped, then given back exactly once.
///
/// It holds its key's slot (an `Arc`), not the limiter, so it can outlive
/// the limiter and move to any thread or task (say, for a WebSocket
/// stream's life). Dropped after its limiter, it gives its permit back to
/// a slot no limiter reaches any more, which then frees its memory with
/// the last permit: nothing leaks and nothing else happens.
///
/// # Examples
///
/// ```
/// use keyrate::ConcurrencyLimiter;
///
/// let limiter = ConcurrencyLimiter::new(2);
/// let first = limiter.try_acquire("k").unwrap();
/// let second = limiter.try_acquire("k").unwrap();
/// assert!(limiter.try_acquire("k").is_err());
/// drop(first);
/// assert_eq!(limiter.held("k"), 1);
/// let third = std::thread::spawn(move || drop(second)); // Send
/// third.join().unwrap();
/// assert_eq!(limiter.held("k"), 0);
/// ```
#[must_use = "a permit is given back as soon as it is dropped"]
pub struct Permit {
    slot: Arc<Slot>,
}

impl Permit {
    /// A permit already counted in `slot`.
    pub(super) fn new(slot: Arc<Slot>) -> Self {
        Permit { slot }
    }

    /// The permits its key holds now, this one included (while the
    /// limiter lives; afterwards, those still held of the same key).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(3);
    /// let _a = limiter.try_acquire("k").unwrap();
    /// let b = limiter.try_acquire("k").unwrap();
    /// assert_eq!(b.held(), 2);
    /// ```
    #[must_use]
    pub fn held(&self) -> u32 {
        self.slot.held()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.slot.release();
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No key here: a permit does not know it, and need not show it.
        f.debug_struct("Permit")
            .field("held", &self.slot.held())
            .finish()
    }
}

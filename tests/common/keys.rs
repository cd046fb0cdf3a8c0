//! Key types whose own code panics, for the tests that a limiter loses
//! nothing when a key's `Clone`, `Hash` or `Drop` unwinds through it.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

/// A key whose `Clone` panics for the name `"boom"`: a limiter copies a
/// new key as the last step before storing its bucket.
#[derive(Debug, Hash, PartialEq, Eq)]
pub struct Touchy(pub &'static str);

impl Clone for Touchy {
    fn clone(&self) -> Self {
        assert_ne!(self.0, "boom", "this key's clone panics");
        Touchy(self.0)
    }
}

/// Whether a stored copy of `DropsBadly` id 0 has panicked yet (once per
/// test binary: one test in each uses it).
static DROP_PANICKED: AtomicBool = AtomicBool::new(false);

/// A key whose copy of id 0 (the limiter's: made by `Clone`) panics once
/// when dropped, as on eviction; the caller's own keys never do.
#[derive(Debug)]
pub struct DropsBadly {
    pub id: u64,
    stored: bool,
}

impl DropsBadly {
    /// The caller's key `id`.
    pub fn new(id: u64) -> Self {
        DropsBadly { id, stored: false }
    }
}

impl Clone for DropsBadly {
    fn clone(&self) -> Self {
        DropsBadly {
            id: self.id,
            stored: true,
        }
    }
}

impl PartialEq for DropsBadly {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for DropsBadly {}

impl std::hash::Hash for DropsBadly {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl Drop for DropsBadly {
    fn drop(&mut self) {
        if self.stored && self.id == 0 && !DROP_PANICKED.swap(true, SeqCst) {
            panic!("this key's drop panics");
        }
    }
}

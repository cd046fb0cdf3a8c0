//! Key types whose own code panics, for the tests that a limiter loses
//! nothing when a key's `Clone`, `Hash` or `Drop` unwinds through it.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

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

/// A key whose copies made by `Clone` (the limiter's) panic when
/// dropped, as on eviction, the first time one of them is, if the key
/// was made with [`boom`](Self::boom); the caller's own keys never do.
#[derive(Debug)]
pub struct DropsBadly {
    pub id: u64,
    stored: bool,
    /// Shared by a key and its copies: set once one of them has panicked.
    fuse: Option<Arc<AtomicBool>>,
}

impl DropsBadly {
    /// The caller's key `id`, whose copies drop quietly.
    pub fn new(id: u64) -> Self {
        DropsBadly {
            id,
            stored: false,
            fuse: None,
        }
    }

    /// The caller's key `id`, whose first copy to be dropped panics.
    pub fn boom(id: u64) -> Self {
        DropsBadly {
            fuse: Some(Arc::new(AtomicBool::new(false))),
            ..DropsBadly::new(id)
        }
    }

    /// Key `id` of a flood whose first key (0) is [`boom`](Self::boom)'s
    /// and every other quiet.
    pub fn in_flood(id: u64) -> Self {
        match id {
            0 => DropsBadly::boom(0),
            _ => DropsBadly::new(id),
        }
    }
}

impl Clone for DropsBadly {
    fn clone(&self) -> Self {
        DropsBadly {
            id: self.id,
            stored: true,
            fuse: self.fuse.clone(),
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
        let blown = |fuse: &Arc<AtomicBool>| !fuse.swap(true, SeqCst);
        if self.stored && self.fuse.as_ref().is_some_and(blown) {
            panic!("this key's drop panics");
        }
    }
}

/// Whether `f` panics: the calls above unwind through the limiter, which
/// must come out of it whole.
pub fn panics<R>(f: impl FnOnce() -> R) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err()
}

/// A key whose copies made by `Clone` (the limiter's) panic when hashed
/// while `armed` is set, as when a sweep hashes a key it evicts; the
/// caller's own keys never do.
#[derive(Debug)]
pub struct HashesBadly {
    pub id: u64,
    stored: bool,
    armed: Arc<AtomicBool>,
}

impl HashesBadly {
    /// The caller's key `id`, whose copies panic when hashed once `armed`.
    pub fn new(id: u64, armed: &Arc<AtomicBool>) -> Self {
        HashesBadly {
            id,
            stored: false,
            armed: Arc::clone(armed),
        }
    }
}

impl Clone for HashesBadly {
    fn clone(&self) -> Self {
        HashesBadly {
            stored: true,
            armed: Arc::clone(&self.armed),
            ..*self
        }
    }
}

impl PartialEq for HashesBadly {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for HashesBadly {}

impl std::hash::Hash for HashesBadly {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.stored && self.armed.load(SeqCst) {
            panic!("this key's hash panics");
        }
        self.id.hash(state);
    }
}

//! Model 17: a call of two scopes denied on a lock-free snapshot of both
//! cells (cached in the calling thread) races another thread's admission
//! that spends on both: the denial is that of some sequential order, wait
//! and binding scope included. A snapshot that held one cell from before
//! the admission and the other from after would report a wait that
//! neither order gives.
//!
//! Under loom the caches are per model thread, off unless a limiter turns
//! them on, and a key is promoted on its second lookup through the map.
//! The limiters hash with a fixed hasher, so that every execution sees
//! the same vote slots and caches the same cells.

use crate::support::{model, quota, SEC};
use keyrate::loom_api::{self, Flaw};
use keyrate::{CompoundDenial, CompoundLimiter, Policy, Quota};
use loom::sync::Arc;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

const NOW: Duration = Duration::from_secs(10);

type Limiter = CompoundLimiter<String, BuildHasherDefault<DefaultHasher>>;

/// "k": one token every 3 s, capacity 2 (full). "g": 1 token/s, capacity
/// 3, holding 1.
struct Scopes {
    k: Policy,
    g: Policy,
}

impl Scopes {
    fn new() -> Self {
        let slow = Quota::with_interval(Duration::from_nanos(3 * SEC), 2).unwrap();
        Scopes {
            k: Policy::from(slow),
            g: Policy::from(quota(1.0, 3)),
        }
    }

    fn both(&self) -> [(&str, &Policy); 2] {
        [("k", &self.k), ("g", &self.g)]
    }

    /// A limiter where "g" has spent 2 and "k" nothing, both cells cached
    /// in the calling thread when `cache` is on: two calls on "g" alone
    /// (the second, of cost 0, promotes it), then two denied calls of both
    /// (cost 2), the second of which promotes "k".
    ///
    /// "g"'s cell is made first, so that it comes first in the global lock
    /// order (cells are ordered as they are made, under loom): then the
    /// admission holds "g" locked while "k" is still unlocked, and loom
    /// finds the broken twin's torn snapshot (it reads "k" before the
    /// admission, waits on "g", and reads it after). With "k" first, no
    /// schedule within the preemption bound showed the twin's torn read.
    fn limiter(&self, cache: bool) -> Limiter {
        let limiter = Limiter::with_hasher(BuildHasherDefault::default()).with_hot_key_cache(cache);
        assert!(limiter.check("g", &self.g, NOW, 2).is_ok());
        assert!(limiter.check("g", &self.g, NOW, 0).is_ok());
        for _ in 0..2 {
            assert!(limiter.check_scopes(&self.both(), NOW, 2).is_err());
        }
        if cache {
            for key in ["k", "g"] {
                assert!(
                    loom_api::compound_cached(&limiter, key),
                    "{key} is not cached"
                );
            }
        }
        limiter
    }
}

/// What a run comes to: the admission's outcome, the denial, the words of
/// "k" and of "g".
type Outcome = (bool, Result<(), CompoundDenial>, [u64; 8], [u64; 8]);

fn words(limiter: &Limiter) -> ([u64; 8], [u64; 8]) {
    let words = |key| loom_api::compound_words(limiter, key).unwrap();
    (words("k"), words("g"))
}

/// The admission (cost 1 on both) and the denial (cost 2 on both) one
/// after the other, `denial_first` or not, on a limiter without caches.
fn sequential(scopes: &Scopes, denial_first: bool) -> Outcome {
    let limiter = scopes.limiter(false);
    let deny = |l: &Limiter| l.check_scopes(&scopes.both(), NOW, 2).map(drop);
    let mut denial = Ok(());
    if denial_first {
        denial = deny(&limiter);
    }
    let admitted = limiter.check_scopes(&scopes.both(), NOW, 1).is_ok();
    if !denial_first {
        denial = deny(&limiter);
    }
    let (k, g) = words(&limiter);
    (admitted, denial, k, g)
}

/// The main thread's call of both scopes at cost 2 (served from its
/// cache: a snapshot, and a denial in either order) races another
/// thread's admission of cost 1 on both, through the map. Before the
/// admission "k" admits 2 and "g" binds, 1 s away; after it, "k" binds,
/// 3 s away ("g" would say 2 s). A snapshot of "k" before and "g" after
/// would say "g" in 2 s.
fn a_snapshot_races_an_admission() {
    let scopes = Arc::new(Scopes::new());
    let limiter = Arc::new(scopes.limiter(true));
    let admitter = {
        let (limiter, scopes) = (Arc::clone(&limiter), Arc::clone(&scopes));
        loom::thread::spawn(move || limiter.check_scopes(&scopes.both(), NOW, 1).is_ok())
    };
    // A step of the main thread's own before the snapshot, at which loom
    // may start the admitter (as in model 15).
    loom::thread::yield_now();
    let denial = limiter.check_scopes(&scopes.both(), NOW, 2).map(drop);
    let admitted = admitter.join().expect("the admitter panicked");
    let (k, g) = words(&limiter);
    let outcome = (admitted, denial, k, g);
    // The oracle runs after the race, adding no steps to it.
    let allowed = [sequential(&scopes, true), sequential(&scopes, false)];
    assert!(
        allowed.contains(&outcome),
        "a torn snapshot: {outcome:?} is no sequential order's: {allowed:?}"
    );
}

#[test]
fn compound_snapshots_are_consistent() {
    model(
        "17 compound: a cached denial of two scopes vs an admission on both",
        a_snapshot_races_an_admission,
    );
}

#[test]
#[should_panic(expected = "a torn snapshot")]
fn broken_compound_snapshot_cell_by_cell() {
    loom_api::with_flaw(Flaw::CompoundSnapshotCellByCell, || {
        model(
            "17 broken: the snapshot reads each cell on its own",
            a_snapshot_races_an_admission,
        )
    });
}

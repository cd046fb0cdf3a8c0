//! Model 3: the first use of a key, raced.
//!
//! These models run the real `TokenBucketLimiter` code. Under `cfg(loom)`
//! its store (`src/store.rs`) is one loom `RwLock<HashMap>` standing in for
//! a single DashMap shard, so the real insert protocol runs over a lock
//! loom can see: a write-locked lookup and spend, then, for a missing key,
//! `entry().or_insert_with()` and the spend under the write lock.
//!
//! What the models assume about DashMap (as it documents): every key lives
//! in one shard; `get` holds that shard's read lock for as long as the
//! returned `Ref` lives; `entry` holds its write lock for as long as the
//! returned entry lives; and the write lock excludes every reader of the
//! shard. Keys in other shards take other locks and cannot interfere with
//! this key, so one shard (one lock) is all a model of one key needs. loom
//! cannot check DashMap's own lock implementation.
//!
//! In every interleaving exactly one bucket results (`len() == 1`) and
//! exactly `capacity` tokens are admitted across the racing threads.

use crate::support::model;
use keyrate::TokenBucketLimiter;
use loom::sync::Arc;

/// Spawns one thread per entry of `calls`, each making that many unit
/// calls on the fresh key "k" at t = 0; returns the admitted count.
fn race_first_use(limiter: &Arc<TokenBucketLimiter>, calls: &[usize]) -> usize {
    let threads: Vec<_> = calls
        .iter()
        .map(|&n| {
            let limiter = Arc::clone(limiter);
            loom::thread::spawn(move || (0..n).filter(|_| limiter.allow("k", 0.0)).count())
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().expect("a caller panicked"))
        .sum()
}

#[test]
fn two_threads_race_the_first_call() {
    model("3 first use, 2 threads x 2 calls, capacity 3", || {
        let limiter = Arc::new(TokenBucketLimiter::new(1.0, 3));
        let admitted = race_first_use(&limiter, &[2, 2]);
        assert_eq!(limiter.len(), 1, "exactly one bucket for the key");
        assert_eq!(admitted, 3, "exactly capacity admitted");
        assert_eq!(limiter.remaining("k", 0.0), Ok(0));
    });
}

#[test]
fn three_threads_race_the_first_call() {
    model("3 first use, 3 threads x 1 call, capacity 2", || {
        let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2));
        let admitted = race_first_use(&limiter, &[1, 1, 1]);
        assert_eq!(limiter.len(), 1, "exactly one bucket for the key");
        assert_eq!(admitted, 2, "exactly capacity admitted");
        assert_eq!(limiter.remaining("k", 0.0), Ok(0));
    });
}

#[test]
fn a_handle_races_keyed_calls_on_a_fresh_key() {
    model("3 first use, handle vs 2 keyed calls, capacity 2", || {
        // `bucket()` moves an inline bucket's word into a shared one under
        // the write lock; keyed spends that race it must land on exactly
        // one of the two, never on a copy that is then thrown away.
        let limiter = Arc::new(TokenBucketLimiter::new(1.0, 2));
        let handle_thread = {
            let limiter = Arc::clone(&limiter);
            loom::thread::spawn(move || {
                let handle = limiter.bucket("k");
                let admitted = usize::from(handle.allow(0.0));
                (handle, admitted)
            })
        };
        let keyed = race_first_use(&limiter, &[2]);
        let (handle, by_handle) = handle_thread.join().expect("the handle thread panicked");
        assert_eq!(limiter.len(), 1, "exactly one bucket for the key");
        assert_eq!(keyed + by_handle, 2, "exactly capacity admitted");
        assert_eq!(limiter.remaining("k", 0.0), Ok(0));
        assert_eq!(
            handle.remaining(0.0),
            Ok(0),
            "the handle shares the map's bucket"
        );
    });
}

/// The real limiter, with its map's insert broken
/// (`Flaw::InsertWithoutRecheck`): the lookup of a new key and its insert
/// take the shard lock twice, so the second of two racing first calls
/// overwrites the first one's bucket, spends from its own and admits past
/// the capacity.
#[test]
#[should_panic(expected = "exactly capacity admitted")]
fn broken_insert_without_recheck_admits_twice() {
    keyrate::loom_api::with_flaw(keyrate::loom_api::Flaw::InsertWithoutRecheck, || {
        model("3 broken: real limiter, insert without recheck", || {
            let limiter = Arc::new(TokenBucketLimiter::new(1.0, 1));
            let admitted = race_first_use(&limiter, &[1, 1]);
            assert_eq!(limiter.len(), 1, "exactly one bucket for the key");
            assert_eq!(admitted, 1, "exactly capacity admitted");
        });
    });
}

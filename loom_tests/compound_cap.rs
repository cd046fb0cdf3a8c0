//! Model 18: at the cap, a call for a new key makes room by sweeping the
//! shard whose bound (the instant from which one of its cells can be
//! full) has come, racing a spend on the key that holds the only place.
//! The bound was set when that key's bucket was made; the spend makes it
//! stale. The outcome is one of the two sequential orders': the spend
//! first (the bucket is no longer full, the new key is refused), or the
//! new key first (it takes the full bucket's place, and the old key, now
//! new, is refused). Never both admitted: that loses the spend.

use crate::support::{model, quota};
use keyrate::loom_api::{self, Flaw};
use keyrate::{CompoundDenial, CompoundLimiter, Policy};
use loom::sync::Arc;
use std::time::Duration;

const NOW: Duration = Duration::from_secs(10);

fn a_spend_races_a_new_key_at_the_cap() {
    // 1 token/s, capacity 1: "held" spent at 0 s is full again at 1 s.
    let policy = Policy::from(quota(1.0, 1));
    let limiter = Arc::new(CompoundLimiter::new().with_max_keys(1));
    assert!(limiter.check("held", &policy, Duration::ZERO, 1).is_ok());
    let newcomer = {
        let (limiter, policy) = (Arc::clone(&limiter), policy.clone());
        loom::thread::spawn(move || limiter.check("new", &policy, NOW, 1).map(drop))
    };
    let spent = limiter.check("held", &policy, NOW, 1).map(drop);
    let arrived = newcomer.join().expect("the newcomer panicked");
    let full = Err(CompoundDenial::LimiterFull { max_keys: 1 });
    let (kept, refused) = match (spent, arrived) {
        (Ok(()), denial) if denial == full => ("held", "new"),
        (denial, Ok(())) if denial == full => ("new", "held"),
        other => panic!("no sequential order gives {other:?}"),
    };
    assert_eq!(limiter.len(), 1);
    assert!(loom_api::compound_words(&limiter, refused).is_none());
    assert_eq!(
        limiter.remaining(kept, &policy, NOW),
        Ok(0),
        "{kept}'s spend is in its bucket"
    );
}

#[test]
fn compound_room_at_the_cap_never_loses_a_spend() {
    model(
        "18 compound: room at the cap vs a spend",
        a_spend_races_a_new_key_at_the_cap,
    );
}

#[test]
#[should_panic(expected = "no sequential order gives")]
fn broken_compound_room_trusting_the_bound() {
    loom_api::with_flaw(Flaw::CompoundRoomTrustsBound, || {
        model(
            "18 broken: room made on the bound alone",
            a_spend_races_a_new_key_at_the_cap,
        )
    });
}

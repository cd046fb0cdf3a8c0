//! What a refusal costs a `CompoundLimiter` at its cap (`with_max_keys`):
//! 100,000 keys held under a daily quota, none full again for a day's
//! fraction, then 1,000 calls for new keys, each refused `LimiterFull`.
//! Each refusal is timed; the run prints the mean and the worst.
//!
//! ```text
//! cargo bench --bench compound_cap
//! ```
//!
//! A refusal sweeps at most the one shard whose buckets can be full
//! soonest, and none while no bucket can be: it never pays for a pass
//! over the map (which it did before, milliseconds a refusal here).

use keyrate::{CompoundDenial, CompoundLimiter, Policy, Quota};
use std::time::Instant;

const HELD: usize = 100_000;
const REFUSED: usize = 1_000;

fn main() {
    let daily = Policy::from(Quota::new(50_000.0 / 86_400.0, 50_000).expect("a valid quota"));
    let limiter = CompoundLimiter::new().with_max_keys(HELD);
    for i in 0..HELD {
        let key = format!("sk_live_held_{i:024}");
        assert!(limiter.check(key.as_str(), &daily, 0.0, 1).is_ok());
    }
    // The new keys are made before the timed calls.
    let new: Vec<String> = (0..REFUSED)
        .map(|i| format!("sk_live_new_{i:025}"))
        .collect();
    let (mut total, mut worst) = (0u128, 0u128);
    for key in &new {
        let started = Instant::now();
        let refused = limiter.check(key.as_str(), &daily, 1.0, 1);
        let took = started.elapsed().as_nanos();
        assert!(matches!(refused, Err(CompoundDenial::LimiterFull { .. })));
        total += took;
        worst = worst.max(took);
    }
    println!(
        "{HELD} keys held, none full: {REFUSED} new keys refused, {:.0} ns a refusal on average, \
         worst {:.2} us",
        total as f64 / REFUSED as f64,
        worst as f64 / 1e3
    );
}

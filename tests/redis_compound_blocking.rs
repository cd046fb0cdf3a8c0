//! The blocking Redis limiter's compound calls (`Compound`): every answer
//! equals the in-memory `CompoundLimiter`'s on the same calls (random
//! policies, scopes, costs, backwards time, quota changes), and a placed
//! bucket's reset. Needs `KEYRATE_REDIS_URL` (see `redis_support`).
#![cfg(not(loom))]

mod compound_model;
mod redis_support;

use compound_model::{cases, changed, policy, quota, runner, T0};
use keyrate::{BlockingRedisLimiter, Compound, CompoundLimiter, CompoundRefusal, Policy, Quota};
use proptest::prelude::*;
use redis_support::{unique_prefix, TEST_TIMEOUT};
use std::time::Duration;

const SEC: u64 = 1_000_000_000;

/// The blocking limiter answers every call as the in-memory limiter does.
#[test]
fn blocking_answers_as_in_memory() {
    let url = redis_support::url();
    let base = BlockingRedisLimiter::connect_blocking(&url, Quota::new(1.0, 1).unwrap())
        .unwrap()
        .with_min_ttl(Duration::from_secs(3600))
        .with_timeout(TEST_TIMEOUT);
    let mut runner = runner();
    runner
        .run(&cases(), |(policies, calls)| {
            let redis = base.clone_with_prefix(unique_prefix("compound_blocking"));
            let memory = CompoundLimiter::new();
            let mut policies = policies;
            let mut built: Vec<Policy> = policies.iter().map(|qs| policy(qs)).collect();
            let names: Vec<String> = (0..built.len()).map(|k| format!("key{k}")).collect();
            let mut now = T0;
            for (scopes, step, cost, change) in calls {
                let scopes: Vec<usize> = scopes.into_iter().filter(|&k| k < built.len()).collect();
                if scopes.is_empty() {
                    continue;
                }
                if let Some(drawn) = change {
                    let k = scopes[0];
                    policies[k] = changed(&policies[k], &drawn);
                    built[k] = policy(&policies[k]);
                }
                now = now.checked_add_signed(step).unwrap();
                let at = Duration::from_nanos(now);
                let args: Vec<(&str, &Policy)> = scopes
                    .iter()
                    .map(|&k| (names[k].as_str(), &built[k]))
                    .collect();
                let want = memory.check_scopes(&args, at, cost);
                let got = Compound::check_scopes(&redis.placed("o"), &args, at, cost)
                    .map_err(|refusal| refusal.denial().copied().expect("decided"));
                prop_assert_eq!(got, want);
            }
            Ok(())
        })
        .unwrap();
}

/// The blocking limiter with its own namespace: a helper for the test
/// above, since `with_namespace` consumes the limiter and the blocking
/// connection is not `Clone`.
trait ClonePrefixed {
    fn clone_with_prefix(&self, prefix: String) -> BlockingRedisLimiter;
}

impl ClonePrefixed for BlockingRedisLimiter {
    fn clone_with_prefix(&self, prefix: String) -> BlockingRedisLimiter {
        BlockingRedisLimiter::connect_blocking(&redis_support::url(), self.quota())
            .unwrap()
            .with_namespace(prefix, keyrate::KeyNames::Encoded)
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(TEST_TIMEOUT)
    }
}

/// The blocking limiter's placed reset refills the key's placed bucket.
#[test]
fn blocking_placed_reset() {
    let limiter =
        BlockingRedisLimiter::connect_blocking(&redis_support::url(), Quota::new(1.0, 1).unwrap())
            .unwrap()
            .with_namespace(
                unique_prefix("compound_blocking_reset"),
                keyrate::KeyNames::Encoded,
            )
            .with_min_ttl(Duration::from_secs(3600))
            .with_timeout(TEST_TIMEOUT);
    let policy = Policy::new([quota(SEC, 2), quota(SEC, 4)]).unwrap();
    let at = Duration::from_nanos(T0);
    let placed = limiter.placed("o");
    assert!(placed.check_policy("k", &policy, at, 2).is_ok());
    assert!(placed.check_policy("k", &policy, at, 1).is_err());
    assert!(placed.reset_blocking("k").unwrap());
    assert_eq!(placed.remaining_policy("k", &policy, at).unwrap(), 2);
}

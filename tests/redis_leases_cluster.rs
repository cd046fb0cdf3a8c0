//! `RedisConcurrencyLimiter` on a real Redis Cluster
//! (`KEYRATE_REDIS_CLUSTER_URLS`, feature `redis-cluster`): lease sets
//! spread over slots and nodes, each call on one key; renewal rounds of
//! one call per lease set (or one for all with a hash tag) keep the
//! leases; releases empty the sets.
#![cfg(not(loom))]

mod lease_support;
mod redis_support;

use keyrate::{ConcurrencyDenial, KeyNames, RedisConcurrencyDenial, RedisConcurrencyLimiter};
use lease_support::until;
use redis_support::{cluster, cluster_urls, unique_prefix, TEST_TIMEOUT};
use std::time::Duration;

const KEYS: usize = 8;
const MAX: u32 = 2;

async fn run(hash_tag: bool) {
    let urls = cluster_urls();
    let namespace = unique_prefix("leases-cluster");
    let make = || async {
        RedisConcurrencyLimiter::with_connection(cluster(&urls).await, MAX)
            .unwrap()
            .with_namespace(&namespace, KeyNames::Encoded)
            .with_hash_tag(hash_tag)
            .with_lease_time(Duration::from_millis(900))
            .with_timeout(TEST_TIMEOUT)
    };
    // Two limiters, two cluster connections, one limit.
    let (a, b) = (make().await, make().await);
    let mut held = Vec::new();
    for key in 0..KEYS {
        let key = format!("tenant-{key}");
        held.push(a.try_acquire(&key).await.unwrap());
        held.push(b.try_acquire(&key).await.unwrap());
        for limiter in [&a, &b] {
            match limiter.try_acquire(&key).await {
                Err(RedisConcurrencyDenial::Denied(ConcurrencyDenial::AtLimit { held, max })) => {
                    assert_eq!((held, max), (MAX, MAX));
                }
                other => panic!("expected AtLimit on {key}, got {other:?}"),
            }
        }
    }
    // Past several lease times the leases are all still there: renewed.
    let rounds = a.stats().renew_rounds;
    until("three renewal rounds", || async {
        a.stats().renew_rounds >= rounds + 3
    })
    .await;
    for key in 0..KEYS {
        assert_eq!(a.held(&format!("tenant-{key}")).await.unwrap(), MAX);
    }
    let stats = a.stats();
    assert_eq!((stats.leases_lost, stats.renew_failures), (0, 0));
    // On a cluster: one call per set a round, or one for all with a tag.
    // Read between rounds (a round under way has counted calls sent, and
    // counts itself when done).
    let per_round = if hash_tag { 1 } else { KEYS as u64 };
    until(
        "calls = rounds x calls per round, between two rounds",
        || async {
            let stats = a.stats();
            stats.renew_calls == stats.renew_rounds * per_round
        },
    )
    .await;
    drop(held);
    until("every lease released", || async {
        let mut total = 0;
        for key in 0..KEYS {
            total += a.held(&format!("tenant-{key}")).await.unwrap();
        }
        total == 0
    })
    .await;
}

#[tokio::test]
async fn leases_on_a_cluster_one_key_per_call() {
    run(false).await;
}

#[tokio::test]
async fn leases_on_a_cluster_under_one_hash_tag() {
    run(true).await;
}

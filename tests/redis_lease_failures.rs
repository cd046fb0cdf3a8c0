//! `RedisConcurrencyLimiter` when things go wrong, on a real Redis
//! (`KEYRATE_REDIS_URL`, and `redis-server` for servers of the tests' own):
//! a process killed with its permits (they come back after the lease time
//! and not before), a Redis restart, and Redis's calls per renewal round.
//!
//! Every test names its own namespace (`unique_prefix`), or runs its own
//! server, so that two copies of this binary can run at once.
#![cfg(not(loom))]

mod lease_support;
mod redis_support;

use keyrate::{FailurePolicy, RedisConcurrencyDenial, RedisConcurrencyLimiter, RedisErrorKind};
use lease_support::{at_limit, limiter, snapshot, until};
use redis_support::{raw, unique_prefix, url, PrivateServer};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Not a test of its own: the child process of
/// `a_killed_process_loses_its_leases_after_the_lease_time_and_not_before`
/// (this binary, run again with `--ignored --exact` and
/// `KEYRATE_LEASE_CHILD` set). It takes the permits, says so on stdout,
/// and holds them until it is killed, or until its stdin closes (the
/// parent is gone: it must not outlive it). Ignored, so that a run of the
/// suite lists it as such rather than as a test that passed.
#[tokio::test]
#[ignore = "run by a_killed_process_loses_its_leases_after_the_lease_time_and_not_before, in a child process"]
async fn lease_child_process() {
    let spec = std::env::var("KEYRATE_LEASE_CHILD").expect(
        "not a test: the child process of \
         a_killed_process_loses_its_leases_after_the_lease_time_and_not_before, \
         which sets KEYRATE_LEASE_CHILD",
    );
    let mut parts = spec.split('\n');
    let (namespace, n) = (parts.next().unwrap(), parts.next().unwrap());
    let n: u32 = n.parse().unwrap();
    let limiter = limiter(&url(), namespace, n, Duration::from_secs(3)).await;
    let mut permits = Vec::new();
    for _ in 0..n {
        permits.push(
            limiter
                .try_acquire("victim")
                .await
                .expect("the child's permit"),
        );
    }
    println!("KEYRATE-CHILD-HELD");
    // Until killed, or until the parent's end of stdin closes.
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await
        .unwrap()
        .unwrap();
    drop(permits);
}

/// The child process, killed and reaped however the test ends: a failed
/// assertion before the test's own kill must not leave it running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_killed_process_loses_its_leases_after_the_lease_time_and_not_before() {
    const N: u32 = 3;
    let url = url();
    let namespace = unique_prefix("leases-kill");
    let parent = limiter(&url, &namespace, N, Duration::from_secs(3)).await;
    let set = parent.lease_key("victim");
    let mut conn = raw(&url).await;

    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "lease_child_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("KEYRATE_LEASE_CHILD", format!("{namespace}\n{N}"))
            .env("KEYRATE_REDIS_URL", &url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("re-run this test binary as the child"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (said, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line.contains("KEYRATE-CHILD-HELD") {
                let _ = said.send(());
            }
        }
    });
    if heard.recv_timeout(Duration::from_secs(120)).is_err() {
        panic!("the child never said it held its permits");
    }

    // The child holds all N, and renews them: the expiries move on.
    let (_, first) = snapshot(&mut conn, &set).await;
    assert_eq!(first.len(), N as usize);
    let first_max = *first.iter().max().unwrap();
    until("the child renews its leases", || {
        let mut conn = conn.clone();
        let set = set.clone();
        async move {
            let (_, scores) = snapshot(&mut conn, &set).await;
            scores.len() == N as usize && scores.iter().all(|&s| s > first_max)
        }
    })
    .await;

    child.0.kill().expect("kill -9 the child");
    child.0.wait().unwrap();
    let (now, scores) = snapshot(&mut conn, &set).await;
    assert_eq!(
        scores.len(),
        N as usize,
        "the dead child's leases are still there"
    );
    let earliest = *scores.iter().min().unwrap();
    assert!(
        earliest > now,
        "expiry {earliest} ms is in the future of Redis's {now} ms"
    );

    // Right after the kill: refused while the leases live. (Admitted only
    // if this machine stalled past their expiry: then not before it.)
    match parent.try_acquire("victim").await {
        Err(denial) => assert_eq!(at_limit(Err(denial)), (N, N)),
        Ok(permit) => {
            let at = permit.acquired_at().unwrap().as_millis() as u64;
            assert!(
                at >= earliest,
                "admitted at {at} ms, before the expiry {earliest} ms"
            );
        }
    }
    // Then the permits come back, and not before the recorded expiry on
    // Redis's own clock.
    let mut taken = Vec::new();
    for _ in 0..3000 {
        if let Ok(permit) = parent.try_acquire("victim").await {
            let at = permit.acquired_at().unwrap().as_millis() as u64;
            assert!(
                at >= earliest,
                "admitted at {at} ms, before the expiry {earliest} ms"
            );
            taken.push(permit);
        }
        if taken.len() == N as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        taken.len(),
        N as usize,
        "the dead child's permits never all came back"
    );
    assert_eq!(parent.held("victim").await.unwrap(), N);
}

#[tokio::test]
async fn a_redis_restart_forgets_the_leases_and_the_limit_starts_afresh() {
    let mut server = PrivateServer::start();
    let url = server.url();
    let namespace = unique_prefix("leases-restart");
    let closed = limiter(&url, &namespace, 2, Duration::from_secs(3))
        .await
        .with_timeout(Duration::from_secs(2))
        .with_circuit_breaker(0, Duration::from_millis(50));
    let open = closed.clone().with_failure_policy(FailurePolicy::Open);
    let held = [
        closed.try_acquire("k").await.unwrap(),
        closed.try_acquire("k").await.unwrap(),
    ];
    assert_eq!(at_limit(closed.try_acquire("k").await), (2, 2));

    let port = server.port();
    server.kill();
    // Down: closed refuses with the failure, open admits without a lease.
    match closed.try_acquire("k").await {
        Err(RedisConcurrencyDenial::Failed(err)) => assert!(matches!(
            err.kind(),
            RedisErrorKind::Unavailable | RedisErrorKind::Timeout
        )),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(open.try_acquire("k").await.unwrap().is_degraded());

    // Back, empty (no persistence): the leases held are gone, so the key
    // admits its limit again beside the permits this process still holds,
    // and the next renewal finds those two lost.
    let _server = PrivateServer::start_on(port).expect("the port is free again");
    let mut again = Vec::new();
    for _ in 0..3000 {
        if let Ok(permit) = closed.try_acquire("k").await {
            again.push(permit);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(again.len(), 1, "Redis never answered again");
    again.push(closed.try_acquire("k").await.unwrap());
    assert_eq!(at_limit(closed.try_acquire("k").await), (2, 2));
    until("the renewal finds the old leases lost", || async {
        closed.stats().leases_lost == 2
    })
    .await;
    assert_eq!(closed.held("k").await.unwrap(), 2);
    drop(held); // releasing lost leases removes nothing
    drop(again);
    until("the new leases are released", || async {
        closed.held("k").await.unwrap() == 0
    })
    .await;
}

/// The commands the scripts run inside Redis: `INFO commandstats` counts
/// them as calls too, but no client sends them (the limiter sends
/// `EVALSHA`, `ZREM`, and once `SCRIPT LOAD` and `CLUSTER INFO`).
const IN_SCRIPTS: [&str; 7] = [
    "time",
    "zremrangebyscore",
    "zcard",
    "zadd",
    "zrange",
    "pexpireat",
    "zscore",
];

/// The calls clients made, by command, as Redis counted them (`INFO
/// commandstats`), but for `INFO` itself and the commands run inside
/// scripts.
async fn calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            if name == "info" || IN_SCRIPTS.contains(&name) {
                return None;
            }
            let calls = stats.split("calls=").nth(1)?;
            Some((
                name.to_owned(),
                calls.split(',').next()?.parse::<u64>().ok()?,
            ))
        })
        .collect()
}

/// The calls in `after` not in `before`, by command, and their sum.
fn since(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> (u64, Vec<(String, u64)>) {
    let made: Vec<(String, u64)> = after
        .iter()
        .map(|(name, &n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|&(_, n)| n > 0)
        .collect();
    (made.iter().map(|(_, n)| n).sum(), made)
}

#[tokio::test]
async fn one_redis_call_per_renewal_round_however_many_permits() {
    const ROUNDS: u64 = 6;
    // A server of its own: nobody else's calls in its counts.
    let server = PrivateServer::start();
    let url = server.url();
    let namespace = unique_prefix("leases-calls");
    let lease = Duration::from_millis(900);
    let limiter = limiter(&url, &namespace, 100, lease).await;
    let mut conn = raw(&url).await;
    for permits in [1_usize, 50] {
        let mut held = Vec::new();
        for i in 0..permits {
            held.push(
                limiter
                    .try_acquire(&format!("key-{}", i % 10))
                    .await
                    .unwrap(),
            );
        }
        // Counted from the end of a round after the first (which also asks
        // CLUSTER INFO once and loads the script: once per process).
        let start = limiter.stats().renew_rounds;
        until("a first round", || async {
            limiter.stats().renew_rounds > start
        })
        .await;
        let (r0, c0) = stable(&limiter, &mut conn).await;
        until("the rounds run", || async {
            limiter.stats().renew_rounds >= r0 + ROUNDS
        })
        .await;
        let (r1, c1) = stable(&limiter, &mut conn).await;
        let (made, by_command) = since(&c0, &c1);
        assert_eq!(
            made,
            r1 - r0,
            "one call per round for {permits} permits: {by_command:?}"
        );
        let per_minute = 60.0 / (lease.as_secs_f64() / 3.0);
        println!(
            "{permits} permits held: {made} calls ({by_command:?}) in {} rounds; lease {lease:?}: \
             {per_minute:.0} calls a minute for the process, {:.2} per held permit; with the \
             default 15 s lease: 12 a minute, {:.2} per permit",
            r1 - r0,
            per_minute / permits as f64,
            12.0 / permits as f64
        );
        drop(held);
        until("released", || async { limiter.stats().held == 0 }).await;
    }
    assert_eq!(limiter.stats().leases_lost, 0);
}

/// The renewal rounds done and Redis's call count, read while no round is
/// under way: the limiter's rounds and renew calls are the same before and
/// after the read, and equal (a round under way has sent its call and not
/// counted itself).
async fn stable(
    limiter: &RedisConcurrencyLimiter,
    conn: &mut redis::aio::MultiplexedConnection,
) -> (u64, std::collections::BTreeMap<String, u64>) {
    for _ in 0..3000 {
        let before = limiter.stats();
        let calls = calls(conn).await;
        let after = limiter.stats();
        let quiet = (before.renew_rounds, before.renew_calls)
            == (after.renew_rounds, after.renew_calls)
            && after.renew_calls == after.renew_rounds;
        if quiet {
            return (after.renew_rounds, calls);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never a moment without a round under way (more than one call per round?)");
}

#[tokio::test]
async fn a_breaker_shared_with_the_rate_limiter_fails_acquires_fast() {
    let mut server = PrivateServer::start();
    let url = server.url();
    let rate = keyrate::RedisLimiter::connect(&url, keyrate::Quota::new(1.0, 5).unwrap())
        .await
        .unwrap()
        .with_namespace(unique_prefix("leases-breaker"), keyrate::KeyNames::Encoded)
        .with_circuit_breaker(2, Duration::from_secs(3600));
    let streams = limiter(
        &url,
        &unique_prefix("leases-breaker"),
        2,
        Duration::from_secs(15),
    )
    .await
    .with_timeout(Duration::from_secs(2))
    .with_circuit_breaker_of(&rate);
    drop(streams.try_acquire("k").await.unwrap());
    server.kill();
    // Two failed rate calls open the shared breaker...
    for _ in 0..2 {
        assert!(keyrate::AsyncLimiter::check(&rate, "k", keyrate::Now, 1)
            .await
            .is_err());
    }
    assert!(rate.circuit_stats().open);
    // ...and the acquire fails at once, without a round trip.
    match streams.try_acquire("k").await {
        Err(RedisConcurrencyDenial::Failed(err)) => {
            assert!(err.is_circuit_open(), "{err}");
            assert_eq!(err.kind(), RedisErrorKind::Unavailable);
        }
        other => panic!("expected a fast failure, got {other:?}"),
    }
    assert_eq!(streams.circuit_stats().fast_failures, 1);
}

//! `RedisConcurrencyLimiter` on a real Redis (`KEYRATE_REDIS_URL`): two
//! limiters sharing a limit never exceed it together, releases and
//! renewals, a process killed with its permits (they come back after the
//! lease time and not before), a Redis restart, Redis's calls per held
//! permit, and bad input. The cluster: `tests/redis_leases_cluster.rs`.
//!
//! Every test names its own namespace (`unique_prefix`), so that two
//! copies of this binary can run at once on one Redis.
#![cfg(not(loom))]

mod redis_support;

use keyrate::{
    ConcurrencyDenial, FailurePolicy, KeyNames, RedisConcurrencyDenial, RedisConcurrencyLimiter,
    RedisErrorKind,
};
use redis_support::{raw, unique_prefix, url, PrivateServer, TEST_TIMEOUT};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// A limiter on `url`, in `namespace` (keys encoded, so that a test can
/// name a lease set), with the tests' long deadline.
async fn limiter(url: &str, namespace: &str, max: u32, lease: Duration) -> RedisConcurrencyLimiter {
    RedisConcurrencyLimiter::connect(url, max)
        .await
        .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
        .with_namespace(namespace, KeyNames::Encoded)
        .with_lease_time(lease)
        .with_timeout(TEST_TIMEOUT)
}

/// Waits until `done` holds, checking every 20 ms; fails after a minute
/// (a bound on liveness, not a timing claim: every condition waited for
/// here is met within a few lease times on an idle machine).
async fn until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..3000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within a minute: {what}");
}

/// Redis's clock (Unix ms) and the lease set's expiry scores, read in one
/// script: a consistent snapshot.
async fn snapshot(conn: &mut redis::aio::MultiplexedConnection, set: &str) -> (u64, Vec<u64>) {
    let script = redis::Script::new(
        "local t = redis.call('TIME') \
         return {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), \
                 redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}",
    );
    let (now, members): (u64, Vec<(String, u64)>) = script
        .key(set)
        .invoke_async(conn)
        .await
        .expect("the snapshot script");
    (now, members.into_iter().map(|(_, score)| score).collect())
}

fn at_limit(result: Result<keyrate::RedisPermit, RedisConcurrencyDenial>) -> (u32, u32) {
    match result {
        Err(RedisConcurrencyDenial::Denied(ConcurrencyDenial::AtLimit { held, max })) => {
            (held, max)
        }
        other => panic!("expected AtLimit, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_on_one_redis_never_exceed_max_together() {
    const MAX: u32 = 3;
    let url = url();
    let namespace = unique_prefix("leases-two");
    let a = limiter(&url, &namespace, MAX, Duration::from_secs(15)).await;
    let b = limiter(&url, &namespace, MAX, Duration::from_secs(15)).await;
    let holding = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let (admitted, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for task in 0..12 {
        let limiter = if task % 2 == 0 { a.clone() } else { b.clone() };
        let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
        let (admitted, refused) = (Arc::clone(&admitted), Arc::clone(&refused));
        tasks.push(tokio::spawn(async move {
            for _ in 0..150 {
                match limiter.try_acquire("hot").await {
                    Ok(permit) => {
                        assert!(!permit.is_degraded());
                        assert!(permit.held() <= MAX, "Redis counted {}", permit.held());
                        let now = holding.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        assert!(now <= MAX, "{now} holders at once, limit {MAX}");
                        tokio::task::yield_now().await;
                        // Out of the count before the release is queued.
                        holding.fetch_sub(1, SeqCst);
                        drop(permit);
                        admitted.fetch_add(1, SeqCst);
                    }
                    Err(denial) => {
                        let (held, max) = at_limit(Err(denial));
                        assert!(held >= max && max == MAX, "{held} of {max}");
                        refused.fetch_add(1, SeqCst);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task panicked");
    }
    let (admitted, refused) = (admitted.load(SeqCst), refused.load(SeqCst));
    println!(
        "admitted {admitted}, refused {refused}, most at once {}",
        most.load(SeqCst)
    );
    assert!(
        admitted > 0 && refused > 0,
        "{admitted} admitted, {refused} refused"
    );
    assert_eq!(admitted + refused, 12 * 150);
    assert!(most.load(SeqCst) <= MAX);
    // Every release reaches Redis: the set empties.
    until("every lease released", || async {
        a.held("hot").await.unwrap() == 0
    })
    .await;
    for limiter in [&a, &b] {
        let stats = limiter.stats();
        assert_eq!((stats.held, stats.leases_lost, stats.failed), (0, 0, 0));
        assert_eq!(stats.released, stats.acquired);
    }
    assert_eq!(a.stats().acquired + b.stats().acquired, admitted);
}

/// Not a test of its own: the child process of
/// `a_killed_process_loses_its_leases_after_the_lease_time_and_not_before`
/// (this binary, run again with `KEYRATE_LEASE_CHILD` set). It takes the
/// permits, says so on stdout, and holds them until it is killed.
#[tokio::test]
async fn lease_child_process() {
    let Ok(spec) = std::env::var("KEYRATE_LEASE_CHILD") else {
        return;
    };
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
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn a_killed_process_loses_its_leases_after_the_lease_time_and_not_before() {
    const N: u32 = 3;
    let url = url();
    let namespace = unique_prefix("leases-kill");
    let parent = limiter(&url, &namespace, N, Duration::from_secs(3)).await;
    let set = parent.lease_key("victim");
    let mut conn = raw(&url).await;

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lease_child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("KEYRATE_LEASE_CHILD", format!("{namespace}\n{N}"))
        .env("KEYRATE_REDIS_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("re-run this test binary as the child");
    let stdout = child.stdout.take().unwrap();
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
        let _ = child.kill();
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

    child.kill().expect("kill -9 the child");
    child.wait().unwrap();
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
async fn renewals_keep_a_lease_past_its_lease_time_and_a_drop_releases_it() {
    let url = url();
    let namespace = unique_prefix("leases-renew");
    let limiter = limiter(&url, &namespace, 1, Duration::from_secs(3)).await;
    let set = limiter.lease_key("k");
    let mut conn = raw(&url).await;
    let permit = limiter.try_acquire("k").await.unwrap();
    let acquired = permit.acquired_at().unwrap().as_millis() as u64;
    let (_, scores) = snapshot(&mut conn, &set).await;
    assert_eq!(
        scores,
        vec![acquired + 3000],
        "expiry = Redis's TIME + lease"
    );
    // Past the first expiry on Redis's clock, the lease is still held.
    until("Redis's clock passes the first expiry", || {
        let (mut conn, set) = (conn.clone(), set.clone());
        async move { snapshot(&mut conn, &set).await.0 > acquired + 3000 }
    })
    .await;
    let (now, scores) = snapshot(&mut conn, &set).await;
    assert_eq!(scores.len(), 1);
    assert!(scores[0] > now, "renewed: {} > {now}", scores[0]);
    assert_eq!(at_limit(limiter.try_acquire("k").await), (1, 1));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&set)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        ttl > 0 && ttl <= 3000,
        "the set expires with its last lease: {ttl}"
    );
    assert!(limiter.stats().renew_rounds >= 1);

    // A drop after the limiter is gone still releases.
    drop(limiter);
    drop(permit);
    let checker = self::limiter(&url, &namespace, 1, Duration::from_secs(3)).await;
    until("the release reaches Redis", || async {
        checker.held("k").await.unwrap() == 0
    })
    .await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&set)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "an empty lease set is gone");
}

#[test]
fn a_permit_dropped_after_its_runtime_is_gone_does_not_panic() {
    let url = url();
    let namespace = unique_prefix("leases-runtime");
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let (limiter, permit) = first.block_on(async {
        let limiter = limiter(&url, &namespace, 1, Duration::from_millis(300)).await;
        let permit = limiter.try_acquire("k").await.unwrap();
        (limiter, permit)
    });
    drop(first); // the renewal task goes with it
    drop(permit); // queued to a task that is gone: nothing happens
                  // The limiter's connection lived on that runtime too (redis-rs drives
                  // it from a task there): a limiter of the same namespace, on another
                  // runtime, sees the orphaned lease expire within its lease time.
    drop(limiter);
    runtime().block_on(async {
        let checker = limiter_on(&url, &namespace).await;
        until("the orphaned lease expires", || async {
            checker.held("k").await.unwrap() == 0
        })
        .await;
        assert!(!checker.try_acquire("k").await.unwrap().is_degraded());
    });
}

async fn limiter_on(url: &str, namespace: &str) -> RedisConcurrencyLimiter {
    limiter(url, namespace, 1, Duration::from_millis(300)).await
}

#[tokio::test]
async fn bad_input_gets_clear_answers() {
    let url = url();
    let err = RedisConcurrencyLimiter::connect(&url, 0).await.unwrap_err();
    assert_eq!(err.kind(), RedisErrorKind::Config);
    assert!(err.to_string().contains("at least 1"), "{err}");
    let conn = raw(&url).await;
    assert_eq!(
        RedisConcurrencyLimiter::with_connection(conn.clone(), 0).unwrap_err(),
        keyrate::ConfigError::ZeroMaxPermits
    );

    let namespace = unique_prefix("leases-bad");
    let limiter = limiter(&url, &namespace, 2, Duration::from_secs(15)).await;
    // A limit of 0 per call refuses without Redis; set_max(0) is refused.
    assert_eq!(at_limit(limiter.try_acquire_under("k", 0).await), (0, 0));
    assert!(limiter.set_max(0).is_err());
    assert_eq!(limiter.max(), 2);
    // Lease times are kept in range.
    let lease = |d| limiter.clone().with_lease_time(d).lease_time();
    assert_eq!(lease(Duration::ZERO), Duration::from_millis(300));
    assert_eq!(lease(Duration::MAX), Duration::from_secs(24 * 3600));
    // Any key: empty, a megabyte, braces and bytes that are not ASCII.
    for key in [String::new(), "x".repeat(1 << 20), "{é}|~#*".to_owned()] {
        let permit = limiter.try_acquire(&key).await.unwrap();
        assert_eq!(permit.held(), 1);
    }
    // A key holding something else: a script error, answered by the
    // failure policy.
    let mut raw_conn = conn.clone();
    let _: () = redis::cmd("SET")
        .arg(limiter.lease_key("taken"))
        .arg("not a set")
        .query_async(&mut raw_conn)
        .await
        .unwrap();
    match limiter.try_acquire("taken").await {
        Err(RedisConcurrencyDenial::Failed(err)) => assert_eq!(err.kind(), RedisErrorKind::Script),
        other => panic!("expected a script failure, got {other:?}"),
    }
    let open = limiter.clone().with_failure_policy(FailurePolicy::Open);
    assert!(open.try_acquire("taken").await.unwrap().is_degraded());
    assert_eq!(limiter.stats().failed, 2);
    assert_eq!(limiter.stats().degraded, 1);
    let _: () = redis::cmd("DEL")
        .arg(limiter.lease_key("taken"))
        .query_async(&mut raw_conn)
        .await
        .unwrap();
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

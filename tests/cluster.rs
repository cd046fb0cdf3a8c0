//! `RedisLimiter` on a real Redis Cluster (feature `redis-cluster`): keys
//! spread over slots and nodes, and failovers while calls run (coordinated,
//! and a hung master; the cluster's nodes need `enable-debug-command
//! local`, as `scripts/redis_cluster.sh` starts them). The
//! shared backend suite also runs on the cluster (`tests/backends.rs`).
//!
//! Needs `KEYRATE_REDIS_CLUSTER_URLS` (see `redis_support` and
//! `scripts/redis_cluster.sh`).
//!
//! The tests that change the cluster, or read its roles, hold a lock file
//! tied to the cluster (`ClusterLock`): one at a time, in this process and
//! in any other test process on the machine. A failover leaves the cluster
//! healthy however it ends (`Heal`).
#![cfg(not(loom))]

mod redis_support;

use keyrate::{AsyncLimiter, FailurePolicy, Quota, RedisDenial, RedisErrorKind, RedisLimiter};
use redis::aio::MultiplexedConnection;
use redis_support::{cluster, cluster_urls, timeouts, unique_prefix, TEST_TIMEOUT};
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

async fn node(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid node URL")
        .get_multiplexed_async_connection_with_config(&timeouts())
        .await
        .unwrap_or_else(|err| panic!("cluster node {url} does not answer: {err}"))
}

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// How long a test waits for another (in any process) to finish with the
/// cluster: a failover takes about 15 s, and a test's healing after a
/// failed one up to `HEAL_WITHIN`.
const LOCK_WITHIN: Duration = Duration::from_secs(600);

/// How long a failed failover may take to heal.
const HEAL_WITHIN: Duration = Duration::from_secs(90);

/// Exclusive use of the cluster named by `urls`, across processes: a lock
/// file created with `create_new` (so only one holder exists), holding the
/// holder's pid, and removed when the guard drops (on a panic too). A file
/// left by a process that was killed (its pid is gone) is removed by the
/// next one to wait.
struct ClusterLock {
    path: PathBuf,
    pid: String,
}

impl ClusterLock {
    fn acquire(urls: &[String]) -> ClusterLock {
        // FNV-1a of the URLs: the same cluster gives the same file name in
        // every process.
        let id = urls
            .join(",")
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        let path = std::env::temp_dir().join(format!("keyrate-cluster-{id:016x}.lock"));
        let pid = std::process::id().to_string();
        let deadline = Instant::now() + LOCK_WITHIN;
        loop {
            match File::options().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    file.write_all(pid.as_bytes()).expect("write the lock file");
                    return ClusterLock { path, pid };
                }
                Err(err) if err.kind() == ErrorKind::AlreadyExists => {}
                Err(err) => panic!("cannot create {}: {err}", path.display()),
            }
            Self::remove_if_stale(&path);
            assert!(
                Instant::now() < deadline,
                "{} still held after {LOCK_WITHIN:?}",
                path.display()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Removes the lock at `path` if the process that holds it is gone.
    fn remove_if_stale(path: &PathBuf) {
        let Ok(holder) = fs::read_to_string(path) else {
            return;
        };
        // An empty file is one being written: not stale.
        let Ok(pid) = holder.trim().parse::<u32>() else {
            return;
        };
        if !std::path::Path::new("/proc").join(pid.to_string()).exists()
            && std::path::Path::new("/proc/self").exists()
        {
            // Read again just before removing: another waiter may have
            // removed it and taken the lock meanwhile.
            if fs::read_to_string(path).is_ok_and(|now| now == holder) {
                eprintln!("removing {} left by process {pid}", path.display());
                let _ = fs::remove_file(path);
            }
        }
    }
}

impl Drop for ClusterLock {
    fn drop(&mut self) {
        // Only our own lock.
        if fs::read_to_string(&self.path).is_ok_and(|holder| holder == self.pid) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Whether every node answers, reports `cluster_state:ok`, and every
/// replica's link to its master is up (3 replicas, as
/// `scripts/redis_cluster.sh` starts them); why not, if not.
fn cluster_healthy(urls: &[String]) -> Result<(), String> {
    let mut replicas = 0;
    for url in urls {
        let client = redis::Client::open(url.as_str()).map_err(|err| format!("{url}: {err}"))?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .map_err(|err| format!("{url}: {err}"))?;
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let cluster: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut conn)
            .map_err(|err| format!("{url}: {err}"))?;
        if !cluster.contains("cluster_state:ok") {
            return Err(format!("{url}: cluster state not ok"));
        }
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .map_err(|err| format!("{url}: {err}"))?;
        if info.contains("role:slave") {
            if !info.contains("master_link_status:up") {
                return Err(format!("{url}: replica's link not up"));
            }
            replicas += 1;
        }
    }
    if replicas != 3 {
        return Err(format!("{replicas} replicas with their link up, not 3"));
    }
    Ok(())
}

/// Waits until the cluster is healthy, for at most `within`.
fn wait_healthy(urls: &[String], within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        match cluster_healthy(urls) {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= deadline => {
                return Err(format!("not healthy after {within:?}: {why}"))
            }
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Waits, when dropped, until the cluster is healthy again: a failover
/// that fails midway (a master still asleep, a replica half promoted)
/// must not leave the next test a broken cluster. It fails the test if
/// the cluster does not heal, unless the test is failing already.
struct Heal<'a>(&'a [String]);

impl Drop for Heal<'_> {
    fn drop(&mut self) {
        if let Err(why) = wait_healthy(self.0, HEAL_WITHIN) {
            if thread::panicking() {
                eprintln!("the cluster did not heal: {why}");
            } else {
                panic!("the cluster did not heal: {why}");
            }
        }
    }
}

/// Takes the cluster for one test: waits for the lock, then for a healthy
/// cluster.
fn take_cluster(urls: &[String]) -> ClusterLock {
    let lock = ClusterLock::acquire(urls);
    if let Err(why) = wait_healthy(urls, HEAL_WITHIN) {
        panic!("the cluster is broken before the test: {why}");
    }
    lock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_spread_over_slots_and_nodes() {
    let urls = cluster_urls();
    // Reads the masters' roles: no failover may run meanwhile.
    let _cluster = tokio::task::block_in_place(|| take_cluster(&urls));
    let prefix = unique_prefix("cluster_slots");
    let limiter = RedisLimiter::with_connection(cluster(&urls).await, Quota::new(1.0, 3).unwrap())
        .with_namespace(prefix.clone(), keyrate::KeyNames::Encoded)
        .with_timeout(TEST_TIMEOUT);
    let mut any = node(&urls[0]).await;
    let mut slots = HashSet::new();
    for i in 0..32 {
        let key = format!("k{i}");
        let decision = limiter.check(&key, unix_now(), 1).await.unwrap();
        assert_eq!(decision.remaining(), 2);
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(limiter.bucket_key(&key))
            .query_async(&mut any)
            .await
            .unwrap();
        slots.insert(slot);
    }
    assert!(slots.len() > 16, "32 keys in only {} slots", slots.len());
    // Each node holds only its own slots' keys: count them node by node.
    let mut nodes_with_keys = 0;
    let mut total = 0;
    for url in &urls {
        let keys = redis_support::keys_on(&mut node(url).await, &prefix).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query_async(&mut node(url).await)
            .await
            .unwrap();
        let is_master = matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
        if is_master {
            total += keys.len();
            nodes_with_keys += usize::from(!keys.is_empty());
        }
    }
    assert_eq!(total, 32, "every bucket on exactly one master");
    assert!(
        nodes_with_keys >= 2,
        "buckets on {nodes_with_keys} master(s)"
    );
}

/// The `CLUSTER NODES` line fields of every node: (id, port, flags, master id, slots).
async fn topology(
    conn: &mut MultiplexedConnection,
) -> Vec<(String, u16, String, String, Vec<String>)> {
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(conn)
        .await
        .unwrap();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let port = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
            Some((
                fields[0].to_owned(),
                port,
                fields[2].to_owned(),
                fields[3].to_owned(),
                fields[8..].iter().map(|s| s.to_string()).collect(),
            ))
        })
        .collect()
}

fn owns(slots: &[String], slot: u16) -> bool {
    slots.iter().any(|range| {
        let mut bounds = range.split('-').filter_map(|b| b.parse::<u16>().ok());
        match (bounds.next(), bounds.next()) {
            (Some(lo), Some(hi)) => lo <= slot && slot <= hi,
            (Some(one), None) => one == slot,
            _ => false,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_while_calls_run() {
    let urls = cluster_urls();
    let _cluster = tokio::task::block_in_place(|| take_cluster(&urls));
    failover(&urls, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_hangs_and_its_replica_takes_over() {
    let urls = cluster_urls();
    let _cluster = tokio::task::block_in_place(|| take_cluster(&urls));
    failover(&urls, true).await;
}

/// Calls run on one key while its slot moves to the replica: by
/// `CLUSTER FAILOVER` on the replica, or (`hang`) by a master that stops
/// answering (`DEBUG SLEEP`, longer than the cluster's node timeout) until
/// the replica is elected in its place. The cluster is healthy again when
/// it returns, or unwinds (`Heal`).
async fn failover(urls: &[String], hang: bool) {
    // Generous: every call Redis decides is admitted, so a failed call is
    // told apart from a denial.
    let quota = Quota::new(1e6, 1 << 30).unwrap();
    let prefix = unique_prefix("cluster_failover");
    let done = Arc::new(AtomicBool::new(false));
    // Calls during the failover fail fast (500 ms); the call that must be
    // decided afterwards is patient.
    let patient = RedisLimiter::with_connection(cluster(urls).await, quota)
        .with_namespace(prefix.clone(), keyrate::KeyNames::Encoded)
        .with_timeout(TEST_TIMEOUT)
        .with_min_ttl(Duration::from_secs(60));
    let closed = patient.clone().with_timeout(Duration::from_millis(500));
    let open = closed.clone().with_failure_policy(FailurePolicy::Open);

    // The replica of the master that holds key "k"'s bucket.
    let mut any = node(&urls[0]).await;
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(closed.bucket_key("k"))
        .query_async(&mut any)
        .await
        .unwrap();
    let nodes = topology(&mut any).await;
    let master = nodes
        .iter()
        .find(|n| n.2.contains("master") && owns(&n.4, slot))
        .expect("a master for the slot");
    let replica = nodes
        .iter()
        .find(|n| n.3 == master.0 && !n.2.contains("fail"))
        .expect("a replica of that master");
    let replica_url = format!("redis://127.0.0.1:{}", replica.1);

    let caller = {
        let (closed, open, done) = (closed.clone(), open.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let (mut ok, mut errors, mut kinds) = (0u64, 0u64, HashSet::new());
            let mut last_ok = Instant::now();
            let mut gap = Duration::ZERO;
            let mut open_denies = 0u64;
            let stop = Instant::now() + Duration::from_secs(60);
            while Instant::now() < stop {
                match closed.check("k", unix_now(), 1).await {
                    Ok(decision) => {
                        assert!(!decision.is_degraded(), "failing closed never degrades");
                        gap = gap.max(last_ok.elapsed());
                        last_ok = Instant::now();
                        ok += 1;
                    }
                    Err(RedisDenial::Failed(err)) => {
                        errors += 1;
                        kinds.insert(err.kind());
                    }
                    Err(denied) => panic!("a generous quota admits: {denied:?}"),
                }
                // Failing open, the boolean call admits whether or not the
                // slot is reachable (the quota admits every decided call).
                if !open.allow_n("k", unix_now().as_secs_f64(), 1).await {
                    open_denies += 1;
                }
                if ok > 0 && ok % 64 == 0 {
                    tokio::task::yield_now().await;
                }
                // The test stops the loop once the new master has served.
                // Relaxed: a flag, ordering nothing else.
                if done.load(Ordering::Relaxed) {
                    break;
                }
            }
            (ok, errors, kinds, gap, open_denies)
        })
    };

    tokio::time::sleep(Duration::from_millis(300)).await;
    // From here on the cluster is changed: heal it however this ends.
    let _heal = Heal(urls);
    let failover_at = Instant::now();
    let mut replica_conn = node(&replica_url).await;
    if hang {
        let master_url = format!("redis://127.0.0.1:{}", master.1);
        let mut master_conn = node(&master_url).await;
        tokio::spawn(async move {
            let _: Result<(), _> = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(8)
                .query_async(&mut master_conn)
                .await;
        });
    } else {
        let reply: String = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query_async(&mut replica_conn)
            .await
            .expect("CLUSTER FAILOVER accepted");
        assert_eq!(reply, "OK");
    }
    // Wait until the replica is a master, then let calls run on a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query_async(&mut replica_conn)
            .await
            .unwrap();
        if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never took over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let promoted_after = failover_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A hung master comes back as a replica: wait for the whole cluster.
    let deadline = Instant::now() + Duration::from_secs(60);
    for url in urls {
        let mut conn = node(url).await;
        loop {
            let info: Result<String, _> = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await;
            if info.is_ok_and(|info| info.contains("cluster_state:ok")) {
                break;
            }
            assert!(Instant::now() < deadline, "{url} never rejoined");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    done.store(true, Ordering::Relaxed);
    let (ok, errors, kinds, gap, open_denies) = caller.await.expect("no panic in the caller");
    eprintln!(
        "failover (hang: {hang}): replica promoted after {promoted_after:?}; {ok} calls decided, {errors} \
         failed ({kinds:?}); longest gap between decided calls {gap:?}"
    );
    assert!(ok > 0);
    for kind in &kinds {
        assert!(
            matches!(kind, RedisErrorKind::Unavailable | RedisErrorKind::Timeout),
            "a failover is a transient failure, not {kind:?}"
        );
    }
    assert_eq!(open_denies, 0, "fail open admits while the slot moves");
    // Decided again afterwards, on the new master. The failing calls
    // above opened the limiters' shared circuit breaker; it closes on
    // its next probe (one per 50 ms), which a call made within 50 ms of
    // the last failed one may not be (seen under two suites at once):
    // the call is retried while the breaker fails it fast.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match patient.check("k", unix_now(), 1).await {
            Ok(_) => break,
            Err(RedisDenial::Failed(err)) if err.is_circuit_open() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            Err(err) => panic!("not admitted on the new master: {err}"),
        }
    }
}

/// A key's braces do not pick its slot (they are encoded), and a limiter
/// that asks for one slot gets all its buckets on one master, by the hash
/// tag made from its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_namespace_picks_a_slot() {
    let urls = cluster_urls();
    let _cluster = tokio::task::block_in_place(|| take_cluster(&urls));
    let quota = Quota::new(1.0, 3).unwrap();
    let spread = RedisLimiter::with_connection(cluster(&urls).await, quota)
        .with_namespace(unique_prefix("cluster_tags"), keyrate::KeyNames::Encoded)
        .with_timeout(TEST_TIMEOUT);
    let one_slot = spread
        .clone()
        .with_namespace(
            unique_prefix("cluster_one_slot"),
            keyrate::KeyNames::Encoded,
        )
        .with_hash_tag(true);
    let mut any = node(&urls[0]).await;
    assert!(
        slots_of(&spread, &mut any).await > 16,
        "a key's braces picked its slot"
    );
    assert_eq!(
        slots_of(&one_slot, &mut any).await,
        1,
        "the namespace's hash tag is one slot"
    );
}

/// The slots of 32 keys that all name the same hash tag.
async fn slots_of(
    limiter: &RedisLimiter<redis::cluster_async::ClusterConnection>,
    any: &mut MultiplexedConnection,
) -> usize {
    let mut slots = HashSet::new();
    for i in 0..32 {
        let key = format!("{{victim}}:{i}");
        assert!(limiter.allow(&key, unix_now()).await);
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(limiter.bucket_key(&key))
            .query_async(any)
            .await
            .unwrap();
        slots.insert(slot);
    }
    slots.len()
}

/// `reset_all` would scan one node of a cluster: it refuses, and
/// `reset_all_cluster` resets every master's buckets of the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_cluster_reaches_every_master() {
    let urls = cluster_urls();
    let _cluster = tokio::task::block_in_place(|| take_cluster(&urls));
    let limiter = RedisLimiter::with_connection(cluster(&urls).await, Quota::new(1.0, 1).unwrap())
        .with_namespace(unique_prefix("cluster_reset"), keyrate::KeyNames::Encoded)
        .with_min_ttl(Duration::from_secs(3600))
        .with_timeout(TEST_TIMEOUT);
    let other = limiter.clone().with_namespace(
        unique_prefix("cluster_reset_other"),
        keyrate::KeyNames::Encoded,
    );
    for i in 0..64 {
        assert!(limiter.allow(&format!("k{i}"), 0.0).await);
    }
    assert!(other.allow("k0", 0.0).await);
    let err = limiter.reset_all().await.unwrap_err();
    assert_eq!(err.kind(), RedisErrorKind::Config);
    assert!(limiter.reset("k1").await.unwrap());
    assert_eq!(limiter.reset_all_cluster().await.unwrap(), 63);
    for i in 0..64 {
        assert!(
            limiter.allow(&format!("k{i}"), 0.0).await,
            "k{i} full again"
        );
    }
    assert!(
        !other.allow("k0", 0.0).await,
        "another namespace is untouched"
    );
}

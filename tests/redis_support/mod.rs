//! Finding the Redis server the Redis tests run against.
//!
//! The server is named by `KEYRATE_REDIS_URL` (for example
//! `redis://127.0.0.1:6390`), the cluster by `KEYRATE_REDIS_CLUSTER_URLS`.
//! `bash scripts/test.sh` starts both (throwaway servers) and sets them.
//! Without the variable a Redis test fails, as it does when the variable is
//! set and no server answers: a Redis test never passes without running.
#![allow(dead_code)]

use keyrate::{Quota, RedisLimiter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The server's URL from `KEYRATE_REDIS_URL`.
///
/// # Panics
///
/// When `KEYRATE_REDIS_URL` is unset or empty: run the tests with
/// `bash scripts/test.sh` (which starts the servers) or set it.
pub fn url() -> String {
    match std::env::var("KEYRATE_REDIS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "KEYRATE_REDIS_URL is not set: the Redis tests need a Redis server. Run \
             `bash scripts/test.sh` (which starts throwaway servers), or start one and set \
             KEYRATE_REDIS_URL (e.g. redis://127.0.0.1:6390)"
        ),
    }
}

/// A key prefix no other test (or earlier run) uses, free of glob
/// characters so that `KEYS prefix*` matches exactly its keys.
pub fn unique_prefix(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("keyrate-test:{test}:{}:{nanos}:{n}:", std::process::id())
}

/// The per-call timeout of the tests' limiters: far above any real call,
/// so that a loaded machine cannot fail a test by being slow.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A limiter on the test server with its own prefix. Keys get a TTL floor
/// of an hour: the tests' made-up timestamps do not advance in real time.
pub async fn limiter(test: &str, quota: Quota) -> RedisLimiter {
    let url = url();
    let limiter = RedisLimiter::connect(&url, quota)
        .await
        .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"));
    limiter
        .with_namespace(unique_prefix(test), keyrate::KeyNames::Encoded)
        .with_min_ttl(Duration::from_secs(3600))
        .with_timeout(TEST_TIMEOUT)
}

/// A plain connection to the test server, for inspecting keys. Its
/// connection and every command on it time out after [`TEST_TIMEOUT`]
/// (an error, which the callers' `expect`s turn into a failure): a server
/// that stops answering fails the test instead of hanging it.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid KEYRATE_REDIS_URL")
        .get_multiplexed_async_connection_with_config(&timeouts())
        .await
        .unwrap_or_else(|err| panic!("KEYRATE_REDIS_URL={url} but no Redis answers: {err}"))
}

/// [`TEST_TIMEOUT`] for a connection's setup and for each command's
/// answer.
pub fn timeouts() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(TEST_TIMEOUT)
        .set_response_timeout(TEST_TIMEOUT)
}

/// The keys under `prefix`.
pub async fn keys(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .expect("KEYS")
}

/// The Redis Cluster's node URLs from `KEYRATE_REDIS_CLUSTER_URLS`
/// (comma-separated, e.g. `redis://127.0.0.1:7100,redis://127.0.0.1:7101`,
/// as `scripts/redis_cluster.sh start` prints them).
///
/// # Panics
///
/// When `KEYRATE_REDIS_CLUSTER_URLS` is unset or empty: run the tests with
/// `bash scripts/test.sh` (which starts the servers) or set it.
pub fn cluster_urls() -> Vec<String> {
    match std::env::var("KEYRATE_REDIS_CLUSTER_URLS") {
        Ok(urls) if !urls.is_empty() => urls.split(',').map(str::to_owned).collect(),
        _ => panic!(
            "KEYRATE_REDIS_CLUSTER_URLS is not set: the cluster tests need a Redis Cluster. \
             Run `bash scripts/test.sh` (which starts throwaway servers), or start one with \
             `scripts/redis_cluster.sh start BASE_PORT DIR` and set KEYRATE_REDIS_CLUSTER_URLS \
             to the URLs it prints"
        ),
    }
}

/// A cluster connection to the test cluster.
#[cfg(feature = "redis-cluster")]
pub async fn cluster(urls: &[String]) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::builder(urls.to_vec())
        .connection_timeout(TEST_TIMEOUT)
        .response_timeout(TEST_TIMEOUT)
        .build()
        .expect("valid KEYRATE_REDIS_CLUSTER_URLS")
        .get_async_connection()
        .await
        .unwrap_or_else(|err| {
            panic!("KEYRATE_REDIS_CLUSTER_URLS={urls:?} but no cluster answers: {err}")
        })
}

/// The keys under `prefix`, on any connection (a cluster asks every node).
pub async fn keys_on(conn: &mut impl redis::aio::ConnectionLike, prefix: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .expect("KEYS")
}

/// A redis-server process of the test's own (`KEYRATE_REDIS_SERVER_BIN`,
/// or `redis-server` on `PATH`), for tests that kill it or flush its
/// scripts: the shared server's other users must not see either. Killed
/// when dropped.
///
/// Its port is drawn below the kernel's ephemeral port range, so that no
/// outgoing connection can take it between the choice and the bind; a port
/// some other process holds already makes the server exit, and another
/// port is tried.
pub struct PrivateServer {
    port: u16,
    child: std::process::Child,
}

impl PrivateServer {
    fn binary() -> String {
        std::env::var("KEYRATE_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
    }

    /// Ports to draw from: 10000 up to the ephemeral range's first port.
    fn ports() -> std::ops::Range<u16> {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        10_000..low.max(10_001)
    }

    /// Starts a server on a free port.
    ///
    /// # Panics
    ///
    /// When no server starts after 20 ports, or redis-server cannot run.
    pub fn start() -> PrivateServer {
        use std::hash::{BuildHasher, Hasher};
        let ports = Self::ports();
        let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
        seed.write_u32(std::process::id());
        let mut draw = seed.finish();
        for _ in 0..20 {
            draw = draw.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let span = u64::from(ports.end - ports.start);
            let port = ports.start + ((draw >> 33) % span) as u16;
            if let Some(server) = Self::start_on(port) {
                return server;
            }
        }
        panic!("no redis-server of our own started on 20 ports in {ports:?}");
    }

    /// Starts a server on `port`; `None` when the port is taken.
    ///
    /// # Panics
    ///
    /// When redis-server cannot run, or does not answer within 20 s.
    pub fn start_on(port: u16) -> Option<PrivateServer> {
        use std::process::{Command, Stdio};
        let child = Command::new(Self::binary())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot start {} (set KEYRATE_REDIS_SERVER_BIN): {err}",
                    Self::binary()
                )
            });
        let mut server = PrivateServer { port, child };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(_)) = server.child.try_wait() {
                // It exited: it could not bind the port.
                return None;
            }
            // Answered by our process, not by a stranger on the port.
            if server.pid_on_port() == Some(server.child.id()) {
                return Some(server);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server on port {port} did not answer within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of the redis-server answering on this server's port.
    fn pid_on_port(&self) -> Option<u32> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server and waits until it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.kill();
    }
}

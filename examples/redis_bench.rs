//! Throughput and latency of `RedisLimiter` over loopback, beside a plain
//! Redis `INCR` on the same connection setup (the floor: one round trip).
//!
//! ```text
//! redis-server --port 6390 --bind 127.0.0.1 --save '' --daemonize yes
//! KEYRATE_REDIS_URL=redis://127.0.0.1:6390 \
//!     cargo run --release --features redis --example redis_bench [seconds]
//! ```
//!
//! Each scenario runs `tasks` tasks over `connections` connections for a
//! fixed time (default 3 s) and prints calls/s and the p50/p99 latency of
//! one call. Tasks share connections round-robin; concurrent calls on one
//! connection are pipelined by redis-rs's multiplexed connection, so "1
//! connection, 64 tasks" is the pipelined case.

use keyrate::{Quota, RedisLimiter};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    /// A plain `INCR` on one key per task.
    Incr,
    /// `RedisLimiter::check` with the caller's timestamp.
    Check,
    /// `RedisLimiter::check_now`: Redis `TIME` inside the script.
    CheckNow,
}

/// The connection `RedisLimiter::connect` builds, for the `INCR` baseline.
async fn manager(url: &str) -> Result<ConnectionManager, Error> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(keyrate::DEFAULT_REDIS_TIMEOUT)
        .set_response_timeout(keyrate::DEFAULT_REDIS_TIMEOUT)
        .set_number_of_retries(3)
        .set_max_delay(1000);
    Ok(ConnectionManager::new_with_config(redis::Client::open(url)?, config).await?)
}

async fn scenario(
    url: &str,
    op: Op,
    connections: usize,
    tasks: usize,
    run_for: Duration,
) -> Result<(f64, Duration, Duration), Error> {
    // A generous quota: nearly every call is admitted, so each one writes.
    let quota = Quota::new(1e9, 1 << 40)?;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let mut pool = Vec::new();
    for _ in 0..connections {
        let conn = manager(url).await?;
        let limiter = RedisLimiter::with_connection(conn.clone(), quota)
            .with_prefix(format!("keyrate-bench:{stamp}:"));
        pool.push((conn, limiter));
    }
    let start = Instant::now();
    let deadline = start + run_for;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (mut conn, limiter) = pool[task % connections].clone();
        let key = format!("keyrate-bench:{stamp}:incr:{task}");
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t0 = Instant::now();
                match op {
                    Op::Incr => {
                        let _: i64 = redis::cmd("INCR").arg(&key).query_async(&mut conn).await?;
                    }
                    Op::Check => {
                        let now = start.elapsed().as_secs_f64();
                        limiter.check(&key, now, 1).await?.ok();
                    }
                    Op::CheckNow => {
                        limiter.check_now(&key, 1).await?.ok();
                    }
                }
                latencies.push(t0.elapsed());
            }
            Ok::<_, Error>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for handle in handles {
        latencies.extend(handle.await??);
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    let pick = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let rate = latencies.len() as f64 / elapsed.as_secs_f64();
    let (p50, p99) = (pick(0.50), pick(0.99));
    // Clean up the INCR keys and buckets.
    let mut conn = pool[0].0.clone();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("keyrate-bench:{stamp}:*"))
        .query_async(&mut conn)
        .await?;
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
    }
    Ok((rate, p50, p99))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("KEYRATE_REDIS_URL")
        .map_err(|_| "set KEYRATE_REDIS_URL, e.g. redis://127.0.0.1:6390")?;
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(3.0);
    let run_for = Duration::from_secs_f64(secs);
    println!(
        "{:<26} {:>5} {:>5} {:>12} {:>10} {:>10}",
        "operation", "conns", "tasks", "calls/s", "p50", "p99"
    );
    for (connections, tasks) in [(1, 1), (1, 64), (8, 64), (32, 256)] {
        for op in [Op::Incr, Op::Check, Op::CheckNow] {
            let (rate, p50, p99) = scenario(&url, op, connections, tasks, run_for).await?;
            let name = match op {
                Op::Incr => "INCR (floor)",
                Op::Check => "check (caller time)",
                Op::CheckNow => "check_now (Redis TIME)",
            };
            println!(
                "{name:<26} {connections:>5} {tasks:>5} {rate:>12.0} {:>10} {:>10}",
                format!("{:.1?}", p50),
                format!("{:.1?}", p99)
            );
        }
    }
    Ok(())
}

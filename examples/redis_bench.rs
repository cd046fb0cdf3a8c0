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
//! one call, and Redis's CPU per call (`INFO commandstats`, reset before
//! each scenario). Tasks share connections round-robin; concurrent calls on one
//! connection are pipelined by redis-rs's multiplexed connection, so "1
//! connection, 64 tasks" is the pipelined case.

use keyrate::{AsyncLimiter, Decision, Now, Quota, RedisDenial, RedisLimiter, Refusal};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    /// A plain `INCR` on one key per task.
    Incr,
    /// `RedisLimiter::check` with the caller's timestamp (the mirror on:
    /// each task's key has one writer, so the script's fast path).
    Check,
    /// The same with the mirror off: the script's general path.
    CheckNoMirror,
    /// `RedisLimiter::check` at `Now`: Redis `TIME` inside the script.
    CheckNow,
}

/// A decided call, admitted or denied, is one measured call; a Redis
/// failure ends the run.
fn decided(answer: Result<Decision, RedisDenial>) -> Result<(), Error> {
    match answer {
        Err(err) if err.denial().is_none() => Err(err.into()),
        _ => Ok(()),
    }
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
) -> Result<(f64, Duration, Duration, f64), Error> {
    // A generous quota: nearly every call is admitted, so each one writes.
    let quota = Quota::new(1e9, 1 << 40)?;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let mut pool = Vec::new();
    for _ in 0..connections {
        let conn = manager(url).await?;
        let mut limiter = RedisLimiter::with_connection(conn.clone(), quota).with_namespace(
            format!("keyrate-bench:{stamp}:"),
            keyrate::KeyNames::Encoded,
        );
        if op == Op::CheckNoMirror {
            limiter = limiter.with_mirror_capacity(0);
        }
        pool.push((conn, limiter));
    }
    let mut admin = pool[0].0.clone();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await?;
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
                    Op::Check | Op::CheckNoMirror => {
                        let now = start.elapsed().as_secs_f64();
                        decided(limiter.check(&key, now, 1).await)?;
                    }
                    Op::CheckNow => {
                        decided(limiter.check(&key, Now, 1).await)?;
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
    let usec =
        redis_usec_per_call(&mut admin, if op == Op::Incr { "incr" } else { "evalsha" }).await?;
    // Clean up the INCR keys and buckets.
    let mut conn = pool[0].0.clone();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("keyrate-bench:{stamp}:*"))
        .query_async(&mut conn)
        .await?;
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
    }
    Ok((rate, p50, p99, usec))
}

/// Redis's own CPU per call of `command` since the last `CONFIG RESETSTAT`
/// (`INFO commandstats`, usec_per_call), scripts' inner calls included.
async fn redis_usec_per_call(conn: &mut ConnectionManager, command: &str) -> Result<f64, Error> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let prefix = format!("cmdstat_{command}:");
    let line = info
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_default();
    let usec = line
        .split(',')
        .find_map(|field| field.strip_prefix("usec_per_call="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    Ok(usec)
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
        "{:<30} {:>5} {:>5} {:>12} {:>10} {:>10} {:>12}",
        "operation", "conns", "tasks", "calls/s", "p50", "p99", "Redis us/call"
    );
    for (connections, tasks) in [(1, 1), (1, 64), (8, 64), (32, 256)] {
        for op in [Op::Incr, Op::Check, Op::CheckNoMirror, Op::CheckNow] {
            let (rate, p50, p99, usec) = scenario(&url, op, connections, tasks, run_for).await?;
            let name = match op {
                Op::Incr => "INCR (floor)",
                Op::Check => "check (caller time)",
                Op::CheckNoMirror => "check (caller time, no mirror)",
                Op::CheckNow => "check at Now (Redis TIME)",
            };
            println!(
                "{name:<30} {connections:>5} {tasks:>5} {rate:>12.0} {:>10} {:>10} {usec:>12.2}",
                format!("{:.1?}", p50),
                format!("{:.1?}", p99)
            );
        }
    }
    Ok(())
}

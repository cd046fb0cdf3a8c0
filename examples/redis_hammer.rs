//! One key hammered through one `RedisLimiter`, with and without the local
//! deny mirror: Redis commands per second against client decisions per
//! second, for a key denied nearly all the time.
//!
//! ```text
//! redis-server --port 6390 --bind 127.0.0.1 --save '' --daemonize yes
//! KEYRATE_REDIS_URL=redis://127.0.0.1:6390 \
//!     cargo run --release --features redis --example redis_hammer [seconds] [rate]
//! ```
//!
//! Two OS threads (a 2-worker runtime) run 32 tasks each, every task
//! calling `check` on the same key as fast as it can, at the caller's Unix
//! time (a `Duration`) or at `Now` (Redis's clock);
//! the quota admits `rate` calls/s (default 1,000) with a burst of 10. Redis's count of script calls (`INFO commandstats`)
//! gives the Redis calls per second.

use keyrate::{AsyncLimiter, Now, Quota, RedisDenial, RedisLimiter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The script calls Redis has run since the last `CONFIG RESETSTAT`.
async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let calls = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| {
            l.split(&[':', ','][..])
                .find_map(|f| f.strip_prefix("calls="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(calls)
}

async fn run(
    url: &str,
    rate: f64,
    mirror: bool,
    now_mode: bool,
    run_for: Duration,
) -> Result<(), Error> {
    let quota = Quota::new(rate, 10)?;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let mut limiter = RedisLimiter::connect(url, quota).await?.with_namespace(
        format!("keyrate-hammer:{stamp}:"),
        keyrate::KeyNames::Encoded,
    );
    if !mirror {
        limiter = limiter.with_mirror_capacity(0);
    }
    let mut admin = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await?;
    let decisions = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + run_for;
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (limiter, decisions, admitted, errors) = (
            limiter.clone(),
            decisions.clone(),
            admitted.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let (mut d, mut a, mut e) = (0u64, 0u64, 0u64);
            while Instant::now() < deadline {
                for _ in 0..64 {
                    let outcome = if now_mode {
                        limiter.check("hot", Now, 1).await
                    } else {
                        let now = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .unwrap_or_default();
                        limiter.check("hot", now, 1).await
                    };
                    d += 1;
                    match outcome {
                        Ok(_) => a += 1,
                        Err(RedisDenial::Denied(_)) => {}
                        Err(_) => e += 1,
                    }
                }
                tokio::task::yield_now().await;
            }
            decisions.fetch_add(d, Ordering::Relaxed);
            admitted.fetch_add(a, Ordering::Relaxed);
            errors.fetch_add(e, Ordering::Relaxed);
        }));
    }
    for task in tasks {
        task.await?;
    }
    let secs = start.elapsed().as_secs_f64();
    let redis_calls = evalsha_calls(&mut admin).await? as f64;
    let d = decisions.load(Ordering::Relaxed) as f64;
    let a = admitted.load(Ordering::Relaxed) as f64;
    println!(
        "{:<8} {:<12} {:>14.0} {:>12.0} {:>10.2}% {:>14.0} {:>10.0}x {:>7}",
        if mirror { "on" } else { "off" },
        if now_mode {
            "check, Now"
        } else {
            "check, Unix"
        },
        d / secs,
        a / secs,
        100.0 * (1.0 - a / d.max(1.0)),
        redis_calls / secs,
        d / redis_calls.max(1.0),
        errors.load(Ordering::Relaxed),
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let url = std::env::var("KEYRATE_REDIS_URL")
        .map_err(|_| "set KEYRATE_REDIS_URL, e.g. redis://127.0.0.1:6390")?;
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(3.0);
    let rate: f64 = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1000.0);
    println!("quota: {rate} calls/s, burst 10; {secs} s per row");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "{:<8} {:<12} {:>14} {:>12} {:>11} {:>14} {:>11} {:>7}",
        "mirror", "call", "decisions/s", "admitted/s", "denied", "Redis calls/s", "saved", "errors"
    );
    runtime.block_on(async {
        for now_mode in [false, true] {
            for mirror in [false, true] {
                run(&url, rate, mirror, now_mode, Duration::from_secs_f64(secs)).await?;
            }
        }
        Ok(())
    })
}

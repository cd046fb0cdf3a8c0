//! Redis's own CPU per decision (`INFO commandstats`, `cmdstat_evalsha`
//! usec_per_call, after `CONFIG RESETSTAT`) for the script's cases, one
//! call at a time, on a server with nothing else to do:
//!
//! ```text
//! redis-server --port 24711 --bind 127.0.0.1 --save '' --appendonly no \
//!     --daemonize yes --dir "$(mktemp -d)"
//! KEYRATE_REDIS_URL=redis://127.0.0.1:24711 \
//!     cargo run --release --features redis --example redis_cost [calls] [rounds]
//! ```
//!
//! Each case makes `calls` calls (default 20,000), `rounds` times (default
//! 5), and prints the lowest and the median usec_per_call of its rounds.
//! The compound cases (issue 22) charge one key under two quotas, or three
//! keys (key, org, global) under one quota each, in one script call.

use keyrate::{
    AsyncCompound, AsyncLimiter, CompoundRefusal, Decision, Now, Policy, Quota, RedisDenial,
    RedisLimiter, Refusal,
};
use redis::aio::MultiplexedConnection;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Case {
    /// Admitted, existing key, caller timestamps, mirror on: the fast path.
    AdmitFast,
    /// Admitted, existing key, caller timestamps, mirror off: general path.
    AdmitGeneral,
    /// Admitted, existing key, at `Now` (mirror off, bucket full at each
    /// call: the general path).
    AdmitNow,
    /// Admitted, existing key, at `Now`, mirror on, the bucket not full at
    /// any call (1 ms of refill spent a call): the fast path at Redis's
    /// clock.
    AdmitNowFast,
    /// Denied, existing key, caller timestamps (mirror off, so it reaches Redis).
    Denied,
    /// Denied, existing key, at `Now` (mirror off).
    DeniedNow,
    /// A new key per call, caller timestamps, mirror on: the fast path.
    NewFast,
    /// A new key per call, caller timestamps, mirror off.
    NewGeneral,
    /// A new key per call, at `Now`.
    NewNow,
    /// Compound: one existing key under two quotas, admitted, caller time,
    /// no mirror.
    CompoundTwoQuotas,
    /// Compound: three existing keys (key, org, global), admitted, caller
    /// time, no mirror.
    CompoundThreeScopes,
    /// Compound: one key under two quotas, denied (no mirror).
    CompoundDenied,
}

const CASES: [(Case, &str); 12] = [
    (
        Case::AdmitFast,
        "admitted, existing key, caller time (fast path)",
    ),
    (
        Case::AdmitGeneral,
        "admitted, existing key, caller time, no mirror",
    ),
    (Case::AdmitNow, "admitted, existing key, Now"),
    (
        Case::AdmitNowFast,
        "admitted, existing key, Now, not full (fast path)",
    ),
    (Case::Denied, "denied, caller time"),
    (Case::DeniedNow, "denied, Now"),
    (Case::NewFast, "new key, caller time (fast path)"),
    (Case::NewGeneral, "new key, caller time, no mirror"),
    (Case::NewNow, "new key, Now"),
    (
        Case::CompoundTwoQuotas,
        "compound: 1 key, 2 quotas, admitted",
    ),
    (Case::CompoundThreeScopes, "compound: 3 scopes, admitted"),
    (Case::CompoundDenied, "compound: 1 key, 2 quotas, denied"),
];

fn decided(answer: Result<Decision, RedisDenial>) -> Result<bool, Error> {
    match answer {
        Ok(_) => Ok(true),
        Err(err) if err.denial().is_some() => Ok(false),
        Err(err) => Err(err.into()),
    }
}

fn unix() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

async fn usec_per_call(conn: &mut MultiplexedConnection) -> Result<(f64, u64), Error> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .ok_or("no cmdstat_evalsha")?;
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((field("usec_per_call="), field("calls=") as u64))
}

/// One compound call of `case` at caller time: admitted or denied.
async fn compound(limiter: &RedisLimiter, case: Case, deny: Quota) -> Result<bool, Error> {
    let admit = Quota::new(1e9, 1 << 40)?;
    let two = match case {
        Case::CompoundDenied => Policy::new([admit, deny])?,
        _ => Policy::new([admit, Quota::new(5e8, 1 << 40)?])?,
    };
    let one = Policy::from(admit);
    let scopes: Vec<(&str, &Policy)> = match case {
        Case::CompoundThreeScopes => vec![("k", &one), ("org", &one), ("global", &one)],
        _ => vec![("k", &two)],
    };
    match limiter.check_scopes(&scopes, unix(), 1).await {
        Ok(_) => Ok(true),
        Err(err) if err.denial().is_some() => Ok(false),
        Err(err) => Err(err.into()),
    }
}

async fn round(url: &str, case: Case, calls: usize, tag: &str) -> Result<f64, Error> {
    let admit = Quota::new(1e9, 1 << 40)?;
    let deny = Quota::new(1e-6, 1)?;
    let denying = matches!(case, Case::Denied | Case::DeniedNow | Case::CompoundDenied);
    let mirror = matches!(case, Case::AdmitFast | Case::NewFast | Case::AdmitNowFast);
    // 1 ms a token, and room for a billion: a bucket that stays behind.
    let behind = Quota::new(1000.0, 1_000_000_000)?;
    let is_compound = matches!(
        case,
        Case::CompoundTwoQuotas | Case::CompoundThreeScopes | Case::CompoundDenied
    );
    let quota = match case {
        _ if denying => deny,
        Case::AdmitNowFast => behind,
        _ => admit,
    };
    let mut limiter = RedisLimiter::connect(url, quota)
        .await?
        .with_namespace(format!("keyrate-cost:{tag}:"), keyrate::KeyNames::Encoded)
        .with_hash_tag(is_compound);
    if !mirror {
        limiter = limiter.with_mirror_capacity(0);
    }
    let now_case = matches!(
        case,
        Case::AdmitNow | Case::AdmitNowFast | Case::DeniedNow | Case::NewNow
    );
    let new_key = matches!(case, Case::NewFast | Case::NewGeneral | Case::NewNow);
    // Load the script and create the existing key (spent to empty when
    // denying).
    if is_compound {
        compound(&limiter, case, deny).await?;
    } else if now_case {
        decided(limiter.check("k", Now, 1).await)?;
    } else {
        decided(limiter.check("k", unix(), 1).await)?;
    }
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await?;
    let mut admitted = 0;
    for i in 0..calls {
        let key = if new_key { format!("n{i}") } else { "k".into() };
        if is_compound {
            admitted += usize::from(compound(&limiter, case, deny).await?);
            continue;
        }
        let answer = if now_case {
            limiter.check(key.as_str(), Now, 1).await
        } else {
            limiter.check(key.as_str(), unix(), 1).await
        };
        admitted += usize::from(decided(answer)?);
    }
    let (usec, seen) = usec_per_call(&mut conn).await?;
    let expect = if denying { 0 } else { calls };
    if admitted != expect || seen != calls as u64 {
        return Err(format!("{case:?}: {admitted} admitted, {seen} EVALSHA of {calls}").into());
    }
    limiter.reset_all().await?;
    Ok(usec)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::var("KEYRATE_REDIS_URL")
        .map_err(|_| "set KEYRATE_REDIS_URL, e.g. redis://127.0.0.1:24711")?;
    let mut args = std::env::args().skip(1);
    let calls: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let rounds: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let stamp = unix().as_nanos();
    println!("{:<50} {:>8} {:>8}", "case", "min us", "median");
    for (case, name) in CASES {
        let mut all = Vec::new();
        for r in 0..rounds {
            all.push(round(&url, case, calls, &format!("{stamp}:{case:?}:{r}")).await?);
        }
        all.sort_by(f64::total_cmp);
        println!("{name:<50} {:>8.2} {:>8.2}", all[0], all[all.len() / 2]);
    }
    Ok(())
}

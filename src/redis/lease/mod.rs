//! Concurrency limits shared by every process on one Redis: permits are
//! leases in Redis, renewed by the process that holds them.
//!
//! Each limiter key has one Redis key, its lease set: a sorted set of
//! lease ids scored by expiry (Unix milliseconds on Redis's clock), named
//! as the rate limiter names its buckets with `~` before the separator
//! (`names.rs`). Acquire is one script (`acquire.lua`: drop the expired
//! leases, count, add one if below the limit, set the set's expiry);
//! release is one `ZREM`; renewals are one script call per round
//! (`renew.lua`) from the process's renewal task (`renew.rs`). A process
//! that dies stops renewing, and its leases expire within the lease time.
//!
//! Files: `mod.rs` (the limiter), `settings.rs` (making and configuring
//! it), `report.rs` (what it reports), `acquire.rs` (taking a permit),
//! `permit.rs` (`RedisPermit`, `RedisConcurrencyDenial`), `renew.rs` (the
//! renewal task), `script.rs` (the scripts' arguments and replies),
//! `stats.rs`. See `docs/concurrency.md`.

mod acquire;
mod permit;
mod renew;
mod report;
mod script;
mod settings;
mod stats;
mod wait;

pub use self::permit::{RedisConcurrencyDenial, RedisPermit};
pub use self::stats::RedisConcurrencyStats;

use self::renew::RenewHandle;
use self::settings::LeaseSettings;
use self::stats::Counters;
use crate::sync::unmodeled::{AtomicU32, AtomicU64, Relaxed};
use ::redis::aio::ConnectionManager;
use parking_lot::Mutex;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// The lease time used unless
/// [`with_lease_time`](RedisConcurrencyLimiter::with_lease_time) sets
/// another: a process that dies holding permits blocks them for at most
/// this long. Its leases are renewed every third of it.
pub const DEFAULT_LEASE_TIME: Duration = Duration::from_secs(15);

/// Limits how many permits each key holds at once over every process that
/// shares a Redis: the Redis twin of
/// [`ConcurrencyLimiter`](crate::ConcurrencyLimiter).
///
/// A permit is a lease in Redis, taken with
/// [`try_acquire`](Self::try_acquire) (one script call, atomic) and
/// released when its [`RedisPermit`] is dropped (queued to this process's
/// renewal task, which sends one `ZREM`: a drop never blocks). While a
/// permit lives, the renewal task renews its lease every third of the
/// lease time ([`with_lease_time`](Self::with_lease_time), default
/// [`DEFAULT_LEASE_TIME`]), all of the process's leases in one call per
/// round on a standalone Redis. A process that dies without releasing
/// stops renewing: its leases expire after the lease time, so a crashed
/// server locks a customer out for at most that long.
///
/// Each key's leases live in one Redis key, so every call touches one
/// hash slot and the limiter works on Redis Cluster (where a renewal
/// round is one call per key held). The clock is Redis's own (`TIME`,
/// read in the scripts): the processes need not agree on the time.
///
/// Limiters share a key's permits exactly when they have the same
/// namespace, [`KeyNames`](crate::KeyNames) and hash tag setting
/// ([`with_namespace`](Self::with_namespace)); an unnamed limiter shares
/// with its clones only. Lease sets are named apart from the rate
/// limiter's buckets, even in the same namespace.
///
/// Failures (Redis unreachable, a timeout, a bad reply) are answered by
/// the [`FailurePolicy`](crate::FailurePolicy): closed (the default)
/// refuses with [`RedisConcurrencyDenial::Failed`], open gives a
/// degraded permit that holds no lease. Acquires go through a circuit
/// breaker of their own, as [`RedisLimiter`](crate::RedisLimiter)'s calls
/// do. The limiter needs a tokio runtime: its renewal task runs on the
/// runtime of its first acquire.
///
/// # Examples
///
/// ```
/// use keyrate::{ConcurrencyDenial, KeyNames, RedisConcurrencyDenial, RedisConcurrencyLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("KEYRATE_REDIS_URL")?;
/// # let namespace = format!("doc-streams-{}-{:?}", std::process::id(), std::time::SystemTime::now());
/// // In every process of the fleet: 2 streams per key at once.
/// let limiter = RedisConcurrencyLimiter::connect(&url, 2)
///     .await?
///     .with_namespace(namespace, KeyNames::Encoded);
/// let a = limiter.try_acquire("tenant-1").await?;
/// let _b = limiter.try_acquire("tenant-1").await?;
/// match limiter.try_acquire("tenant-1").await {
///     Err(RedisConcurrencyDenial::Denied(ConcurrencyDenial::AtLimit { held, max })) => {
///         assert_eq!((held, max), (2, 2));
///     }
///     other => panic!("{other:?}"),
/// }
/// drop(a); // released in the background
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisConcurrencyLimiter<C = ConnectionManager> {
    settings: LeaseSettings,
    /// What clones share: the default limit, the renewal task, counters.
    core: Arc<Core>,
    connection: C,
}

/// What a limiter and its clones share.
struct Core {
    /// The default limit, `1..=u32::MAX`. Relaxed: one word, read whole.
    max: AtomicU32,
    /// The renewal task, started by the first acquire (again if its
    /// runtime shut down).
    renewer: Mutex<Option<RenewHandle>>,
    counters: Arc<Counters>,
    /// This process's callers waiting for a key, in order.
    queues: wait::Queues,
    /// Lease ids: 64 random bits of this core's, then a count.
    tag: u64,
    /// The next lease's number. Relaxed: only its uniqueness matters.
    next_id: AtomicU64,
}

impl Core {
    fn new(max: u32) -> Self {
        Core {
            max: AtomicU32::new(max),
            renewer: Mutex::new(None),
            counters: Arc::new(Counters::default()),
            queues: wait::Queues::default(),
            tag: RandomState::new().build_hasher().finish(),
            next_id: AtomicU64::new(0),
        }
    }

    /// A lease id no other permit of any process has: this core's random
    /// tag (64 bits from the OS's randomness) and a count.
    fn next_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Relaxed);
        format!("{:016x}:{n:x}", self.tag)
    }
}

impl<C> fmt::Debug for RedisConcurrencyLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConcurrencyLimiter")
            .field("max", &self.core.max.load(Relaxed))
            .field("settings", &self.settings)
            .field("stats", &self.core.counters.read())
            .finish_non_exhaustive()
    }
}

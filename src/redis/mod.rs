//! The limiter with its buckets in Redis (feature `redis`): one budget per
//! key shared by every process that talks to the same Redis.
//!
//! Each decision Redis makes is one Lua script (`src/redis/bucket.lua`),
//! run atomically on a single key, so it works unchanged on Redis Cluster.
//! The key holds the bucket's word `full_at` in nanoseconds, as a decimal
//! string; a missing key is the word 0, a full bucket. Rust does every
//! division before the call, so the script only compares and adds, on
//! `(seconds, nanoseconds)` pairs that Lua's doubles hold exactly; it
//! returns the word it read, and Rust answers with `gcra::decide` on it. A
//! denial writes nothing; an admission writes the new word with a TTL equal
//! to the time until the bucket is full again. The local deny mirror
//! (`mirror.rs`) answers without Redis the calls that the last word Redis
//! showed already denies.
//!
//! Files: `settings.rs` (what a limiter is configured with), `builder.rs`
//! (connecting and configuring), `script.rs` (the script's arguments and
//! reply), `call.rs` (the I/O-free core: prepare a call, finish it from the
//! reply), `limiter.rs` and `blocking.rs` (the async and blocking front
//! ends; `deadline.rs`, the blocking calls' one deadline), `mirror.rs` (the local deny mirror), `names.rs` (the Redis
//! name of a bucket), `breaker.rs` (the circuit breaker), `reset.rs`
//! (resets), `error.rs`; `compound/` holds the compound calls (several
//! quotas and keys, all or nothing, in one script call); `lease/`, the concurrency limiter whose permits
//! are leases in Redis (`RedisConcurrencyLimiter`).

mod blocking;
mod breaker;
mod builder;
mod call;
mod compound;
mod deadline;
mod error;
mod lease;
mod limiter;
mod mirror;
mod names;
mod reading;
mod reset;
mod script;
mod settings;
mod stats;

pub use self::blocking::{BlockingConnection, BlockingRedisLimiter};
pub use self::breaker::CircuitStats;
pub use self::compound::{Placed, RedisCompoundDenial};
pub use self::error::{FailurePolicy, RedisDenial, RedisErrorKind, RedisLimiterError};
pub use self::lease::{
    RedisConcurrencyDenial, RedisConcurrencyLimiter, RedisConcurrencyStats, RedisPermit,
    DEFAULT_LEASE_TIME,
};
pub use self::limiter::RedisLimiter;
pub use self::names::{KeyNames, KeySecret};
pub use self::settings::DEFAULT_REDIS_TIMEOUT;

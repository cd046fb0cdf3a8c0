//! The limiter with its buckets in Redis (feature `redis`): one budget per
//! key shared by every process that talks to the same Redis.
//!
//! Each decision is one Lua script (`src/redis/bucket.lua`), run
//! atomically by Redis on a single key, so it works unchanged on Redis
//! Cluster. The script applies the very rule of the in-memory limiter
//! (`gcra::decide`): the key holds the bucket's word `full_at` in
//! nanoseconds, as a decimal string; a missing key is the word 0, a full
//! bucket. Rust does every division before the call (the refill a cost uses
//! and the refill of a full bucket, exact as in memory), so the script only
//! compares and adds, on `(seconds, nanoseconds)` pairs that Lua's doubles
//! hold exactly. A denial writes nothing; an admission writes the new word
//! with a TTL equal to the time until the bucket is full again.
//!
//! Files: `settings.rs` (what a limiter is configured with), `script.rs`
//! (the script's arguments and reply), `call.rs` (the I/O-free core:
//! prepare a call, finish it from the reply), `limiter.rs` and
//! `blocking.rs` (the async and blocking front ends), `mirror.rs` (the
//! local deny mirror), `error.rs`.

mod blocking;
mod builder;
mod call;
mod error;
mod limiter;
mod mirror;
mod script;
mod settings;
mod stats;

pub use self::blocking::BlockingRedisLimiter;
pub use self::error::{FailurePolicy, RedisErrorKind, RedisLimiterError};
pub use self::limiter::RedisLimiter;
pub use self::settings::{DEFAULT_REDIS_PREFIX, DEFAULT_REDIS_TIMEOUT};

//! keyrate: a per-key, lock-free token-bucket rate limiter for servers.
//!
//! Each key's bucket holds up to `capacity` tokens and refills continuously
//! at `rate` tokens per second; each admitted call spends `cost` tokens
//! (default 1). A new key starts full. Refill is computed from elapsed time
//! on each call: no background thread, O(1) per call however long a key was
//! idle. Each bucket is one 64-bit word, updated under its map shard's lock
//! or, for a key that a thread hammers or a handle holds, with a lock-free
//! compare-and-swap, so any number of threads can call
//! [`TokenBucketLimiter::allow`] at once.
//!
//! ```
//! use keyrate::TokenBucketLimiter;
//!
//! let limiter = TokenBucketLimiter::new(1.0, 3); // rate: tokens/s, capacity: tokens
//! assert!(limiter.allow("key1", 0.0)); // timestamp: seconds
//! assert!(limiter.allow("key1", 0.0));
//! assert!(limiter.allow("key1", 0.0));
//! assert!(!limiter.allow("key1", 0.0));
//! assert!(limiter.allow("key1", 2.0));
//! assert!(!limiter.allow_n("key1", 2.0, 2)); // cost
//! let err = TokenBucketLimiter::try_new(f64::NAN, 3);
//! assert!(err.is_err());
//! println!("{}", err.unwrap_err()); // says what is wrong and what is accepted
//! ```
//!
//! # Calls
//!
//! Every backend answers the same calls, written once in two traits:
//! [`Limiter`] (answered in the calling thread: [`TokenBucketLimiter`],
//! [`BucketHandle`], and the blocking Redis limiter) and [`AsyncLimiter`]
//! (awaited: the in-memory limiter and `RedisLimiter`, which is what the
//! tower layer takes). Each call takes its instant as one argument,
//! `impl Into<`[`At`]`>`: `f64` seconds (the form above), an exact
//! [`Duration`](std::time::Duration) since the caller's epoch, or [`Now`]
//! (the backend's clock). A decision is `Ok(`[`Decision`]`)` or the
//! backend's [`Refusal`] ([`Denial`] in memory). The in-memory limiter also
//! has `allow`, `allow_n`, `check` and `remaining` as its own methods, so
//! the form above needs no trait import.
//!
//! Compound limits (several quotas per key, several keys per call, charged
//! all or nothing) have their own limiter, [`CompoundLimiter`], and their
//! own two traits, [`Compound`] and [`AsyncCompound`], which the Redis
//! limiters and the tower layer `CompoundLimitLayer` answer too
//! (`docs/compound.md`).
//!
//! # Semantics
//!
//! - Instants are `f64` seconds rounded to the nearest nanosecond, or exact
//!   nanoseconds, from 0 up to [`MAX_TIMESTAMP_NANOS`] (`2^63 - 1` ns,
//!   about 292 years). NaN, infinite, negative or larger instants are
//!   denied and change nothing.
//! - Decisions equal an exact token bucket evaluated at those nanoseconds
//!   that refills one token every [`Quota::interval`]: `1e9 / rate` ns
//!   rounded up to a whole nanosecond. A full bucket admits calls whose
//!   costs sum to exactly `capacity`, at one instant, with any mix of
//!   costs; over any span, admitted cost never exceeds
//!   `capacity + rate * span` (keyrate is never more lenient than the exact
//!   token bucket); and the long-run rate served is below `rate` by less
//!   than 1 ns per token, at most [`MAX_RATE_SHORTFALL`] (0.1%): a rate
//!   that cannot be served that closely is refused with
//!   [`ConfigError::RateImprecise`] (see [`Quota`]).
//! - Time that runs backwards never creates tokens: a call stamped earlier
//!   than the bucket's last update sees the bucket as it was at that
//!   earlier instant, with every later spend already charged. A bucket's
//!   state only moves forward.
//! - Cost 0 is always admitted and changes nothing; a cost above the
//!   capacity is never admitted ([`Denial::ExceedsCapacity`]).
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod bucket;
mod compound;
mod concurrency;
mod decision;
mod dice;
#[cfg(doctest)]
mod docs;
mod error;
#[cfg(loom)]
mod flaw;
mod gcra;
mod guard;
mod hot;
mod keyed;
#[cfg(feature = "tower")]
pub mod layer;
mod limiter;
mod live_quota;
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api;
mod observe;
mod pace;
#[cfg(feature = "prometheus")]
pub mod prometheus;
#[cfg(feature = "redis")]
mod redis;
mod store;
mod sync;
mod time;
mod under;
mod votes;

pub use crate::compound::{
    AsyncCompound, Compound, CompoundDecision, CompoundDenial, CompoundLimiter, CompoundRefusal,
    CompoundStats, Policy, COUNTED_SCOPES, MAX_QUOTAS,
};
pub use crate::concurrency::{
    AsyncConcurrencyLimiter, ConcurrencyDenial, ConcurrencyLimiter, ConcurrencyStats, Permit,
};
pub use crate::decision::{Decision, Refusal};
pub use crate::error::{ConfigError, Denial};
pub use crate::gcra::{Quota, MAX_RATE_SHORTFALL};
pub use crate::keyed::{BucketHandle, DefaultHasher, TokenBucketLimiter};
#[cfg(feature = "tower")]
pub use crate::layer::{
    CompoundLimitLayer, CompoundLimitService, ConcurrencyLimitLayer, ConcurrencyLimitService,
    DeclaredLengthLayer, HeldPermit, Limited, RateLimitLayer, RateLimitService,
};
pub use crate::limiter::{AsyncLimiter, Limiter};
#[cfg(feature = "tower")]
pub use crate::observe::Responses;
pub use crate::observe::{
    KeyLabels, Offenders, Stats, DEFAULT_OFFENDER_WINDOW, MAX_KEY_LABEL_LEN, MIN_LABEL_SECRET_LEN,
    OFFENDER_SLOTS,
};
#[cfg(feature = "redis")]
pub use crate::redis::{
    BlockingConnection, BlockingRedisLimiter, CircuitStats, FailurePolicy, KeyNames, KeySecret,
    Placed, RedisCompoundDenial, RedisConcurrencyDenial, RedisConcurrencyLimiter,
    RedisConcurrencyStats, RedisDenial, RedisErrorKind, RedisLimiter, RedisLimiterError,
    RedisPermit, DEFAULT_LEASE_TIME, DEFAULT_REDIS_TIMEOUT,
};
pub use crate::store::Store;
pub use crate::time::{At, Clock, ManualClock, MonotonicClock, Now, MAX_TIMESTAMP_NANOS};
pub use crate::under::Under;

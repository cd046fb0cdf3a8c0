//! Compound limits: several quotas per key ([`Policy`]) and several keys
//! per call, charged all or nothing ([`CompoundLimiter`]).
//!
//! Apart from the single-quota limiter on purpose: its one-word buckets
//! and their lock-free paths are untouched. Here a key's bucket is up to
//! [`MAX_QUOTAS`] words under one small lock (`store::Cell`), and a call
//! takes the locks of all its keys' buckets in one global order (their
//! addresses), decides every quota with [`gcra::decide`](crate::gcra),
//! and writes every word or none. See `docs/compound.md`.
//!
//! Files: `policy.rs` (the quotas of one key), `outcome.rs` (decisions
//! and denials), `decide.rs` (the rule as pure arithmetic on words, shared
//! with the Redis backend), `calls.rs` (the traits every compound backend
//! answers), `limiter.rs` (the in-memory front end), `build.rs` (making and
//! configuring it), `charge.rs` (its
//! locking), and `store.rs` (its keyed store).

mod build;
mod calls;
mod cell;
mod charge;
pub(crate) mod decide;
mod hot;
mod limiter;
mod outcome;
mod policy;
pub(crate) mod stats;
mod store;

pub use self::calls::{AsyncCompound, Compound, CompoundRefusal};
pub use self::limiter::CompoundLimiter;
pub use self::outcome::{CompoundDecision, CompoundDenial};
pub use self::policy::{Policy, MAX_QUOTAS};
pub use self::stats::{CompoundStats, COUNTED_SCOPES};

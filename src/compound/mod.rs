//! Compound limits: several quotas per key ([`Policy`]) and several keys
//! per call, charged all or nothing ([`CompoundLimiter`]).
//!
//! Apart from the single-quota limiter on purpose: its one-word buckets
//! and their lock-free paths are untouched. Here a key's bucket is 1 to
//! [`MAX_QUOTAS`] words: inline in its map entry, under the shard's lock,
//! for a key of at most two quotas called alone through the map
//! (`store::Slot`), else a cell behind a sequence lock (`cell::Cell`). A
//! thread that keeps calling one key caches its cell (`hot::HotCells`)
//! and takes no shard lock; a call whose every scope's cell is cached
//! decides on a lock-free read of them all at one instant, and a denial
//! returns with nothing written. An admission of cached cells, and a
//! call of several scopes through the map, takes the cells' locks in one
//! global order (their addresses), decides every quota with
//! [`gcra::decide`](crate::gcra), and writes every word or none. See
//! `docs/compound.md`.
//!
//! Files: `policy.rs` (the quotas of one key), `outcome.rs` (decisions
//! and denials), `decide.rs` (the rule as pure arithmetic on words, shared
//! with the Redis backend), `calls.rs` (the traits every compound backend
//! answers), `limiter.rs` (the in-memory front end), `build.rs` (making and
//! configuring it), `charge.rs` (its locking), `cell.rs` (a key's words
//! and their sequence lock), `hot.rs` (the per-thread caches of hot
//! cells), `route.rs` (which way a call goes: the thread's cache or the
//! map), and `store.rs` (its keyed store).

mod build;
mod calls;
mod cell;
mod charge;
pub(crate) mod decide;
mod hot;
mod limiter;
mod outcome;
mod policy;
mod route;
pub(crate) mod stats;
mod store;

pub use self::calls::{AsyncCompound, Compound, CompoundRefusal};
pub use self::limiter::CompoundLimiter;
pub use self::outcome::{CompoundDecision, CompoundDenial};
pub use self::policy::{Policy, MAX_QUOTAS};
pub use self::stats::{CompoundStats, COUNTED_SCOPES};

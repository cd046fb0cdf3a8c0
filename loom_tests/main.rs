//! loom models of every concurrent protocol in keyrate.
//!
//! Run with (a separate target directory keeps the normal build intact):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom
//! ```
//!
//! Under `cfg(loom)` the library's own atomics, `Arc` and map lock are loom's
//! (see `src/sync.rs` and `src/store/mod.rs`), so these models explore every
//! interleaving of the real bucket, the real decision and the real keyed
//! insert and eviction paths. Each model with a `broken_` twin shows that the
//! model can fail: the twin swaps one step of the protocol for a plausible
//! wrong one and passes only if loom finds the bug.
//!
//! | file | protocol |
//! |---|---|
//! | `same_instant.rs` | model 1: concurrent spends on one bucket at one instant |
//! | `timestamps.rs` | model 2: spends at different timestamps, some older |
//! | `first_use.rs` | model 3: the first use of a key, raced |
//! | `eviction.rs` | model 4: eviction racing spends and handles |
//! | `cap.rs` | model 5: the bucket cap's reservations, racing |
//! | `unlocked_reads.rs` | model 6: eviction when readers take no lock |
//! | `live_quota.rs` | model 7: the default quota replaced while calls read it |
//! | `concurrency.rs` | model 8: concurrency permits: takes, releases, the idle sweep, a waiter's cancel |
//! | `sweep_handoff.rs` | model 9: the automatic sweep handed between creations |
//! | `counters.rs` | model 10: the counters' single-writer stripes and thread slots |
//! | `hot_keys.rs` | model 11: a hot-key cache's spend racing a sweep |
//! | `reset.rs` | model 12: a reset racing spends and the sweep's retirement |
//! | `compound.rs` | models 13 and 14: compound calls all or nothing; scopes locked in one order, no deadlock |
//! | `compound_reads.rs` | models 15, 16, 19 and 20: a compound denial read lock-free vs an admission; a cached compound spend vs the sweep's retirement; a call of a cached key and one from the map vs the sweep; a call stamped before a sweep that removes its key |
//! | `compound_snapshot.rs` | model 17: a compound denial of two scopes on a lock-free snapshot vs an admission on both |
//! | `compound_cap.rs` | model 18: at the cap, a new key's room-making sweep vs a spend on the key that holds the place |
#![cfg(loom)]

mod support;

mod cap;
mod compound;
mod compound_cap;
mod compound_reads;
mod compound_snapshot;
mod concurrency;
mod counters;
mod eviction;
mod first_use;
mod hot_keys;
mod live_quota;
mod reset;
mod same_instant;
mod sweep_handoff;
mod timestamps;
mod unlocked_reads;

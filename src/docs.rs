//! README.md and docs/*.md, compiled as doctests (`#[cfg(doctest)]` in
//! lib.rs): every Rust example in them is a test, so none can go stale.
//!
//! A page whose examples need a cargo feature is included only with that
//! feature; `cargo test --all-features --doc` runs them all (the Redis
//! pages need `KEYRATE_REDIS_URL` and `KEYRATE_REDIS_CLUSTER_URLS`, which
//! `scripts/test.sh` sets).

/// README.md.
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/semantics.md.
#[doc = include_str!("../docs/semantics.md")]
pub struct SemanticsDoctests;

/// docs/compound.md.
#[doc = include_str!("../docs/compound.md")]
pub struct CompoundDoctests;

/// docs/memory.md.
#[doc = include_str!("../docs/memory.md")]
pub struct MemoryDoctests;

/// docs/server.md: the tower layer and the async wait.
#[cfg(all(feature = "tower", feature = "tokio"))]
#[doc = include_str!("../docs/server.md")]
pub struct ServerDoctests;

/// docs/redis.md: a Redis server, a Redis Cluster, and the layer over Redis.
#[cfg(all(feature = "redis-cluster", feature = "tower"))]
#[doc = include_str!("../docs/redis.md")]
pub struct RedisDoctests;

/// docs/observability.md: Prometheus behind a layer.
#[cfg(all(feature = "prometheus", feature = "tower"))]
#[doc = include_str!("../docs/observability.md")]
pub struct ObservabilityDoctests;

/// docs/security.md.
#[doc = include_str!("../docs/security.md")]
pub struct SecurityDoctests;

/// docs/concurrency.md.
#[doc = include_str!("../docs/concurrency.md")]
pub struct ConcurrencyDoctests;

/// docs/design.md.
#[doc = include_str!("../docs/design.md")]
pub struct DesignDoctests;

/// docs/model-checking.md.
#[doc = include_str!("../docs/model-checking.md")]
pub struct ModelCheckingDoctests;

/// docs/performance.md.
#[doc = include_str!("../docs/performance.md")]
pub struct PerformanceDoctests;

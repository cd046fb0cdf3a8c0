//! Configuring a Redis limiter, async or blocking: the settings it
//! carries (namespace, deadline, TTL floor, mirror, failure policy,
//! circuit breaker), written once for both: they are one type,
//! [`RedisLimiter`], over two kinds of connection. Making one, by
//! connecting or over a connection of the caller's, is `builder/connect.rs`.

mod connect;

pub(super) use self::connect::connect_manager;

use super::breaker::Breaker;
use super::error::FailurePolicy;
use super::limiter::RedisLimiter;
use super::names::{KeyNames, Names};
use std::time::Duration;

/// # Settings, for the async and the blocking limiter alike
impl<C> RedisLimiter<C> {
    /// Names this limiter's buckets in Redis: `namespace`, then each key
    /// as `keys` says. **Limiters share buckets exactly when they have the
    /// same namespace, the same [`KeyNames`] (the same secret) and the
    /// same hash tag setting**: give every process that must share a
    /// budget the same three, and every other limiter on the same Redis
    /// another namespace.
    ///
    /// Without this call a limiter has a namespace of its own,
    /// `keyrate-private-` and 64 random bits, with keys hashed under a
    /// random secret: it shares with its clones and nothing else, so two
    /// limiters never share a bucket by accident (they used to, on the
    /// default prefix), and no key shows in Redis. A limiter that several
    /// processes share must be named.
    ///
    /// The name of a bucket is the namespace, percent-encoded, then `#`
    /// and the key's keyed hash ([`KeyNames::Hashed`]) or `|` and the key
    /// percent-encoded ([`KeyNames::Encoded`]). The encoding keeps
    /// `A-Z a-z 0-9 - _ . :` and turns every other byte into `%XX`, braces
    /// included: no namespace and no key can end another's name early (so
    /// `"rl:"` + `"tts:x"` and `"rl:tts:"` + `"x"` are different buckets),
    /// and no key can choose its Redis Cluster hash slot (see
    /// [`with_hash_tag`](Self::with_hash_tag) for a deliberate one).
    /// [`bucket_key`](Self::bucket_key) tells the name of a key.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{KeyNames, KeySecret, Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// # std::env::set_var("KEYRATE_KEY_SECRET", "0123456789abcdef0123456789abcdef");
    /// let secret = KeySecret::new(std::env::var("KEYRATE_KEY_SECRET")?)?; // the same everywhere
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_namespace("rl:api", KeyNames::Hashed(secret));
    /// assert!(limiter.bucket_key("sk_live_1").starts_with("rl:api#"));
    /// assert!(!limiter.bucket_key("sk_live_1").contains("sk_live_1"));
    ///
    /// let readable = limiter.clone().with_namespace("rl:tts", KeyNames::Encoded);
    /// assert_eq!(readable.bucket_key("sk {live} 1"), "rl:tts|sk%20%7Blive%7D%201");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_namespace(mut self, namespace: impl AsRef<str>, keys: KeyNames) -> Self {
        let hash_tag = self.settings.names.hash_tag();
        self.settings
            .set_names(Names::new(namespace.as_ref(), keys, hash_tag));
        self
    }

    /// [`with_namespace`](Self::with_namespace)`(prefix, KeyNames::Encoded)`:
    /// a shared namespace whose bucket names show the keys, percent-encoded.
    /// Kept for code written before namespaces, when a bucket's name was
    /// the prefix and the raw key.
    ///
    /// Deprecated because its name does not say that it writes every key
    /// into Redis as it is: anyone who can read Redis (`SCAN`, `MONITOR`,
    /// a replica, a backup) then reads your users' API keys. Name buckets
    /// by keyed hashes (`KeyNames::Hashed`, with a `KeySecret` your
    /// processes share), or say `KeyNames::Encoded` where keys are not
    /// secrets (customer ids).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// #[allow(deprecated)]
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_prefix("rl:tts:");
    /// assert_eq!(limiter.bucket_key("cust_1"), "rl:tts:|cust_1");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    #[deprecated(
        since = "0.1.0",
        note = "writes raw keys into Redis names: use with_namespace(namespace, \
                KeyNames::Hashed(secret)), or KeyNames::Encoded for keys that are not secrets"
    )]
    pub fn with_prefix(self, prefix: impl AsRef<str>) -> Self {
        self.with_namespace(prefix, KeyNames::Encoded)
    }

    /// Puts every bucket of this limiter in one Redis Cluster hash slot
    /// (default off): the bucket names start with the namespace in braces,
    /// `{namespace}`, a hash tag, so a cluster keeps them all on the
    /// master that owns that slot. Only the namespace can be a hash tag:
    /// braces in a key (or in the namespace) are encoded. Use it when
    /// something must see all of a limiter's buckets on one node (a
    /// `SCAN` of one node, a script over several buckets); it puts the
    /// limiter's whole load on that one master. It changes every name, so
    /// all the processes sharing the namespace must agree on it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_namespace("tenant7", keyrate::KeyNames::Encoded)
    ///     .with_hash_tag(true);
    /// assert_eq!(limiter.bucket_key("{k}"), "{tenant7}|%7Bk%7D");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_hash_tag(mut self, on: bool) -> Self {
        let names = self.settings.names.with_hash_tag(on);
        self.settings.set_names(names);
        self
    }

    /// Sets the deadline of each call (default [`DEFAULT_REDIS_TIMEOUT`](crate::DEFAULT_REDIS_TIMEOUT), at
    /// least 1 ms); a call without an answer by then fails with
    /// [`RedisErrorKind::Timeout`](crate::RedisErrorKind::Timeout). The
    /// blocking limiter applies it to each socket read and write and each
    /// connection attempt.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_timeout(Duration::from_millis(50));
    /// # let _ = limiter;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.settings.set_timeout(timeout);
        self
    }

    /// Sets a floor under every written key's TTL (default none: the TTL
    /// is exactly the time until the bucket is full again).
    ///
    /// Redis expires keys on its own clock, while the TTL is computed on
    /// the caller's timeline. A writer whose clock runs `d` ahead of the
    /// others sets TTLs `d` too short, and made-up timestamps (a
    /// simulation, a test) may not advance in real time at all: a key could
    /// then expire before the callers' timeline reaches the instant its
    /// bucket is full, refilling it early. After an admission a bucket is
    /// full again within the quota's window (capacity times interval), so a
    /// floor of at least the window plus the clocks' largest disagreement
    /// (or longer than such a run) prevents that on every caller's
    /// timeline. A longer TTL never changes a decision, it only keeps idle
    /// keys longer. The floor is capped at about 292 years.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_min_ttl(Duration::from_secs(3600));
    /// # let _ = limiter;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.settings.set_min_ttl(min_ttl);
        self
    }

    /// Sets how many bucket keys the local deny mirror remembers (default
    /// 65,536); 0 turns the mirror off, so that every call asks Redis.
    ///
    /// The mirror keeps, per key, the word Redis last showed this limiter
    /// (and its clones): Redis's word only grows (but for resets and lost
    /// keys, see [`with_mirror_refresh`](Self::with_mirror_refresh)), so a call that this lower
    /// bound already denies is denied without a round trip, with the same
    /// decision Redis would make. Only calls the bound admits go to Redis.
    /// With the caller's timestamps the decisions are exactly those of the
    /// mirror-off limiter (a local denial's `retry_after` is a lower bound
    /// of Redis's when other processes spend the same key). With Redis's
    /// clock ([`Now`](crate::Now)) the mirror estimates that clock from earlier
    /// replies, from above: it may deny a call that would have reached
    /// Redis up to one round trip later and been admitted, never more. A
    /// local denial needs no Redis, so it stays a denial while Redis is
    /// down, whatever the [`FailurePolicy`](crate::FailurePolicy).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let every_call_asks_redis = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_mirror_capacity(0);
    /// # let _ = every_call_asks_redis;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_mirror_capacity(mut self, capacity: usize) -> Self {
        self.settings.set_mirror_capacity(capacity);
        self
    }

    /// Sets how long the local deny mirror denies with a bound after the
    /// call that showed it was sent (default 1 s); then the next call on
    /// the key goes to Redis and refreshes it.
    ///
    /// A bound is a lower bound of the word in Redis only while that word
    /// does not fall, and it falls when another process
    /// [`reset`](Self::reset)s the key (or Redis loses it: a restart
    /// without persistence, `FLUSHALL`, a failover to a replica that
    /// lagged). This limiter cannot see that without a round trip, so it
    /// may deny such a key for up to this long after the fall, and never
    /// longer. A hammered key costs one more round trip per period. This
    /// limiter's own resets (and its clones') forget the bound at once.
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_mirror_refresh(Duration::from_millis(200));
    /// # let _ = limiter;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_mirror_refresh(mut self, refresh: Duration) -> Self {
        self.settings.set_mirror_refresh(refresh);
        self
    }

    /// Sets what every deciding call answers when Redis cannot decide
    /// (default [`FailurePolicy::Closed`]; see [`FailurePolicy`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{FailurePolicy, Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_failure_policy(FailurePolicy::Open);
    /// assert_eq!(limiter.failure_policy(), FailurePolicy::Open);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.settings.failure_policy = policy;
        self
    }

    /// Sets the circuit breaker (default: opens after 5 round trips in a
    /// row failed for want of Redis, probes every 50 ms; `failures` 0
    /// turns it off).
    ///
    /// After `failures` consecutive round trips that failed with
    /// [`Unavailable`](crate::RedisErrorKind::Unavailable) or
    /// [`Timeout`](crate::RedisErrorKind::Timeout), the breaker opens:
    /// every call that needs Redis is decided by the
    /// [`FailurePolicy`] at once, without a round trip, with an error whose
    /// [`is_circuit_open`](crate::RedisLimiterError::is_circuit_open) is
    /// true (counted in [`Stats::backend_errors`](crate::Stats::backend_errors) like any failure, and in
    /// [`circuit_stats`](Self::circuit_stats)). From `probe_every` after it
    /// opened, one call at a time goes to Redis as a probe, at most one per
    /// `probe_every`; the first that Redis answers closes the breaker. So
    /// an outage costs the calls made meanwhile nothing but their answer,
    /// and a Redis that answers again is used within about `probe_every`
    /// plus a round trip. The local deny mirror works on regardless. Any
    /// answer from Redis (a script error included) counts as Redis being
    /// up. The breaker is one per limiter and its clones, not one per
    /// node: on Redis Cluster a master that is down opens it only when the
    /// round trips to it come in a row (the Redis Cluster section of
    /// `docs/redis.md`).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?)
    ///     .await?
    ///     .with_circuit_breaker(3, Duration::from_millis(20));
    /// assert!(!limiter.circuit_stats().open);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_circuit_breaker(mut self, failures: u32, probe_every: Duration) -> Self {
        self.settings.breaker = std::sync::Arc::new(Breaker::new(failures, probe_every));
        self
    }
}

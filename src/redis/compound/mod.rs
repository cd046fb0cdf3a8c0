//! Compound calls on Redis: several quotas per key and several keys per
//! call, charged all or nothing by one script call (`compound.lua`) over
//! all of the call's buckets, with the in-memory rule (`compound::decide`).
//!
//! A compound bucket is one Redis key holding its words, `w0,w1,...`
//! (word `i` for quota `i` of the key's policy); a one-quota bucket is a
//! single-quota limiter's bucket, the same key and the same word. On a
//! Redis Cluster one script can only touch keys of one hash slot, so a
//! call whose buckets would fall in several slots is refused
//! ([`CompoundDenial::CrossSlot`](crate::CompoundDenial::CrossSlot))
//! before any round trip, on every Redis (so that code does not change
//! when it moves to a cluster). Buckets are
//! placed in one slot by an anchor ([`RedisLimiter::placed`]), or all in
//! the namespace's slot ([`RedisLimiter::with_hash_tag`]).
//!
//! Files: `core.rs` (the I/O-free core: checks, names, the mirror's
//! denial, the invocation, the decision from the reply), `slot.rs` (hash
//! slots), `bounds.rs` (the mirror's bounds of compound words),
//! `error.rs` (the refusal), `front.rs` (the front ends, async and
//! blocking, of the limiter and of its placed view), and here the placed
//! view ([`Placed`]), the limiter's compound methods and placed resets.

pub(super) mod bounds;
mod core;
mod error;
mod front;
mod slot;

pub use self::error::RedisCompoundDenial;

use super::blocking::BlockingConnection;
use super::error::RedisLimiterError;
use super::limiter::RedisLimiter;
use super::reset::parse;
use crate::compound::CompoundStats;
use ::redis::aio::ConnectionLike;
use std::fmt;

/// A Redis limiter whose compound calls place every bucket in the hash
/// slot of one anchor (see [`RedisLimiter::placed`]): the same calls, as
/// [`AsyncCompound`](crate::AsyncCompound) or [`Compound`](crate::Compound).
#[derive(Clone, Copy)]
pub struct Placed<'a, L> {
    limiter: &'a L,
    anchor: &'a str,
}

impl<L> fmt::Debug for Placed<'_, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The anchor is a key: it does not print.
        f.debug_struct("Placed").finish_non_exhaustive()
    }
}

/// # Compound calls
impl<C> RedisLimiter<C> {
    /// This limiter's compound calls with every bucket placed in the hash
    /// slot of `anchor`: each key's Redis name carries the hash tag of
    /// `anchor` (hashed or encoded as keys are, so no key can choose a
    /// slot), so a call's buckets share one Redis Cluster slot.
    ///
    /// Anchor a call by its broadest scope (the organization of an API
    /// key, or the global key), and **charge a key always under the same
    /// anchor**: the anchor is part of its bucket's name, so one key under
    /// two anchors is two buckets. The trade: every bucket placed by one
    /// anchor lives on the one master that owns its slot, so a global
    /// scope pins every call it is part of to one master. Without an
    /// anchor a call's buckets have the names of single-quota buckets, one
    /// slot each, and a call of several scopes is refused
    /// ([`CompoundDenial::CrossSlot`](crate::CompoundDenial::CrossSlot))
    /// unless the namespace itself is the hash tag
    /// ([`with_hash_tag`](Self::with_hash_tag), which also overrides
    /// anchors).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{AsyncCompound, CompoundDenial, Policy, Quota, RedisCompoundDenial, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// # let prefix = format!("keyrate-doc-placed:{}:{:?}:", std::process::id(), std::time::SystemTime::now());
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?.with_namespace(prefix, keyrate::KeyNames::Encoded);
    /// let plan = Policy::new([Quota::new(10.0, 20)?, Quota::new(1.0, 5)?])?;
    /// let org = Policy::from(Quota::new(100.0, 6)?);
    /// let scopes = [("sk_live_1", &plan), ("org_7", &org)];
    ///
    /// let decision = limiter.placed("org_7").check_scopes(&scopes, 0.0, 5).await?;
    /// assert_eq!((decision.remaining(), decision.scope(), decision.quota()), (0, 0, 1));
    /// // Unplaced, the two buckets fall in different slots: refused.
    /// let refused = AsyncCompound::check_scopes(&limiter, &scopes, 0.0, 1).await;
    /// assert!(matches!(
    ///     refused,
    ///     Err(RedisCompoundDenial::Denied(CompoundDenial::CrossSlot { .. }))
    /// ));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn placed<'a>(&'a self, anchor: &'a str) -> Placed<'a, Self> {
        Placed {
            limiter: self,
            anchor,
        }
    }

    /// The Redis key that holds `key`'s compound bucket when its calls
    /// are placed by `anchor` (see [`placed`](Self::placed)).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::{Quota, RedisLimiter};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?.with_namespace("rl", keyrate::KeyNames::Encoded);
    /// assert_eq!(limiter.placed_bucket_key("sk_1", "org_{7}"), "rl{@org_%7B7%7D}|sk_1");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn placed_bucket_key(&self, key: &str, anchor: &str) -> String {
        self.settings.names.placed_key(key, Some(anchor))
    }

    /// The counters of this limiter's (and its clones') compound calls:
    /// decisions by outcome, and denials by the `(scope, quota)` that
    /// bound them (see [`CompoundStats`]).
    #[must_use]
    pub fn compound_stats(&self) -> CompoundStats {
        self.settings.compound_counters.read()
    }
}

/// # Resets of placed buckets
impl<C> Placed<'_, RedisLimiter<C>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Refills `key`'s bucket placed by this anchor (one `DEL` of its
    /// [`placed_bucket_key`](RedisLimiter::placed_bucket_key)), as
    /// [`RedisLimiter::reset`] does an unplaced one; returns whether the
    /// key had a bucket. This limiter's mirror forgets it at once.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::reset`]'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{AsyncCompound, Policy, Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?;
    /// let policy = Policy::new([Quota::new(1.0, 3)?, Quota::new(0.1, 5)?])?;
    /// let org = limiter.placed("org_7");
    /// assert!(org.check_policy("k", &policy, 0.0, 3).await.is_ok());
    /// assert!(org.check_policy("k", &policy, 0.0, 1).await.is_err());
    /// assert!(org.reset("k").await?);
    /// assert!(org.check_policy("k", &policy, 0.0, 3).await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset(&self, key: &str) -> Result<bool, RedisLimiterError> {
        let settings = &self.limiter.settings;
        let name = settings.names.placed_key(key, Some(self.anchor));
        let removed = self.limiter.query(&settings.delete_name(&name)).await;
        settings.forget_name(&name);
        Ok(parse::<u64>(removed?)? > 0)
    }
}

impl Placed<'_, RedisLimiter<BlockingConnection>> {
    /// [`reset`](Placed::reset) over the blocking connection.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::reset`]'s.
    pub fn reset_blocking(&self, key: &str) -> Result<bool, RedisLimiterError> {
        let settings = &self.limiter.settings;
        let name = settings.names.placed_key(key, Some(self.anchor));
        let removed = self.limiter.query_blocking(&settings.delete_name(&name));
        settings.forget_name(&name);
        Ok(parse::<u64>(removed?)? > 0)
    }
}

//! Resets on Redis: one key's bucket refilled (`DEL`), or every bucket of
//! the limiter's namespace (`SCAN` and `UNLINK`, in batches), for the async
//! and the blocking limiter; the local deny mirror forgets what it knew.

use super::blocking::BlockingConnection;
use super::error::{RedisErrorKind, RedisLimiterError};
use super::limiter::RedisLimiter;
use super::settings::Settings;
use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, FromRedisValue};

/// How many keys one `SCAN` step asks for, and so the most one `UNLINK`
/// removes.
const RESET_BATCH: usize = 1000;

impl Settings {
    fn delete(&self, key: &str) -> Cmd {
        self.delete_name(&self.bucket_key(key))
    }

    /// `DEL` of the bucket named `name` in Redis.
    pub(super) fn delete_name(&self, name: &str) -> Cmd {
        let mut cmd = ::redis::cmd("DEL");
        cmd.arg(name);
        cmd
    }

    fn scan(&self, cursor: u64) -> Cmd {
        let mut cmd = ::redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(self.names.scan_pattern())
            .arg("COUNT")
            .arg(RESET_BATCH);
        cmd
    }

    /// After a reset of `key`, or of every key (`None`): the mirror
    /// forgets, whether or not the reset's answer came back (it may have
    /// run; forgetting is always safe).
    fn forget(&self, key: Option<&str>) {
        match key {
            Some(key) => self.forget_name(&self.bucket_key(key)),
            None => {
                if let Some(mirror) = &self.mirror {
                    mirror.forget_all();
                }
            }
        }
    }

    /// After a reset of the bucket named `name`: the mirror forgets it.
    pub(super) fn forget_name(&self, name: &str) {
        if let Some(mirror) = &self.mirror {
            mirror.forget(name);
        }
    }
}

/// `CLUSTER INFO`'s answer tells a cluster (or one node of it) from a
/// standalone Redis, which refuses the command.
fn refuse_cluster(
    answer: Result<::redis::Value, ::redis::RedisError>,
) -> Result<(), RedisLimiterError> {
    match answer {
        Ok(_) => Err(RedisLimiterError::config(
            "reset_all over a Redis Cluster connection would scan one node: use \
             reset_all_cluster (feature redis-cluster)"
                .to_owned(),
        )),
        Err(err) => match RedisLimiterError::from(err) {
            err if matches!(
                err.kind(),
                RedisErrorKind::Unavailable | RedisErrorKind::Timeout
            ) =>
            {
                Err(err)
            }
            // "cluster support disabled", or no such command: standalone.
            _ => Ok(()),
        },
    }
}

pub(super) fn parse<T: FromRedisValue>(value: ::redis::Value) -> Result<T, RedisLimiterError> {
    ::redis::from_redis_value(&value).map_err(RedisLimiterError::from)
}

/// # Undoing a lock-out: resets
impl<C> RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Refills `key`'s bucket in Redis (one `DEL` of its
    /// [`bucket_key`](Self::bucket_key)), for every process that shares
    /// it; returns whether the key had a bucket. This limiter's deny
    /// mirror (and its clones') forgets the key at once; other processes'
    /// mirrors may deny it for up to their
    /// [`with_mirror_refresh`](Self::with_mirror_refresh) (default 1 s).
    ///
    /// # Errors
    ///
    /// A [`RedisLimiterError`] when Redis did not answer within the
    /// limiter's timeout (the key may or may not have been reset) or
    /// refused. The failure policy does not apply: a reset decides no call.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{AsyncLimiter, Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 3)?).await?;
    /// assert!(limiter.allow_n("k", 0.0, 3).await);
    /// assert!(!limiter.allow("k", 0.0).await);
    /// assert!(limiter.reset("k").await?);
    /// assert!(limiter.allow_n("k", 0.0, 3).await);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset(&self, key: &str) -> Result<bool, RedisLimiterError> {
        let removed = self.query(&self.settings.delete(key)).await;
        self.settings.forget(Some(key));
        Ok(parse::<u64>(removed?)? > 0)
    }

    /// Refills every bucket of this limiter's namespace: `SCAN` for its
    /// names ([`bucket_key_prefix`](Self::bucket_key_prefix) then `*`, and
    /// the compound buckets [`placed`](Self::placed) under any anchor),
    /// 1,000 at a time, and `UNLINK` each batch; returns how many keys it
    /// removed. Calls that run meanwhile are decided before or after their
    /// key's reset. Other processes' mirrors: as for [`reset`](Self::reset).
    ///
    /// It goes through the keys of one server. Over a Redis Cluster
    /// connection it refuses (a `SCAN` would reach one node at random):
    /// use `reset_all_cluster` there (feature `redis-cluster`).
    ///
    /// # Errors
    ///
    /// A [`RedisLimiterError`] when a step fails (the batches before it
    /// were reset); [`RedisErrorKind::Config`] over a cluster connection.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{AsyncLimiter, Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = RedisLimiter::connect(&url, Quota::new(1.0, 1)?).await?;
    /// assert!(limiter.allow("a", 0.0).await);
    /// assert!(limiter.allow("b", 0.0).await);
    /// assert_eq!(limiter.reset_all().await?, 2);
    /// assert!(limiter.allow("a", 0.0).await && limiter.allow("b", 0.0).await);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset_all(&self) -> Result<u64, RedisLimiterError> {
        let cluster = ::redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut self.connection.clone())
            .await;
        refuse_cluster(cluster)?;
        let mut removed = 0;
        let mut cursor = 0;
        let result = loop {
            let step = match self.query(&self.settings.scan(cursor)).await {
                Ok(step) => step,
                Err(err) => break Err(err),
            };
            let (next, names): (u64, Vec<Vec<u8>>) = match parse(step) {
                Ok(step) => step,
                Err(err) => break Err(err),
            };
            if !names.is_empty() {
                let unlinked = self.query(::redis::cmd("UNLINK").arg(names)).await;
                match unlinked.and_then(parse::<u64>) {
                    Ok(n) => removed += n,
                    Err(err) => break Err(err),
                }
            }
            if next == 0 {
                break Ok(removed);
            }
            cursor = next;
        };
        self.settings.forget(None);
        result
    }

    /// One command, under the limiter's timeout.
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<::redis::Value, RedisLimiterError> {
        let timeout = self.settings.timeout;
        let mut connection = self.connection.clone();
        tokio::time::timeout(timeout, cmd.query_async(&mut connection))
            .await
            .map_err(|_| RedisLimiterError::timeout(timeout))?
            .map_err(RedisLimiterError::from)
    }
}

#[cfg(feature = "redis-cluster")]
impl RedisLimiter<::redis::cluster_async::ClusterConnection> {
    /// [`reset_all`](Self::reset_all) on a Redis Cluster: `SCAN` on every
    /// master in turn (from `CLUSTER NODES`), and `UNLINK` each batch
    /// (redis-rs sends each key to its slot's master). Returns how many
    /// keys it removed. A slot that moves during the scan may be missed
    /// or seen twice: run it again after a resharding.
    ///
    /// # Errors
    ///
    /// A [`RedisLimiterError`] when a step fails (the batches before it
    /// were reset).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{AsyncLimiter, Quota, RedisLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes: Vec<String> = std::env::var("KEYRATE_REDIS_CLUSTER_URLS")?.split(',').map(str::to_owned).collect();
    /// let connection = redis::cluster::ClusterClient::new(nodes)?.get_async_connection().await?;
    /// let limiter = RedisLimiter::with_connection(connection, Quota::new(1.0, 1)?);
    /// for key in ["a", "b", "c"] {
    ///     assert!(limiter.allow(key, 0.0).await);
    /// }
    /// assert!(limiter.reset_all().await.is_err()); // one node would not do
    /// assert_eq!(limiter.reset_all_cluster().await?, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset_all_cluster(&self) -> Result<u64, RedisLimiterError> {
        let result = self.reset_cluster_nodes().await;
        self.settings.forget(None);
        result
    }

    async fn reset_cluster_nodes(&self) -> Result<u64, RedisLimiterError> {
        use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let nodes: String = parse(self.query(::redis::cmd("CLUSTER").arg("NODES")).await?)?;
        let mut removed = 0;
        for (host, port) in masters(&nodes) {
            let mut cursor = 0;
            loop {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                });
                let mut connection = self.connection.clone();
                let step = tokio::time::timeout(
                    self.settings.timeout,
                    connection.route_command(&self.settings.scan(cursor), routing),
                )
                .await
                .map_err(|_| RedisLimiterError::timeout(self.settings.timeout))??;
                let (next, names): (u64, Vec<Vec<u8>>) = parse(step.extract_error()?)?;
                if !names.is_empty() {
                    let unlinked = self.query(::redis::cmd("UNLINK").arg(names)).await?;
                    removed += parse::<u64>(unlinked)?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(removed)
    }
}

/// The `(host, port)` of every master in a `CLUSTER NODES` answer that is
/// not marked failed.
#[cfg(feature = "redis-cluster")]
fn masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            // host:port@bus[,hostname]
            let address = fields.get(1)?.split('@').next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// # Undoing a lock-out: resets, blocking
impl RedisLimiter<BlockingConnection> {
    /// [`reset`](RedisLimiter::reset) over the blocking connection.
    ///
    /// # Errors
    ///
    /// As [`reset`](RedisLimiter::reset)'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{BlockingRedisLimiter, Limiter, Quota};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = BlockingRedisLimiter::connect_blocking(&url, Quota::new(1.0, 2)?)?;
    /// assert!(limiter.allow_n("k", 0.0, 2));
    /// assert!(limiter.reset_blocking("k")?);
    /// assert!(limiter.allow_n("k", 0.0, 2));
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset_blocking(&self, key: &str) -> Result<bool, RedisLimiterError> {
        let removed = self.query_blocking(&self.settings.delete(key));
        self.settings.forget(Some(key));
        Ok(parse::<u64>(removed?)? > 0)
    }

    /// [`reset_all`](RedisLimiter::reset_all) over the blocking connection
    /// (one server: no cluster).
    ///
    /// # Errors
    ///
    /// As [`reset_all`](RedisLimiter::reset_all)'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::{BlockingRedisLimiter, Limiter, Quota};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// let limiter = BlockingRedisLimiter::connect_blocking(&url, Quota::new(1.0, 1)?)?;
    /// assert!(limiter.allow("a", 0.0));
    /// assert_eq!(limiter.reset_all_blocking()?, 1);
    /// assert!(limiter.allow("a", 0.0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset_all_blocking(&self) -> Result<u64, RedisLimiterError> {
        refuse_cluster(self.cluster_info_blocking())?;
        let mut removed = 0;
        let mut cursor = 0;
        let result = loop {
            let step = self
                .query_blocking(&self.settings.scan(cursor))
                .and_then(parse::<(u64, Vec<Vec<u8>>)>);
            let (next, names) = match step {
                Ok(step) => step,
                Err(err) => break Err(err),
            };
            if !names.is_empty() {
                let unlinked = self
                    .query_blocking(::redis::cmd("UNLINK").arg(names))
                    .and_then(parse::<u64>);
                match unlinked {
                    Ok(n) => removed += n,
                    Err(err) => break Err(err),
                }
            }
            if next == 0 {
                break Ok(removed);
            }
            cursor = next;
        };
        self.settings.forget(None);
        result
    }
}

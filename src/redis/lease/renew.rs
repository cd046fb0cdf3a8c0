//! The renewal task: one tokio task per limiter (and its clones) that
//! keeps this process's leases alive and sends its permits' releases.
//!
//! Permits talk to it over an unbounded channel, so that taking and
//! dropping a permit never blocks: an admitted acquire sends `Hold`, a
//! dropped permit (or an acquire whose answer never came) sends `Release`.
//! The task sends every release at once (one `ZREM` per lease set, for
//! all the releases that queued meanwhile), and every `lease / 3` renews
//! every lease it holds: one renew script call for all of them on a
//! standalone Redis (in calls of at most 512 leases), one per lease set on
//! a cluster (one for all when the names share a hash tag), up to 16 calls
//! in flight at once.
//!
//! It ends when the channel closes: when the limiter, its clones and its
//! last permit are gone. The background calls go around the circuit
//! breaker (they keep leases alive, they answer no caller), each under
//! the limiter's deadline.

use super::script::{self, RenewCall, RENEW_BATCH};
use super::stats::Counters;
use crate::redis::error::{RedisErrorKind, RedisLimiterError};
use ::redis::aio::ConnectionLike;
use ::redis::{Script, Value};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::{self, error::TryRecvError, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The most renew calls of one round in flight at once.
const RENEW_IN_FLIGHT: usize = 16;

/// One lease: the Redis name of its key's lease set, and its id there.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub(super) key: String,
    pub(super) id: String,
}

#[derive(Debug)]
enum Message {
    /// Renew this lease until it is released.
    Hold(Lease),
    /// Remove this lease from Redis, and stop renewing it.
    Release(Lease),
}

/// How permits and acquires reach the renewal task.
#[derive(Debug, Clone)]
pub(super) struct RenewHandle {
    tx: UnboundedSender<Message>,
    counters: Arc<Counters>,
}

impl RenewHandle {
    /// Asks the task to renew `lease`.
    pub(super) fn hold(&self, lease: &Lease) {
        // A send fails only when the task is gone (its runtime shut
        // down): the lease then expires within the lease time.
        let _ = self.tx.send(Message::Hold(lease.clone()));
    }

    /// Queues `lease`'s release; `permit` when a permit's (counted). Never
    /// blocks.
    pub(super) fn release(&self, lease: Lease, permit: bool) {
        if permit {
            Counters::add(&self.counters.released, 1);
            // Relaxed: a gauge.
            self.counters
                .held
                .fetch_sub(1, crate::sync::unmodeled::Relaxed);
        }
        let _ = self.tx.send(Message::Release(lease));
    }

    /// Whether the task still runs.
    pub(super) fn is_live(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// What the task needs, taken from the limiter's settings when it starts.
pub(super) struct Renewal<C> {
    pub(super) connection: C,
    pub(super) script: Arc<Script>,
    pub(super) lease_ms: u64,
    /// The time between rounds: a third of the lease time.
    pub(super) every: Duration,
    pub(super) timeout: Duration,
    pub(super) counters: Arc<Counters>,
    /// Every lease set in one hash slot (the names have a hash tag).
    pub(super) one_slot: bool,
}

/// Starts the task on the current tokio runtime.
///
/// # Errors
///
/// [`RedisErrorKind::Config`] outside a tokio runtime.
pub(super) fn spawn<C>(renewal: Renewal<C>) -> Result<RenewHandle, RedisLimiterError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        RedisLimiterError::config(
            "a RedisConcurrencyLimiter renews its leases on a tokio task: acquire inside a \
             tokio runtime"
                .to_owned(),
        )
    })?;
    let (tx, rx) = mpsc::unbounded_channel();
    let counters = Arc::clone(&renewal.counters);
    runtime.spawn(renewal.run(rx));
    Ok(RenewHandle { tx, counters })
}

/// The leases held, by lease set.
type Held = HashMap<String, HashSet<String>>;

impl<C> Renewal<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn run(self, mut rx: UnboundedReceiver<Message>) {
        let mut held = Held::new();
        let mut cluster = None;
        let mut next = Instant::now() + self.every;
        loop {
            let mut releases = Held::new();
            let mut closed = false;
            match tokio::time::timeout_at(next, rx.recv()).await {
                Ok(Some(message)) => {
                    apply(message, &mut held, &mut releases);
                    // Everything queued meanwhile, in one batch.
                    loop {
                        match rx.try_recv() {
                            Ok(message) => apply(message, &mut held, &mut releases),
                            Err(TryRecvError::Empty) => break,
                            Err(TryRecvError::Disconnected) => {
                                closed = true;
                                break;
                            }
                        }
                    }
                }
                Ok(None) => closed = true,
                // The round is due.
                Err(_) => {}
            }
            self.release(releases).await;
            if closed {
                // No permit is left to renew or release.
                break;
            }
            if Instant::now() >= next {
                if !held.is_empty() {
                    self.renew(&mut held, &mut cluster).await;
                }
                next = Instant::now() + self.every;
            }
        }
    }

    /// Sends the queued releases: one `ZREM` per lease set.
    async fn release(&self, releases: Held) {
        for (key, ids) in releases {
            let mut cmd = ::redis::cmd("ZREM");
            cmd.arg(&key).arg(ids.iter().collect::<Vec<_>>());
            let mut connection = self.connection.clone();
            let answer = self
                .deadline(cmd.query_async::<Value>(&mut connection))
                .await;
            if answer.is_err() {
                Counters::add(&self.counters.release_failures, ids.len() as u64);
            }
        }
    }

    /// One renewal round over every lease held; the lost ones are
    /// forgotten.
    async fn renew(&self, held: &mut Held, cluster: &mut Option<bool>) {
        let per_set = !self.one_slot && self.is_cluster(cluster).await;
        let mut calls = batches(held, per_set).into_iter();
        // The round's calls, up to RENEW_IN_FLIGHT at once: on a cluster a
        // round is one call per set, so thousands of sets renew in a few
        // round trips' time, not one after another.
        let mut in_flight = JoinSet::new();
        loop {
            while in_flight.len() < RENEW_IN_FLIGHT {
                let Some(call) = calls.next() else { break };
                Counters::add(&self.counters.renew_calls, 1);
                let (script, mut connection) = (Arc::clone(&self.script), self.connection.clone());
                let (lease_ms, timeout) = (self.lease_ms, self.timeout);
                in_flight.spawn(async move {
                    let invocation = call.invocation(&script, lease_ms);
                    let answer = within(timeout, invocation.invoke_async::<Value>(&mut connection))
                        .await
                        .and_then(|value| script::parse_renewed(&value));
                    (call, answer)
                });
            }
            let Some(done) = in_flight.join_next().await else {
                break;
            };
            let Ok((call, Ok(lost))) = done else {
                // Tried again next round; past the lease time, lost.
                Counters::add(&self.counters.renew_failures, 1);
                continue;
            };
            for position in lost {
                if let Some((key, id)) = call.at(position) {
                    if let Some(ids) = held.get_mut(key) {
                        if ids.remove(id) {
                            Counters::add(&self.counters.leases_lost, 1);
                        }
                        if ids.is_empty() {
                            held.remove(key);
                        }
                    }
                }
            }
        }
        // Counted when done: `renew_calls == renew_rounds` (on a
        // standalone Redis) says no round is under way.
        Counters::add(&self.counters.renew_rounds, 1);
    }

    /// Whether the connection is to a Redis Cluster (`CLUSTER INFO`
    /// answers), asked once; while unknown, a round calls per set, which
    /// works on both.
    async fn is_cluster(&self, known: &mut Option<bool>) -> bool {
        if let Some(cluster) = *known {
            return cluster;
        }
        let mut connection = self.connection.clone();
        let info = ::redis::cmd("CLUSTER").arg("INFO").to_owned();
        match self
            .deadline(info.query_async::<Value>(&mut connection))
            .await
        {
            Ok(_) => *known = Some(true),
            Err(err)
                if matches!(
                    err.kind(),
                    RedisErrorKind::Unavailable | RedisErrorKind::Timeout
                ) =>
            {
                return true
            }
            // "cluster support disabled": a standalone Redis.
            Err(_) => *known = Some(false),
        }
        known.unwrap_or(true)
    }

    /// `call` under the limiter's deadline.
    async fn deadline<T>(
        &self,
        call: impl Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, RedisLimiterError> {
        within(self.timeout, call).await
    }
}

/// `call` under the deadline `timeout`.
async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = ::redis::RedisResult<T>>,
) -> Result<T, RedisLimiterError> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| RedisLimiterError::timeout(timeout))?
        .map_err(RedisLimiterError::from)
}

fn apply(message: Message, held: &mut Held, releases: &mut Held) {
    match message {
        Message::Hold(lease) => {
            held.entry(lease.key).or_default().insert(lease.id);
        }
        Message::Release(lease) => {
            if let Some(ids) = held.get_mut(&lease.key) {
                ids.remove(&lease.id);
                if ids.is_empty() {
                    held.remove(&lease.key);
                }
            }
            releases.entry(lease.key).or_default().insert(lease.id);
        }
    }
}

/// The renew calls of one round: one per set (`per_set`), or the sets
/// packed into calls of about [`RENEW_BATCH`] leases.
fn batches(held: &Held, per_set: bool) -> Vec<RenewCall> {
    let mut calls = Vec::new();
    let mut call = RenewCall::default();
    for (key, ids) in held {
        if !call.sets.is_empty() && (per_set || call.ids + ids.len() > RENEW_BATCH) {
            calls.push(std::mem::take(&mut call));
        }
        call.ids += ids.len();
        call.sets.push((key.clone(), ids.iter().cloned().collect()));
    }
    if !call.sets.is_empty() {
        calls.push(call);
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(sets: &[(&str, usize)]) -> Held {
        sets.iter()
            .map(|&(key, n)| (key.to_owned(), (0..n).map(|i| i.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_round_is_one_call_per_batch_or_per_set() {
        let few = held(&[("a", 3), ("b", 2), ("c", 1)]);
        assert_eq!(batches(&few, false).len(), 1);
        assert_eq!(batches(&few, true).len(), 3);
        let many = held(&[("a", RENEW_BATCH), ("b", 1), ("c", 1)]);
        let calls = batches(&many, false);
        // A call carries at most a batch, or one set alone.
        assert!((2..=3).contains(&calls.len()), "{}", calls.len());
        for call in &calls {
            assert!(call.ids <= RENEW_BATCH || call.sets.len() == 1);
        }
        assert_eq!(calls.iter().map(|c| c.ids).sum::<usize>(), RENEW_BATCH + 2);
        assert!(batches(&Held::new(), false).is_empty());
    }

    #[test]
    fn a_release_stops_the_renewals_of_its_lease() {
        let (mut held, mut releases) = (Held::new(), Held::new());
        let lease = |id: &str| Lease {
            key: "k".into(),
            id: id.into(),
        };
        apply(Message::Hold(lease("1")), &mut held, &mut releases);
        apply(Message::Hold(lease("2")), &mut held, &mut releases);
        apply(Message::Release(lease("1")), &mut held, &mut releases);
        assert_eq!(held["k"].len(), 1);
        apply(Message::Release(lease("2")), &mut held, &mut releases);
        assert!(held.is_empty());
        assert_eq!(releases["k"].len(), 2);
        // A release of a lease never held (a cancelled acquire) is sent too.
        apply(Message::Release(lease("3")), &mut held, &mut releases);
        assert_eq!(releases["k"].len(), 3);
    }
}

//! Waiting for a permit on Redis: polling the acquire script with backoff
//! and jitter until a deadline, first come first served among this
//! process's waiters for a key (not across processes).

use super::permit::{RedisConcurrencyDenial, RedisPermit};
use super::RedisConcurrencyLimiter;
use crate::concurrency::ConcurrencyDenial;
use crate::sync::unmodeled::{AtomicU64, Relaxed};
use ::redis::aio::ConnectionLike;
use parking_lot::Mutex;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The first pause between two tries, doubled after each refusal up to
/// [`LAST_BACKOFF`]: a few round trips a second per waiter at most.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const LAST_BACKOFF: Duration = Duration::from_millis(250);

/// This process's waiters, per key: each waits its turn on the key's
/// fair (first in, first out) lock, and only the holder polls Redis. An
/// entry lives while a waiter holds or waits for its lock: the map holds
/// only keys waited for now.
#[derive(Default)]
pub(super) struct Queues(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

/// A place in a key's queue; leaving it removes the key's entry if no one
/// else holds or waits for it.
struct Place<'a> {
    queues: &'a Queues,
    key: &'a str,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Queues {
    fn join<'a>(&'a self, key: &'a str) -> Place<'a> {
        let turn = Arc::clone(self.0.lock().entry(key.to_owned()).or_default());
        Place {
            queues: self,
            key,
            turn,
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut map = self.queues.0.lock();
        // Under the map's lock, where every place is made: the map's Arc
        // and this one are the last two only if no one else is queued.
        if Arc::strong_count(&self.turn) == 2 {
            map.remove(self.key);
        }
    }
}

/// Counts a waiting caller while alive.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        // Relaxed: a gauge for reports; it orders nothing.
        gauge.fetch_add(1, Relaxed);
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Relaxed: see `new`.
        self.0.fetch_sub(1, Relaxed);
    }
}

/// # Waiting for a permit
impl<C> RedisConcurrencyLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Takes one of `key`'s permits under the default limit, waiting up
    /// to `max_wait` for one: [`acquire_under`](Self::acquire_under).
    ///
    /// # Errors
    ///
    /// As [`acquire_under`](Self::acquire_under).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// # let ns = format!("doc-acquire-{}", std::process::id());
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 1).await?
    ///     .with_namespace(&ns, keyrate::KeyNames::Encoded);
    /// let held = limiter.acquire("k", Duration::from_secs(1)).await?;
    /// let denial = limiter.acquire("k", Duration::from_millis(20)).await.unwrap_err();
    /// assert!(matches!(denial.denial(), Some(keyrate::ConcurrencyDenial::TimedOut { .. })));
    /// # drop(held);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(
        &self,
        key: &str,
        max_wait: Duration,
    ) -> Result<RedisPermit, RedisConcurrencyDenial> {
        self.acquire_under(key, self.max(), max_wait).await
    }

    /// Takes one of `key`'s permits under `max`, waiting up to `max_wait`
    /// for one: the acquire script is tried, and tried again after a
    /// pause while the key is at its limit (5 ms, doubled after each
    /// refusal up to 250 ms, each a random time between half and all of
    /// it, so that waiters of many processes do not poll in step), until
    /// the deadline. With `Duration::ZERO`, one try:
    /// [`try_acquire_under`](Self::try_acquire_under).
    ///
    /// **Fairness holds only within a process**: this process's waiters
    /// for a key are served first come, first served (one polls at a
    /// time, the others queue behind it), but a waiter in another process,
    /// or a [`try_acquire`](Self::try_acquire) anywhere, may take a permit
    /// that comes back before it: Redis keeps no queue. Cancel-safe: a
    /// dropped future holds nothing and leaves its place to the next.
    ///
    /// # Errors
    ///
    /// [`ConcurrencyDenial::TimedOut`] (in
    /// [`RedisConcurrencyDenial::Denied`]) when no permit came within
    /// `max_wait`; `AtLimit` for `max` 0; a failure to reach Redis ends the
    /// wait at once, answered by the failure policy as in
    /// [`try_acquire`](Self::try_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # use keyrate::RedisConcurrencyLimiter;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("KEYRATE_REDIS_URL")?;
    /// # let ns = format!("doc-acquire-under-{}", std::process::id());
    /// let limiter = RedisConcurrencyLimiter::connect(&url, 1).await?
    ///     .with_namespace(&ns, keyrate::KeyNames::Encoded);
    /// let held = limiter.acquire_under("pro", 2, Duration::ZERO).await?;
    /// let other = limiter.clone();
    /// let waiter = tokio::spawn(async move {
    ///     other.acquire_under("pro", 1, Duration::from_secs(30)).await.is_ok()
    /// });
    /// drop(held); // the waiter's poll finds the permit back
    /// assert!(waiter.await?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_under(
        &self,
        key: &str,
        max: u32,
        max_wait: Duration,
    ) -> Result<RedisPermit, RedisConcurrencyDenial> {
        if max == 0 || max_wait.is_zero() {
            return self.try_acquire_under(key, max).await;
        }
        let deadline = Instant::now() + max_wait;
        let _waiting = Waiting::new(&self.core.counters.waiting);
        let place = self.core.queues.join(key);
        let timed_out = |held| {
            Ok(Err(ConcurrencyDenial::TimedOut {
                held,
                max,
                waited: max_wait,
            }))
        };
        // Our turn: the waiters queued before us have left.
        let Ok(_turn) = tokio::time::timeout_at(deadline, place.turn.lock()).await else {
            // Out of time in the queue: the count now, for the denial.
            return match self.held(key).await {
                Ok(held) => self.answer(timed_out(held)),
                Err(err) => self.answer(Err(err)),
            };
        };
        let jitter = RandomState::new();
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0u64;
        loop {
            let held = match self.take(key, max).await {
                Ok(Err(ConcurrencyDenial::AtLimit { held, .. })) => held,
                outcome => return self.answer(outcome),
            };
            let now = Instant::now();
            if now >= deadline {
                return self.answer(timed_out(held));
            }
            tries += 1;
            let nanos = backoff.as_nanos() as u64;
            let pause = Duration::from_nanos(nanos / 2 + jitter.hash_one(tries) % (nanos / 2 + 1));
            tokio::time::sleep_until(deadline.min(now + pause)).await;
            backoff = (backoff * 2).min(LAST_BACKOFF);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use tokio::sync::Barrier;

    const KEYS: usize = 3;
    const ROUNDS: usize = 20;
    const LEAVERS: usize = 4;
    const STAYERS: usize = 4;

    /// Marks a task as holding its key's turn, failing if another holds it.
    fn enter(inside: &AtomicU32, key: &str) {
        assert_eq!(
            inside.fetch_add(1, SeqCst),
            0,
            "two tasks hold {key}'s turn"
        );
    }

    /// One round on `key`, every task on the multi-threaded runtime, in
    /// steps set by a barrier: a holder takes the turn; leavers join the
    /// queue, find the turn taken, and leave (as a waiter out of time
    /// does); then a new place on the key must still find the turn taken
    /// (a leaver that removed the entry under the holder would let the
    /// next waiter start a second queue for the key, and run beside the
    /// holder); then stayers queue behind the holder and take the turn
    /// one after another.
    async fn round(queues: Arc<Queues>, key: String, inside: Arc<AtomicU32>) {
        let step = Arc::new(Barrier::new(1 + LEAVERS + STAYERS));
        // What a holder's or a stayer's task takes with it.
        let parts = || {
            (
                Arc::clone(&queues),
                key.clone(),
                Arc::clone(&inside),
                Arc::clone(&step),
            )
        };
        let mut tasks = tokio::task::JoinSet::new();
        {
            let (queues, key, inside, step) = parts();
            tasks.spawn(async move {
                let place = queues.join(&key);
                let turn = place.turn.lock().await;
                enter(&inside, &key);
                step.wait().await; // 1: the turn is held
                step.wait().await; // 2: the leavers have left
                let probe = queues.join(&key);
                assert!(
                    probe.turn.try_lock().is_err(),
                    "a new place on {key} took the turn its holder holds"
                );
                drop(probe);
                step.wait().await; // 3: checked
                step.wait().await; // 4: the stayers have joined
                inside.fetch_sub(1, SeqCst);
                drop(turn);
            });
        }
        for _ in 0..LEAVERS {
            let (queues, key, step) = (Arc::clone(&queues), key.clone(), Arc::clone(&step));
            tasks.spawn(async move {
                step.wait().await;
                let place = queues.join(&key);
                assert!(
                    place.turn.try_lock().is_err(),
                    "a leaver took the holder's turn"
                );
                drop(place);
                for _ in 2..=4 {
                    step.wait().await;
                }
            });
        }
        for _ in 0..STAYERS {
            let (queues, key, inside, step) = parts();
            tasks.spawn(async move {
                for _ in 1..=3 {
                    step.wait().await;
                }
                let place = queues.join(&key);
                step.wait().await;
                let turn = place.turn.lock().await;
                enter(&inside, &key);
                // Gives the other thread a chance to run another task of
                // the key meanwhile (the check holds whether or not it does).
                tokio::task::yield_now().await;
                inside.fetch_sub(1, SeqCst);
                drop(turn);
            });
        }
        while let Some(task) = tasks.join_next().await {
            task.expect("a task of the round failed");
        }
    }

    /// Many tasks queueing and leaving on a few keys at once, on two
    /// threads: no two tasks ever hold one key's turn at once, even while
    /// places are removed and made again, and once every task has left,
    /// the map holds no entry (the last to leave a key removes it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queues_serve_one_at_a_time_and_empty_when_all_leave() {
        let queues = Arc::new(Queues::default());
        let rounds = async {
            for _ in 0..ROUNDS {
                let mut keys = tokio::task::JoinSet::new();
                for k in 0..KEYS {
                    let inside = Arc::new(AtomicU32::new(0));
                    keys.spawn(round(Arc::clone(&queues), format!("key{k}"), inside));
                }
                while let Some(key) = keys.join_next().await {
                    key.expect("a round failed");
                }
                let left: Vec<_> = queues.0.lock().keys().cloned().collect();
                assert!(left.is_empty(), "entries left after every task: {left:?}");
            }
        };
        tokio::time::timeout(Duration::from_secs(60), rounds)
            .await
            .expect("a round never ended: a waiter was never woken");
    }
}

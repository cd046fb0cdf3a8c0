//! The circuit breaker: while Redis is known to be down, calls are decided
//! by the failure policy at once, without a round trip, and one call at a
//! time goes through as a probe.
//!
//! The state machine, over a clock the caller passes in (so that a test
//! drives it by hand):
//!
//! - **closed**: every call goes to Redis. A round trip that failed for
//!   want of Redis (`Unavailable`, `Timeout`) counts one failure; any
//!   answer from Redis (an admission, a denial, even a script error)
//!   clears the count. `threshold` failures in a row open the breaker.
//! - **open**: calls fail at once (`Unavailable`, "circuit open") and are
//!   counted as fast failures. From `probe_every` after it opened (or
//!   after the last probe failed), the next call is let through as the
//!   probe, one at a time: if Redis answers it the breaker closes, if not
//!   it stays open for another `probe_every`. A probe that is cancelled
//!   (its future dropped) lets the next call probe at once.
//!
//! A call that started before the breaker opened and fails afterwards
//! changes nothing; one that Redis answers closes it: Redis is back.

use super::error::{RedisErrorKind, RedisLimiterError};
use crate::sync::unmodeled::{AtomicU64, Relaxed};
use crate::time::Nanos;
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Consecutive failed round trips that open the breaker, by default.
pub(super) const DEFAULT_BREAKER_FAILURES: u32 = 5;

/// How long an open breaker waits between probes, by default: a restarted
/// Redis is found within this (plus a round trip).
pub(super) const DEFAULT_BREAKER_PROBE_EVERY: Duration = Duration::from_millis(50);

/// `hint` values: what a call can learn without the lock.
const CLOSED: u64 = 0;
/// Closed, with failures counted: an answer must clear them.
const FAILING: u64 = 1;
const OPEN: u64 = 2;

/// What an open breaker, or a closed one, decides for one call.
pub(super) enum Pass {
    /// Closed: go to Redis, then [`Breaker::record`].
    Go,
    /// Open, and this call is the probe: go, then record.
    Probe(ProbeGuard),
}

/// The probe in flight; dropped unrecorded (cancelled), it lets the next
/// call probe.
pub(super) struct ProbeGuard {
    breaker: Arc<Breaker>,
    recorded: bool,
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        if !self.recorded {
            let mut state = self.breaker.state.lock();
            state.probing = false;
            state.next_probe = Nanos::ZERO;
        }
    }
}

#[derive(Debug)]
struct State {
    failures: u32,
    open: bool,
    /// While open: the instant from which a call may probe.
    next_probe: Nanos,
    /// While open: a probe is in flight.
    probing: bool,
}

/// A limiter's circuit breaker, shared by its clones.
pub(super) struct Breaker {
    /// Failures in a row that open it; 0: never opens.
    threshold: u32,
    probe_every: Nanos,
    /// `CLOSED`, `FAILING` or `OPEN`: the state's summary, written under
    /// the lock and read without it. Relaxed: a stale read only sends one
    /// more call to the lock (or one more round trip while it opens),
    /// never a wrong transition: every transition happens under the lock.
    hint: AtomicU64,
    state: Mutex<State>,
    /// The origin of [`now`](Self::now): tokio's clock, so that a test
    /// with paused time drives it.
    origin: tokio::time::Instant,
    /// Counters, Relaxed: they decide nothing.
    trips: AtomicU64,
    fast_failures: AtomicU64,
    probes: AtomicU64,
}

/// The circuit breaker's counters and state, for one limiter and its
/// clones (see [`RedisLimiter::circuit_stats`](crate::RedisLimiter::circuit_stats)).
///
/// # Examples
///
/// ```
/// use keyrate::CircuitStats;
///
/// let stats = CircuitStats::default();
/// assert!(!stats.open);
/// assert_eq!(stats.fast_failures, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CircuitStats {
    /// Whether the breaker is open now: calls fail fast.
    pub open: bool,
    /// How many times it opened.
    pub trips: u64,
    /// Calls decided by the failure policy without a round trip because
    /// it was open (each also counted in
    /// [`Stats::backend_errors`](crate::Stats::backend_errors)).
    pub fast_failures: u64,
    /// Calls let through while it was open, to see whether Redis is back.
    pub probes: u64,
}

impl Breaker {
    pub(super) fn new(threshold: u32, probe_every: Duration) -> Self {
        Breaker {
            threshold,
            probe_every: Nanos::saturating_from_duration(probe_every),
            hint: AtomicU64::new(CLOSED),
            state: Mutex::new(State {
                failures: 0,
                open: false,
                next_probe: Nanos::ZERO,
                probing: false,
            }),
            origin: tokio::time::Instant::now(),
            trips: AtomicU64::new(0),
            fast_failures: AtomicU64::new(0),
            probes: AtomicU64::new(0),
        }
    }

    /// The breaker's clock.
    pub(super) fn now(&self) -> Nanos {
        Nanos::saturating_from_duration(self.origin.elapsed())
    }

    /// Whether a call at `now` may go to Redis, or its failure.
    pub(super) fn admit(self: &Arc<Self>, now: Nanos) -> Result<Pass, RedisLimiterError> {
        // Relaxed: see the field.
        if self.hint.load(Relaxed) != OPEN {
            return Ok(Pass::Go);
        }
        let mut state = self.state.lock();
        if !state.open {
            return Ok(Pass::Go);
        }
        if !state.probing && now >= state.next_probe {
            state.probing = true;
            self.probes.fetch_add(1, Relaxed);
            return Ok(Pass::Probe(ProbeGuard {
                breaker: Arc::clone(self),
                recorded: false,
            }));
        }
        drop(state);
        self.fast_failures.fetch_add(1, Relaxed);
        Err(RedisLimiterError::circuit_open(self.threshold))
    }

    /// Records how the round trip of a call that [`admit`](Self::admit)
    /// let through ended, at `now`: `answered` when Redis answered it,
    /// whatever it said.
    pub(super) fn record(&self, pass: Pass, answered: bool, now: Nanos) {
        let probe = match pass {
            Pass::Go => None,
            Pass::Probe(guard) => Some(guard),
        };
        // Relaxed: see the field. An answer while closed and clear is the
        // common case: no lock, no write.
        if answered && probe.is_none() && self.hint.load(Relaxed) == CLOSED {
            return;
        }
        let mut state = self.state.lock();
        if answered {
            state.failures = 0;
            state.open = false;
            state.probing = false;
            self.hint.store(CLOSED, Relaxed);
        } else if probe.is_some() {
            state.probing = false;
            state.next_probe = now.saturating_add(self.probe_every);
        } else if !state.open {
            state.failures = state.failures.saturating_add(1);
            if self.threshold > 0 && state.failures >= self.threshold {
                state.open = true;
                state.next_probe = now.saturating_add(self.probe_every);
                self.trips.fetch_add(1, Relaxed);
                self.hint.store(OPEN, Relaxed);
            } else {
                self.hint.store(FAILING, Relaxed);
            }
        }
        drop(state);
        if let Some(mut guard) = probe {
            guard.recorded = true;
        }
    }

    pub(super) fn stats(&self) -> CircuitStats {
        CircuitStats {
            open: self.state.lock().open,
            trips: self.trips.load(Relaxed),
            fast_failures: self.fast_failures.load(Relaxed),
            probes: self.probes.load(Relaxed),
        }
    }
}

/// Whether a round trip's outcome shows that Redis answered: anything but
/// a failure to reach it in time.
pub(super) fn answered<T>(answer: &Result<T, RedisLimiterError>) -> bool {
    !matches!(
        answer.as_ref().map_err(RedisLimiterError::kind),
        Err(RedisErrorKind::Unavailable | RedisErrorKind::Timeout)
    )
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("threshold", &self.threshold)
            .field("probe_every", &self.probe_every)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn at(ms: u64) -> Nanos {
        Nanos::new(ms * MS)
    }

    fn breaker() -> Arc<Breaker> {
        Arc::new(Breaker::new(3, Duration::from_millis(50)))
    }

    /// Admits a call at `ms` and records its round trip.
    fn call(breaker: &Arc<Breaker>, ms: u64, answered: bool) -> bool {
        match breaker.admit(at(ms)) {
            Ok(pass) => {
                breaker.record(pass, answered, at(ms));
                true
            }
            Err(err) => {
                assert_eq!(err.kind(), RedisErrorKind::Unavailable);
                assert!(err.is_circuit_open());
                false
            }
        }
    }

    #[test]
    fn opens_after_threshold_failures_in_a_row() {
        let b = breaker();
        assert!(call(&b, 0, false));
        assert!(call(&b, 1, false));
        assert!(call(&b, 2, true)); // an answer clears the count
        assert!(call(&b, 3, false));
        assert!(call(&b, 4, false));
        assert!(!b.stats().open);
        assert!(call(&b, 5, false)); // the third in a row
        assert!(b.stats().open);
        for ms in 5..55 {
            assert!(!call(&b, ms, true), "fails fast at {ms} ms");
        }
        let stats = b.stats();
        assert_eq!((stats.trips, stats.fast_failures, stats.probes), (1, 50, 0));
    }

    #[test]
    fn probes_one_call_at_a_time_and_closes_on_an_answer() {
        let b = breaker();
        for ms in 0..3 {
            call(&b, ms, false);
        }
        // Opened at 2 ms: the first probe from 52 ms.
        assert!(b.admit(at(51)).is_err());
        let probe = b.admit(at(52)).expect("the probe");
        assert!(matches!(probe, Pass::Probe(_)));
        assert!(b.admit(at(53)).is_err(), "one probe at a time");
        // The probe fails: open for another 50 ms from when it ended.
        b.record(probe, false, at(60));
        assert!(b.admit(at(109)).is_err());
        let probe = b.admit(at(110)).expect("the next probe");
        b.record(probe, true, at(111));
        let stats = b.stats();
        assert!(!stats.open);
        assert_eq!((stats.trips, stats.probes, stats.fast_failures), (1, 2, 3));
        // Closed again, with a clean count.
        assert!(call(&b, 112, false));
        assert!(call(&b, 113, false));
        assert!(!b.stats().open);
    }

    #[test]
    fn a_cancelled_probe_lets_the_next_call_probe() {
        let b = breaker();
        for ms in 0..3 {
            call(&b, ms, false);
        }
        let probe = b.admit(at(100)).expect("the probe");
        drop(probe);
        assert!(matches!(b.admit(at(100)), Ok(Pass::Probe(_))));
    }

    #[test]
    fn a_late_answer_closes_it_and_late_failures_do_nothing() {
        let b = breaker();
        let slow = b.admit(at(0)).unwrap();
        let late_failure = b.admit(at(0)).unwrap();
        for ms in 1..4 {
            call(&b, ms, false);
        }
        assert!(b.stats().open);
        b.record(late_failure, false, at(5));
        assert_eq!(b.stats().trips, 1);
        b.record(slow, true, at(6)); // Redis answered: it is back
        assert!(!b.stats().open);
        assert!(call(&b, 7, true));
    }

    /// Calls that reach an open breaker at once, from many threads (a
    /// barrier releases them together, so that they contend for the lock
    /// behind the hint; the lock makes any interleaving safe, so the
    /// checks hold whatever the order): how many were let through as
    /// probes, went as if closed, and failed fast.
    fn admit_at_once(b: &Arc<Breaker>, ms: u64) -> (Vec<ProbeGuard>, usize, usize) {
        const THREADS: usize = 8;
        let start = std::sync::Barrier::new(THREADS);
        let passes: Vec<_> = std::thread::scope(|scope| {
            let calls: Vec<_> = (0..THREADS)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        b.admit(at(ms))
                    })
                })
                .collect();
            calls
                .into_iter()
                .map(|call| call.join().expect("admit panicked"))
                .collect()
        });
        let (mut probes, mut goes, mut refused) = (Vec::new(), 0, 0);
        for pass in passes {
            match pass {
                Ok(Pass::Probe(guard)) => probes.push(guard),
                Ok(Pass::Go) => goes += 1,
                Err(err) => {
                    assert!(err.is_circuit_open(), "{err:?}");
                    refused += 1;
                }
            }
        }
        (probes, goes, refused)
    }

    /// Half-open under contention: when the open period ends, of many
    /// threads calling at the same instant exactly one probes and the
    /// others fail fast, and so do all calls while that probe is in
    /// flight; a failed probe opens the breaker for another period, after
    /// which again exactly one probes; an answered probe closes it, and
    /// every call goes.
    #[test]
    fn simultaneous_calls_let_one_probe_through() {
        let b = breaker();
        for ms in 0..3 {
            call(&b, ms, false);
        }
        // Opened at 2 ms: the probe is due from 52 ms.
        let (mut probes, goes, refused) = admit_at_once(&b, 52);
        assert_eq!((probes.len(), goes, refused), (1, 0, 7), "at 52 ms");
        let probe = probes.pop().expect("one probe");
        let (probes, goes, refused) = admit_at_once(&b, 60);
        assert_eq!((probes.len(), goes, refused), (0, 0, 8), "probe in flight");
        // The probe fails at 60 ms: open until 110 ms.
        b.record(Pass::Probe(probe), false, at(60));
        let (probes, goes, refused) = admit_at_once(&b, 109);
        assert_eq!((probes.len(), goes, refused), (0, 0, 8), "reopened");
        let (mut probes, goes, refused) = admit_at_once(&b, 110);
        assert_eq!((probes.len(), goes, refused), (1, 0, 7), "at 110 ms");
        b.record(Pass::Probe(probes.pop().expect("one probe")), true, at(111));
        let (probes, goes, refused) = admit_at_once(&b, 112);
        assert_eq!((probes.len(), goes, refused), (0, 8, 0), "closed");
        let stats = b.stats();
        assert_eq!((stats.trips, stats.probes, stats.fast_failures), (1, 2, 30));
    }

    #[test]
    fn threshold_zero_never_opens() {
        let b = Arc::new(Breaker::new(0, Duration::from_millis(50)));
        for ms in 0..100 {
            assert!(call(&b, ms, false));
        }
        assert_eq!(b.stats(), CircuitStats::default());
    }
}

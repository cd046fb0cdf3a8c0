//! Test threads that wait for each other, and a test that fails within
//! seconds when one of them fails, never hangs.
//!
//! `std::sync::Barrier` waits forever: when one of the threads that should
//! arrive has panicked (an assertion fired), the others block for good, and
//! `thread::scope` (or a join) waits for them. The same goes for a thread
//! spinning until a flag that a failed thread was to set. Here a barrier
//! breaks, waking every waiter with a panic, as soon as a party fails
//! ([`Barrier::guard`]), or when a party is missing for [`PATIENCE`]; and
//! [`SetOnDrop`] sets a stop flag however its scope ends. The same goes
//! for a task awaiting a peer over a socket: [`within`] fails it after
//! [`PATIENCE`] instead of letting it wait for an answer that never comes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// The longest a test thread waits for another before the test fails: far
/// beyond any honest wait on a loaded machine, short enough to fail a
/// stuck test in CI rather than hang it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A barrier for `parties` threads that breaks instead of waiting forever.
#[derive(Debug)]
pub struct Barrier {
    parties: usize,
    state: Mutex<State>,
    woken: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Threads waiting in the current generation.
    arrived: usize,
    /// Generations completed.
    generation: u64,
    /// A party failed: every wait, now and later, panics.
    broken: Option<String>,
}

impl Barrier {
    pub fn new(parties: usize) -> Self {
        assert!(parties > 0);
        Barrier {
            parties,
            state: Mutex::new(State::default()),
            woken: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves `State` consistent (every
        // update is one field).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every party has arrived.
    ///
    /// # Panics
    ///
    /// When the barrier is broken (a party panicked while holding its
    /// [`guard`](Self::guard)), or when the others have not all arrived
    /// within [`PATIENCE`] (the barrier is then broken for them too).
    pub fn wait(&self) {
        let mut state = self.lock();
        if let Some(why) = &state.broken {
            let why = why.clone();
            drop(state);
            panic!("barrier broken: {why}");
        }
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.parties {
            state.arrived = 0;
            state.generation += 1;
            self.woken.notify_all();
            return;
        }
        let deadline = Instant::now() + PATIENCE;
        while state.generation == generation && state.broken.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let why = format!(
                    "{} of {} parties arrived in {PATIENCE:?}",
                    state.arrived, self.parties
                );
                state.broken = Some(why.clone());
                self.woken.notify_all();
                drop(state);
                panic!("barrier broken: {why}");
            }
            state = self
                .woken
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if state.generation == generation {
            let why = state.broken.clone().unwrap_or_default();
            drop(state);
            panic!("barrier broken: {why}");
        }
    }

    /// Breaks the barrier: every thread waiting, and every later wait,
    /// panics with `why`.
    pub fn break_with(&self, why: &str) {
        let mut state = self.lock();
        if state.broken.is_none() {
            state.broken = Some(why.to_owned());
        }
        self.woken.notify_all();
    }

    /// A guard that breaks the barrier if the thread holding it panics,
    /// so that the other parties stop waiting for it.
    pub fn guard(&self) -> BreakOnPanic<'_> {
        BreakOnPanic(self)
    }
}

/// See [`Barrier::guard`].
#[derive(Debug)]
pub struct BreakOnPanic<'a>(&'a Barrier);

impl Drop for BreakOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            let name = thread::current().name().unwrap_or("a thread").to_owned();
            self.0.break_with(&format!("{name} panicked"));
        }
    }
}

/// Sets a flag when dropped: at the end of the scope that owns it, and when
/// that scope unwinds (a failed assertion), so that threads looping until
/// the flag is set always stop.
#[derive(Debug)]
pub struct SetOnDrop<'a>(pub &'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        // Release pairs with the loops' Acquire loads of the flag.
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `calls` on a thread of its own and returns what they return;
/// panics with their panic if they panic, or if they have not returned
/// within twice [`PATIENCE`]. For the tests whose failure is a call that
/// never returns (a dead bucket left in a map is retried for ever): they
/// fail, not hang.
pub fn returns<R: Send + 'static>(calls: impl FnOnce() -> R + Send + 'static) -> R {
    let (sent, answer) = std::sync::mpsc::channel();
    let caller = thread::spawn(move || sent.send(calls()));
    match answer.recv_timeout(2 * PATIENCE) {
        Ok(returned) => returned,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the calls never returned"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match caller.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(_) => unreachable!("the calls' thread ended without an answer or a panic"),
        },
    }
}

/// Awaits `future` for at most [`PATIENCE`] (on tokio's clock): a server
/// or client that never answers, or never closes, fails the test with
/// `what` instead of hanging it. Not under tokio's paused clock, which
/// jumps to the deadline whenever every task waits on a socket.
pub async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(done) => done,
        Err(_) => panic!("{what}: nothing within {PATIENCE:?}"),
    }
}

//! Plans: a quota per call (`under`), the default quota changed live
//! (`set_quota`), and what a bucket holds when its quota changes, checked
//! against an independent model and on real threads.
#![cfg(not(loom))]

mod common;

use common::model::{as_secs, outcome, Model};
use common::plans::{Plan, PlanModel, PLANS};
use common::EPOCH_UNIX;
use keyrate::{Denial, Limiter, ManualClock, Now, Quota, TokenBucketLimiter};
use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::thread;
use std::time::{Duration, Instant};

fn quota(plan: &Plan) -> Quota {
    Quota::new(plan.rate(), plan.capacity).unwrap()
}

#[derive(Debug, Clone)]
struct Op {
    key: usize,
    plan: usize,
    /// How the call names its plan: 0 `under` on the limiter, 1 `under` on
    /// a handle, 2 `set_quota` then a default call, 3 a default handle
    /// call after `set_quota`.
    how: u8,
    step: u64,
    cost: u64,
    sweep: bool,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (
            0usize..3,
            0..PLANS.len(),
            0u8..4,
            any::<u64>(),
            0u64..=110,
            prop::bool::weighted(0.05),
        )
            .prop_map(|(key, plan, how, step, cost, sweep)| Op {
                key,
                plan,
                how,
                step,
                cost,
                sweep,
            }),
        1..150,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// Calls under quotas that change at random points decide exactly as
    /// the model's rule: the refill still missing is kept. Sweeps in
    /// between change nothing (a full bucket is full under any quota).
    #[test]
    fn quotas_changing_at_random_points_follow_the_model(ops in ops(), unix in any::<bool>()) {
        let clock = ManualClock::new();
        let limiter = TokenBucketLimiter::with_quota(quota(&PLANS[0])).with_clock(clock.clone());
        let keys = ["sk_free_a", "sk_pro_b", "sk_c"];
        let handles: Vec<_> = keys.iter().map(|k| limiter.bucket(*k)).collect();
        let mut model = PlanModel::new();
        let mut now: u64 = if unix { EPOCH_UNIX } else { 0 };
        for op in ops {
            let plan = &PLANS[op.plan];
            let q = quota(plan);
            now += match op.step % 4 {
                0 => 0,
                1 => op.step / 4 % 1_000_000,
                2 => op.step / 4 % (plan.token() as u64),
                _ => op.step / 4 % 30_000_000_000,
            };
            clock.set(Duration::from_nanos(now));
            let key = keys[op.key];
            let got = match op.how {
                0 => limiter.under(&q).check(key, Now, op.cost),
                1 => handles[op.key].under(&q).check(Now, op.cost),
                2 => {
                    limiter.set_quota(q);
                    limiter.check(key, Now, op.cost)
                }
                _ => {
                    limiter.set_quota(q);
                    handles[op.key].check(Now, op.cost)
                }
            };
            let want = model.call(key, now, op.cost, plan);
            prop_assert_eq!(outcome(got), want, "{:?} at {}", op, now);
            prop_assert_eq!(
                limiter.under(&q).remaining(key, Now),
                Ok(model.remaining(key, now, plan))
            );
            if op.sweep {
                limiter.sweep(Now);
            }
        }
    }
}

#[test]
fn an_upgrade_and_a_downgrade() {
    let free = Quota::new(1.0, 5).unwrap();
    let pro = Quota::new(20.0, 100).unwrap();
    let limiter = TokenBucketLimiter::with_quota(free);
    // A free key spends its whole burst at 0 s: full again at 5 s.
    assert_eq!((0..9).filter(|_| limiter.allow("k", 0.0)).count(), 5);
    // At 2 s it holds 2 of 5 (3 s missing). Upgraded, the same 3 s missing
    // is 60 of the pro plan's 100 tokens: it holds 40, refilled at 20/s.
    assert_eq!(limiter.remaining("k", 2.0), Ok(2));
    assert_eq!(limiter.under(&pro).remaining("k", 2.0), Ok(40));
    assert_eq!(
        limiter
            .under(&pro)
            .check("k", 2.0, 40)
            .map(|d| d.remaining()),
        Ok(0)
    );
    assert!(!limiter.under(&pro).allow("k", 2.0));
    assert!(limiter.under(&pro).allow("k", 2.05));
    // Now 5 s missing at 2.05 s (full at 7.05 s). Downgraded to free, that
    // is all 5 tokens missing: nothing until 3.05 s, one token a second.
    assert_eq!(limiter.remaining("k", 2.05), Ok(0));
    assert_eq!(
        limiter.check("k", 2.05, 1),
        Err(Denial::InsufficientTokens {
            retry_after: Duration::from_secs(1)
        })
    );
    assert_eq!(limiter.remaining("k", 7.05), Ok(5));
    // A downgrade that leaves more missing than the new bucket holds is a
    // debt: the enterprise key below misses 10 s, the free plan holds 5 s.
    let enterprise = Quota::new(100.0, 1000).unwrap();
    assert_eq!(
        limiter
            .under(&enterprise)
            .check("e", 0.0, 1000)
            .map(|d| d.remaining()),
        Ok(0)
    );
    assert_eq!(
        limiter.check("e", 0.0, 1).unwrap_err().retry_after(),
        Some(Duration::from_secs(6))
    );
}

#[test]
fn a_bucket_full_under_one_quota_is_evicted_under_any() {
    let limiter = TokenBucketLimiter::new(1.0, 5).with_auto_sweep(false);
    let slow = Quota::new(0.01, 5).unwrap(); // 500 s to fill
    assert!(limiter.under(&slow).allow("k", 0.0));
    // Under the default quota the bucket would be full after 1 s, but its
    // word says 100 s: the sweep keeps it until then.
    assert_eq!(limiter.sweep(50.0), 0);
    assert_eq!(limiter.under(&slow).remaining("k", 50.0), Ok(4));
    // 50 s missing is 50 default tokens: a debt, nothing held.
    assert_eq!(limiter.remaining("k", 50.0), Ok(0));
    assert_eq!(limiter.sweep(100.0), 1);
    assert_eq!(limiter.remaining("k", 100.0), Ok(5));
}

#[test]
fn invalid_quotas_never_reach_a_call() {
    // A quota is validated when it is built, so no call can carry a bad one.
    assert!(Quota::new(f64::NAN, 1).is_err());
    assert!(Quota::new(1.0, 0).is_err());
    assert!(Quota::new(3e8, 1).is_err());
}

/// Threads spending from one key while another changes the default quota.
const SPENDERS: usize = 2;
/// Calls made wholly within a phase before it may end: 20 s of timestamps.
const PHASE_CALLS: u64 = 20_000;
/// Each call 1 ms after the one before.
const STEP_NS: u64 = 1_000_000;

/// What the spenders and the thread that changes the quota share.
struct Hammer {
    limiter: TokenBucketLimiter,
    /// `2 * k` while phase `k` is stable; odd while a change is under way.
    phase: AtomicU64,
    /// The next call's timestamp, in ns.
    ticket: AtomicU64,
    /// Per phase: calls made wholly within it.
    calls: Vec<AtomicU64>,
    /// Per phase: a spender was denied after being admitted in it, so the
    /// phase spent its bucket down to its bound.
    bound: Vec<AtomicBool>,
    /// Tells the spenders to stop.
    done: AtomicBool,
    /// A spender panicked.
    failed: AtomicBool,
}

/// Stops the spenders when dropped: when the changing thread is done, and
/// when it panics, so that a failure never leaves them spinning.
struct StopOnDrop<'a>(&'a Hammer);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.done.store(true, SeqCst);
    }
}

/// Marks the hammer failed when a spender panics, so that the changing
/// thread stops waiting for it.
struct FailOnPanic<'a>(&'a Hammer);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.failed.store(true, SeqCst);
        }
    }
}

/// One spender: calls as fast as it can, each at the next ticket, and
/// keeps the calls made wholly within one phase as `(phase, t, quota the
/// call was decided under or its denial)`.
fn spend(hammer: &Hammer) -> Vec<(usize, u64, Result<Quota, Denial>)> {
    let _fail = FailOnPanic(hammer);
    let mut seen = Vec::new();
    let mut admitted_in = None;
    while !hammer.done.load(SeqCst) {
        let p1 = hammer.phase.load(SeqCst);
        let (secs, t) = as_secs(hammer.ticket.fetch_add(STEP_NS, SeqCst));
        let decided = hammer.limiter.check("k", secs, 1);
        let p2 = hammer.phase.load(SeqCst);
        if p1 == p2 && p1 % 2 == 0 {
            let k = (p1 / 2) as usize;
            if decided.is_ok() {
                admitted_in = Some(k);
            } else if admitted_in == Some(k) {
                hammer.bound[k].store(true, SeqCst);
            }
            hammer.calls[k].fetch_add(1, SeqCst);
            seen.push((k, t, decided.map(|d| d.quota())));
        }
    }
    seen
}

/// Waits until phase `k` has lasted `PHASE_CALLS` calls and spent its
/// bucket down to its bound; fails at once if a spender panicked, if the
/// phase goes on far longer without reaching its bound, or if no call at
/// all is made for a minute (a spender stuck in a call).
fn wait_for_bound(hammer: &Hammer, k: usize) {
    let mut last = (hammer.ticket.load(SeqCst), Instant::now());
    loop {
        let calls = hammer.calls[k].load(SeqCst);
        if calls >= PHASE_CALLS && hammer.bound[k].load(SeqCst) {
            return;
        }
        assert!(!hammer.failed.load(SeqCst), "phase {k}: a spender panicked");
        assert!(
            calls < 50 * PHASE_CALLS,
            "phase {k}: {calls} calls and the bucket never reached its bound"
        );
        let ticket = hammer.ticket.load(SeqCst);
        if ticket != last.0 {
            last = (ticket, Instant::now());
        }
        assert!(
            last.1.elapsed() < Duration::from_secs(60),
            "phase {k}: no call for a minute"
        );
        thread::yield_now();
    }
}

/// One thread changes the default quota while others spend from one key.
/// A phase ends only once its spenders have hammered its bucket down to
/// its bound, so every phase is exercised whatever the scheduling. In
/// each phase:
/// - every call admitted wholly within it was decided under its quota
///   (the change took effect), and every denial was for lack of tokens;
/// - over every span, admitted cost stays within the phase's
///   `capacity + rate * span` (checked exactly);
/// - the spenders are admitted close to that bound (see below), so a
///   change that did not take effect would show there too.
#[test]
fn set_quota_while_threads_spend_keeps_each_phase_within_its_bound() {
    const PHASES: usize = 24;
    let plans = [PLANS[0], PLANS[1], PLANS[2], PLANS[4]];
    let plan_of = |k: usize| plans[k % plans.len()];
    let hammer = Hammer {
        limiter: TokenBucketLimiter::with_quota(quota(&plan_of(0))),
        phase: AtomicU64::new(0),
        ticket: AtomicU64::new(0),
        calls: (0..PHASES).map(|_| AtomicU64::new(0)).collect(),
        bound: (0..PHASES).map(|_| AtomicBool::new(false)).collect(),
        done: AtomicBool::new(false),
        failed: AtomicBool::new(false),
    };
    let mut calls: Vec<(usize, u64, Result<Quota, Denial>)> = thread::scope(|scope| {
        let spenders: Vec<_> = (0..SPENDERS)
            .map(|_| scope.spawn(|| spend(&hammer)))
            .collect();
        let stop = StopOnDrop(&hammer);
        for k in 0..PHASES {
            wait_for_bound(&hammer, k);
            if k + 1 < PHASES {
                hammer.phase.store(2 * k as u64 + 1, SeqCst);
                hammer.limiter.set_quota(quota(&plan_of(k + 1)));
                hammer.phase.store(2 * k as u64 + 2, SeqCst);
            }
        }
        drop(stop);
        spenders
            .into_iter()
            .flat_map(|s| s.join().unwrap())
            .collect()
    });
    calls.sort_by_key(|&(_, t, _)| t);
    for k in 0..PHASES {
        let plan = plan_of(k);
        let q = quota(&plan);
        let phase: Vec<_> = calls.iter().filter(|&&(p, ..)| p == k).collect();
        for (_, t, decided) in &phase {
            match decided {
                Ok(used) => assert_eq!(
                    *used, q,
                    "phase {k}: at {t} ns, decided under another quota"
                ),
                Err(Denial::InsufficientTokens { .. }) => {}
                Err(other) => panic!("phase {k}: at {t} ns, unexpected {other:?}"),
            }
        }
        let admitted: Vec<(u64, u64)> = phase
            .iter()
            .filter(|(.., decided)| decided.is_ok())
            .map(|&&(_, t, _)| (t, 1))
            .collect();
        let exact = Model::exact(plan.num, plan.den, plan.capacity);
        assert!(exact.within_budget(&admitted), "phase {k}: over budget");
        // Close to the bound. The bucket's word (the instant it is full
        // again) grows by one interval per admitted call; after the first
        // admission at `first` it is at most `first + capacity * interval`,
        // and after the phase's last call at `end`, admitted or denied, at
        // least `end + interval`; calls come every 1 ms, far more often
        // than an interval, so the bucket never fills in between. The
        // calls that spent without being kept (each spender's one call
        // straddling each end of the phase, the first one perhaps under
        // the previous quota) account for the rest. Whatever the
        // scheduling, then:
        //   admitted * interval + (capacity + SPENDERS) * interval
        //     + SPENDERS * max(interval, previous interval) >= end - first.
        // The model's intervals, not the library's.
        let interval = plan.token() as u64;
        let previous = if k == 0 {
            interval
        } else {
            plan_of(k - 1).token() as u64
        };
        let first = admitted.first().expect("a phase ends after an admission").0;
        let end = phase.last().expect("a phase has calls").1;
        let slack =
            (plan.capacity + SPENDERS as u64) * interval + SPENDERS as u64 * previous.max(interval);
        assert!(
            admitted.len() as u64 * interval + slack >= end - first,
            "phase {k}: {} admitted in {} ns at one per {interval} ns",
            admitted.len(),
            end - first
        );
    }
}

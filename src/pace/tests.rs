use super::*;

const SEC: u64 = 1_000_000_000;

/// A pass over two shards, one slice each, then a second: the second
/// pass's steps remove what was full when the first started, and a step
/// is due again after a slice's share of the pass's new keys.
#[test]
fn a_pass_takes_a_step_a_slice_and_bounds_the_next_by_its_start() {
    // A floor of 60 over two shards: a step every 30 new keys, each
    // counted (steps that close are not sampled).
    let pace = Pace::new(60, 2);
    for _ in 0..29 {
        assert!(!pace.counted());
    }
    assert!(pace.counted() && pace.due() && pace.take());
    assert!(!pace.take(), "one thread steps at a time");
    let first = pace.position(Nanos::new(5 * SEC));
    assert_eq!(
        (first.shard, first.at, first.full_at),
        (0, Cursor::default(), Nanos::ZERO)
    );
    pace.stepped(Err(10), 2);
    assert!(!pace.due(), "the step took the count");
    assert!(pace.take());
    let second = pace.position(Nanos::new(6 * SEC));
    assert_eq!((second.shard, second.full_at), (1, Nanos::ZERO));
    pace.stepped(Err(10), 2);
    // The second pass: bounded by the first's start (5 s), never by `now`
    // unless `now` is earlier.
    assert!(pace.take());
    assert_eq!(
        pace.position(Nanos::new(9 * SEC)).full_at,
        Nanos::new(5 * SEC)
    );
    pace.stepped(
        Ok(Cursor {
            from: 256,
            layout: 3,
        }),
        2,
    );
    assert!(pace.take());
    let step = pace.position(Nanos::new(4 * SEC));
    assert_eq!(
        (step.shard, step.at, step.full_at),
        (
            0,
            Cursor {
                from: 256,
                layout: 3
            },
            Nanos::new(4 * SEC)
        ),
        "the same shard's next slice, bounded by a `now` that ran backwards"
    );
    pace.stepped(Err(0), 2);
}

/// A step that unwinds counts its slice and lets the next start past it:
/// the pass does not start again (its bound stays), and the flag is free.
#[test]
fn an_abandoned_step_moves_past_its_slice_within_the_pass() {
    // One shard: a pass is one step (while nothing unwinds).
    let pace = Pace::new(64, 1);
    pace.force_due();
    assert!(pace.take());
    pace.position(Nanos::new(SEC));
    pace.stepped(Err(0), 1);
    assert!(pace.take());
    pace.position(Nanos::new(2 * SEC));
    pace.stepped(Err(0), 1);
    // The third pass's first step unwinds.
    pace.force_due();
    assert!(pace.take());
    let step = pace.position(Nanos::new(3 * SEC));
    assert_eq!(step.full_at, Nanos::new(2 * SEC));
    pace.abandoned();
    assert!(pace.due(), "the step that was due stays due");
    assert!(pace.take(), "the flag was let go");
    let next = pace.position(Nanos::new(4 * SEC));
    assert_eq!(
        (next.shard, next.at.from, next.full_at),
        (0, SWEEP_SLICE, Nanos::new(2 * SEC)),
        "the next step starts past the slice, in the same pass"
    );
}

use super::*;

const SEC: u64 = 1_000_000_000;

/// Counts new keys until a step is due; returns how many it counted. A
/// pace that never makes a step due fails the test after a minute of real
/// time (far beyond any honest count: the sampled counts are random),
/// rather than spinning for ever.
fn count_until_due(pace: &Pace) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut counted = 1;
    while !pace.counted() {
        counted += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "no step due after {counted} new keys, in a minute"
        );
    }
    counted
}

/// Counts new keys until a step is due, takes it, and places it at `secs`.
fn take_due_step(pace: &Pace, secs: u64) -> Step {
    count_until_due(pace);
    assert!(pace.take());
    pace.position(Nanos::new(secs * SEC))
}

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
    pace.stepped(Err(10));
    assert!(!pace.due(), "the step took the count");
    assert!(pace.take());
    let second = pace.position(Nanos::new(6 * SEC));
    assert_eq!((second.shard, second.full_at), (1, Nanos::ZERO));
    pace.stepped(Err(10));
    // The second pass: bounded by the first's start (5 s), never by `now`
    // unless `now` is earlier.
    assert!(pace.take());
    assert_eq!(
        pace.position(Nanos::new(9 * SEC)).full_at,
        Nanos::new(5 * SEC)
    );
    pace.stepped(Ok(Cursor {
        from: 256,
        layout: 3,
    }));
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
    pace.stepped(Err(0));
}

/// A step that unwinds lets the next start at the next shard, in the same
/// pass (its bound stays), at once; the flag is free.
#[test]
fn an_abandoned_step_moves_on_to_the_next_shard_within_the_pass() {
    let pace = Pace::new(64, 2);
    // A whole pass (two steps), so that the next one has a bound.
    for secs in [1, 2] {
        take_due_step(&pace, secs);
        pace.stepped(Err(5));
    }
    // The second pass's first step, in the middle of shard 0, unwinds.
    count_until_due(&pace);
    assert!(pace.take());
    assert!(!pace.due(), "the step took the count");
    let step = pace.position(Nanos::new(3 * SEC));
    assert_eq!((step.shard, step.full_at), (0, Nanos::new(SEC)));
    pace.abandoned();
    assert!(pace.due(), "the next step is due at once");
    assert!(pace.take(), "the flag was let go");
    let next = pace.position(Nanos::new(4 * SEC));
    assert_eq!(
        (next.shard, next.at, next.full_at),
        (1, Cursor::default(), Nanos::new(SEC)),
        "the next step starts at the next shard, in the same pass"
    );
    // Abandoned in the last shard: the pass ends, and the next begins.
    pace.abandoned();
    assert!(pace.take());
    let next = pace.position(Nanos::new(5 * SEC));
    assert_eq!((next.shard, next.full_at), (0, Nanos::new(3 * SEC)));
}

/// New keys made while a step runs count toward the next step: the step
/// took the count when it began, not when it ended.
#[test]
fn keys_made_during_a_step_count_toward_the_next() {
    // A step every 30 new keys, each counted.
    let pace = Pace::new(60, 2);
    take_due_step(&pace, 1);
    // Another thread makes 30 keys meanwhile: the step after is due, but
    // not taken while this one runs.
    let due = (0..30).filter(|_| pace.counted()).count();
    assert_eq!(due, 1, "the 30th key found a step due");
    assert!(!pace.take());
    pace.stepped(Ok(Cursor {
        from: 256,
        layout: 1,
    }));
    assert!(pace.due(), "the keys made during the step were kept");
    assert!(pace.take());
}

/// New keys made while the thread that holds a step is held up (30 steps'
/// worth) are owed: the steps after it follow one another at once until
/// they have caught up, each taking its own count.
#[test]
fn steps_owed_are_taken_one_after_another() {
    let pace = Pace::new(60, 2);
    take_due_step(&pace, 1);
    for _ in 0..30 * 30 {
        pace.counted();
    }
    pace.stepped(Ok(Cursor {
        from: 256,
        layout: 1,
    }));
    let mut steps = 0;
    while pace.due() {
        assert!(pace.take());
        pace.position(Nanos::new(SEC));
        pace.stepped(Ok(Cursor {
            from: 256,
            layout: 1,
        }));
        steps += 1;
        // A pace that stays due would loop here for ever.
        assert!(steps <= 30, "more than 30 steps due");
    }
    assert_eq!(steps, 30);
}

/// A pass's length after one in which `watched` new keys were counted by
/// the ghosts' sample, `returned` of them keys the sweep had removed.
fn after_pass(length: usize, left: usize, watched: usize, returned: usize) -> usize {
    let ghosts = Ghosts::new();
    // Counted: bits 32.. of the hash clear; a returning key is not (bit
    // 32 set), so that each count is set on its own. Each returning key
    // has a ghost slot of its own (the low bits), and no fresh key's slot
    // (0) holds a ghost.
    let fresh = |i: usize| (i as u64 + 1) << 40;
    let back = |i: usize| (i as u64 + 1) << 40 | 1 << 32 | (i as u64 + 1);
    for i in 0..returned {
        ghosts.evicted(back(i));
    }
    for i in 0..watched {
        ghosts.created(fresh(i));
    }
    for i in 0..returned {
        ghosts.created(back(i));
    }
    next_pass_length(length, left, &ghosts, 100)
}

/// Passes grow when at least one new key in `RETURNING_SHARE` is a
/// return (and at least `RETURNS_TO_GROW` are): to `LONG_PASS` at once, or
/// `LONG_GROWTH` times if more; from `LONG_PASS` on, only at one in
/// `LONG_RETURNING_SHARE`. Otherwise they shrink by a quarter, never
/// below the floor nor half the entries the pass left.
#[test]
fn passes_grow_with_returning_keys_and_shrink_without() {
    let bar = RETURNS_TO_GROW * RETURNING_SHARE;
    assert_eq!(after_pass(1000, 0, 0, 0), 750, "nothing came back");
    assert_eq!(after_pass(1000, 0, bar, RETURNS_TO_GROW), LONG_PASS);
    assert_eq!(
        after_pass(1000, 0, bar + 1, RETURNS_TO_GROW),
        750,
        "under the share"
    );
    assert_eq!(
        after_pass(1000, 0, 1, RETURNS_TO_GROW - 1),
        750,
        "too few returns"
    );
    assert_eq!(after_pass(1000, 4000, 0, 0), 4000 / LEFT_PER_NEW_KEY);
    assert_eq!(after_pass(110, 0, 0, 0), 100, "the floor");
    let short = LONG_PASS / 2 + 1;
    assert_eq!(
        after_pass(short, 0, bar, RETURNS_TO_GROW),
        short * LONG_GROWTH,
        "more than `LONG_PASS`"
    );
    let long_bar = RETURNS_TO_GROW * LONG_RETURNING_SHARE;
    assert_eq!(
        after_pass(LONG_PASS, 0, long_bar, RETURNS_TO_GROW),
        LONG_PASS * LONG_GROWTH
    );
    assert_eq!(
        after_pass(LONG_PASS, 0, long_bar + 1, RETURNS_TO_GROW),
        LONG_PASS - LONG_PASS / 4,
        "a long pass's bar is higher"
    );
}

/// A pass paced for the previous pass's slices, in a map that has grown
/// since: after each shard, the rest of the pass is spread over the
/// slices the shards left will take, like the ones swept, so the pass
/// still ends after its length in new keys, not four times later.
#[test]
fn a_pass_in_a_grown_map_keeps_to_its_length() {
    // Four shards, a floor of 96: the first pass, one slice a shard,
    // paces the second at a step every 24 new keys (each counted: below
    // `PRESSURE_SAMPLED_FROM`).
    let pace = Pace::new(96, 4);
    for secs in 1..=4 {
        take_due_step(&pace, secs);
        pace.stepped(Err(0));
    }
    // The map grew: each shard now takes four slices.
    let mut new_keys = 0;
    for step in 1..=16 {
        new_keys += count_until_due(&pace);
        assert!(pace.take());
        let at = pace.position(Nanos::new(10 * SEC)).at;
        pace.stepped(if step % 4 == 0 {
            Err(0)
        } else {
            Ok(Cursor {
                from: 256 * (step % 4),
                layout: at.layout,
            })
        });
    }
    // The first shard's four steps took the pass's 96 new keys; the other
    // twelve slices follow at a new key each (paced by the old slices
    // alone: 24 each, 384 in all).
    assert_eq!(new_keys, 96 + 12);
    assert_eq!(pace.shard.load(Ordering::Relaxed), 0, "the pass is over");
}

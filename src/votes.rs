//! Which keys a thread's map lookups keep asking for: the votes that
//! promote a key into a thread's cache of hot keys (the keyed limiter's
//! and the compound limiter's).

/// Counters in one vote set.
const VOTE_WAYS: usize = 4;

/// One set of Misra-Gries counters: each a key's tag and its net votes
/// (0: free). A key gains a vote while it makes up more than a fifth of
/// its set's lookups, so random traffic over many keys promotes nothing,
/// and up to four keys that come together (a call's key, its org and a
/// global key) climb side by side where one slot would have let each
/// reset the other's count for ever.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Votes<T>([(T, u32); VOTE_WAYS]);

impl<T: Copy + Eq> Votes<T> {
    /// No votes; `free` fills the free counters' tags (never read).
    pub(crate) const fn new(free: T) -> Self {
        Votes([(free, 0); VOTE_WAYS])
    }

    /// Counts one lookup of the key tagged `tag`: true when it has just
    /// won `after` net votes (its counter is then freed). A key's first
    /// lookup never promotes it.
    #[inline]
    pub(crate) fn vote(&mut self, tag: T, after: u32) -> bool {
        let counters = &mut self.0;
        if let Some(counter) = counters.iter_mut().find(|c| c.0 == tag && c.1 > 0) {
            counter.1 += 1;
            if counter.1 < after {
                return false;
            }
            counter.1 = 0;
            return true;
        }
        if let Some(counter) = counters.iter_mut().find(|c| c.1 == 0) {
            *counter = (tag, 1);
        } else {
            for counter in counters.iter_mut() {
                counter.1 -= 1;
            }
        }
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Votes;

    #[test]
    fn a_key_alone_wins_on_its_vote_number_after() {
        let mut votes = Votes::new(0u64);
        let won: Vec<bool> = (0..6).map(|_| votes.vote(7, 3)).collect();
        // Won on the third vote, then counted afresh from the fourth.
        assert_eq!(won, [false, false, true, false, false, true]);
    }

    #[test]
    fn four_keys_taking_turns_all_win() {
        let mut votes = Votes::new(0u64);
        let mut won = [0; 4];
        for round in 0..16 {
            for key in 0..4u64 {
                if votes.vote(key + 1, 16) {
                    won[key as usize] += 1;
                    assert_eq!(round, 15, "key {key}");
                }
            }
        }
        assert_eq!(won, [1; 4]);
    }

    #[test]
    fn a_stream_of_keys_each_seen_once_wins_nothing() {
        let mut votes = Votes::new(0u64);
        assert!((1..10_000u64).all(|key| !votes.vote(key, 2)));
    }

    #[test]
    fn a_key_over_a_fifth_of_the_lookups_wins_through_a_stream() {
        let mut votes = Votes::new(0u64);
        let mut won = 0;
        for call in 0..4_000u64 {
            // The hot key one lookup in three, the others each seen once.
            let key = if call % 3 == 0 { 1 } else { 1_000 + call };
            won += u32::from(votes.vote(key, 16));
        }
        assert!(won > 0, "the hot key won {won} times");
    }
}

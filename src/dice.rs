//! "One call in `n`, at random", for the samplers that keep per-thread
//! state: the hot-key cache's votes and the sweep's pacing.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A linear congruential generator, seeded apart in each thread on its
/// first draw. Seeds must differ: with one seed shared by every thread,
/// each thread's first few dozen draws came out alike (the sweep's pacing
/// then counted nothing from threads that create a few buckets each).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dice(u64);

impl Dice {
    /// Not drawn from yet: seeded by the first draw.
    pub(crate) const fn new() -> Self {
        Dice(0)
    }

    /// True about one call in `n` (a power of two).
    #[inline]
    pub(crate) fn one_in(&mut self, n: u64) -> bool {
        if self.0 == 0 {
            self.0 = seed();
        }
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // The top bits: an LCG's best.
        (self.0 >> 32) % n == 0
    }
}

/// A seed of its own for each thread that asks: a Weyl sequence, mixed
/// (splitmix64's finaliser), never 0.
#[cold]
fn seed() -> u64 {
    /// Where the next seed comes from.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Relaxed: only distinctness matters, and fetch_add gives it.
    let mut x = NEXT.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) | 1
}

#[cfg(test)]
mod tests {
    use super::Dice;

    /// Two threads' first draws differ, and each comes out true about one
    /// time in `n`.
    #[test]
    fn threads_draw_apart_at_the_asked_rate() {
        let draws = |_| {
            let mut dice = Dice::new();
            (0..4096).map(|_| dice.one_in(8)).collect::<Vec<bool>>()
        };
        let (a, b) = (
            draws(0),
            std::thread::spawn(move || draws(1)).join().unwrap(),
        );
        assert_ne!(a[..64], b[..64]);
        for run in [&a, &b] {
            let hits = run.iter().filter(|&&hit| hit).count();
            assert!((384..=640).contains(&hits), "{hits} of 4096");
            // The first draws are not all false, as a shared seed made them.
            assert!(run[..128].iter().any(|&hit| hit));
        }
    }
}

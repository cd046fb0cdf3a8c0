//! Helpers shared by the integration tests: one copy of each constant,
//! generator and guard, used by every test file.
#![allow(dead_code)]

pub mod keys;
pub mod model;
pub mod plans;
pub mod sync;

/// An instant in Unix-epoch nanoseconds (November 2023): timestamps at the
/// scale a server's clock gives, far beyond 2^53 ns.
pub const EPOCH_UNIX: u64 = 1_700_000_000_000_000_000;

/// A realistic API key: `sk_live_` and 32 hex characters, distinct per `i`.
pub fn api_key(i: u64) -> String {
    // A bijective mix so neighbouring ids do not share prefixes.
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    format!("sk_live_{:016x}{:016x}", x, i)
}

/// Marsaglia's xorshift64 (shifts 13, 7, 17): a small generator,
/// reproducible from its seed, with no dependency.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator started at `seed` (xorshift never leaves 0, so a zero
    /// seed is replaced by a fixed odd one).
    pub fn new(seed: u64) -> Self {
        XorShift(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next number.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

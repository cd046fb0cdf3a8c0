//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod model;
pub mod plans;

/// A realistic API key: `sk_live_` and 32 hex characters, distinct per `i`.
pub fn api_key(i: u64) -> String {
    // A bijective mix so neighbouring ids do not share prefixes.
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    format!("sk_live_{:016x}{:016x}", x, i)
}

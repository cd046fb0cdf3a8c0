//! Keys and key picks shared by the benches and `examples/pacing.rs`
//! (which includes this file by path): nothing here depends on a
//! competitor, so an example can use it without the rest of `common`.

/// A key shaped like a production API key: `sk_live_` and 32 hex digits,
/// 40 bytes in all. Distinct `n` give distinct keys.
pub fn api_key(n: u64) -> String {
    let high = mix(n);
    let low = mix(high ^ n);
    format!("sk_live_{high:016x}{low:016x}")
}

/// A bijective 64-bit mixer (splitmix64's finaliser), used for keys and as
/// a cheap pseudo-random step.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One of `n` keys at random: advances `state` one [`mix`] step and
/// scales its high half to `0..n` (a multiply, no division).
#[inline(always)]
pub fn one_of(state: &mut u64, n: usize) -> usize {
    *state = mix(*state);
    (((*state >> 32) * n as u64) >> 32) as usize
}

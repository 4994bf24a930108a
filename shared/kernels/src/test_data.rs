//! Inputs shared by the crate's unit tests.

/// `len` pseudo-random bytes from `seed` (an LCG). Every byte pattern is a
/// valid quantized block, non-finite and subnormal scales included.
pub(crate) fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect()
}

/// `n` values `sin((i + seed) · step)`: smooth, signed, no two neighbours alike.
pub(crate) fn sine(n: usize, seed: f32, step: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * step).sin()).collect()
}

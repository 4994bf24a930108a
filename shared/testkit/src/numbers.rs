//! Deterministic pseudo-random test data and float comparisons.

/// Deterministic pseudo-random numbers in [-1, 1): a 64-bit LCG whose seed is spread by
/// the golden-ratio constant (any seed, 0 included, gives a usable stream).
pub struct Lcg(u64);

impl Lcg {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number, in [-1, 1). (Not `Iterator::next`: the stream never ends, so no
    /// `Option`.)
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The next 32 random bits (the state's top half), for choices and bytes.
    pub fn bits32(&mut self) -> u32 {
        self.next();
        (self.0 >> 32) as u32
    }

    /// The next `n` numbers.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }

    /// `n` token ids below `vocab`.
    pub fn tokens(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (((self.next() + 1.0) / 2.0) * vocab as f32) as u32 % vocab as u32)
            .collect()
    }
}

/// Max |a - b| over two equally long slices (panics when their lengths differ).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Bit patterns, for exact comparisons with readable failures.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

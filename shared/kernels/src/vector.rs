//! Plain f32 vector helpers shared by the model forwards.

/// Dot product with eight fixed accumulator lanes and a fixed final reduction (so the
/// result never depends on the caller). Always inlined, so that callers compiled with wider
/// registers (attention) vectorize it.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    for i in chunks..a.len() {
        acc[i - chunks] += a[i] * b[i];
    }
    let s0 = (acc[0] + acc[4]) + (acc[1] + acc[5]);
    let s1 = (acc[2] + acc[6]) + (acc[3] + acc[7]);
    s0 + s1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - exact).abs() < 1e-5);
    }
}

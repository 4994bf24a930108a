//! `ArgmaxScreen`: per activation row, the first maximum of a Q8_0 lane
//! product, found through an 8-bit screen, equals the first maximum of the
//! full exact product — over random shapes, scales, activations with
//! outliers, rows duplicated to make exact ties, and rows the bound does not
//! cover (non-finite activations), which are computed in full.

use proptest::prelude::*;
use tandem_kernels::{first_max, ArgmaxScreen, Isa, LaneMatrix, QMatrix, QType};

use crate::common::{random_matrix, Rng};

/// A random Q8_0 matrix whose row `dup` repeats row 0 (an exact tie).
fn matrix(n: usize, k: usize, dup: usize, rng: &mut Rng) -> LaneMatrix {
    let w = random_matrix(QType::Q8_0, n, k, rng);
    let row = w.as_bytes().len() / n;
    let mut bytes = w.as_bytes().to_vec();
    bytes.copy_within(..row, (dup % n) * row);
    let w = QMatrix::new(QType::Q8_0, n, k, bytes).expect("valid bytes");
    LaneMatrix::pack(&w).expect("quantized")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn screened_argmaxes_are_the_exact_first_maxima(
        n in 1usize..300,
        blocks in 1usize..12,
        m in 1usize..14,
        dup in 0usize..300,
        outlier in 1.0f32..60.0,
        broken in proptest::option::of(0usize..14),
        seed in any::<u64>(),
    ) {
        let k = 32 * blocks;
        let mut rng = Rng::new(seed);
        let w = matrix(n, k, dup, &mut rng);
        let screen = ArgmaxScreen::new(&w).expect("Q8_0");
        let mut x: Vec<f32> = (0..m * k)
            .map(|i| if i % 29 == 3 { outlier * rng.unit() } else { rng.unit() })
            .collect();
        if let Some(r) = broken.filter(|&r| r < m) {
            x[r * k] = f32::INFINITY;
        }
        let got = screen.argmax_rows(&w, &x, m).expect("argmaxes");
        let mut z = vec![0f32; m * n];
        w.matmul_with(Isa::Scalar, &x, m, &mut z).expect("product");
        let want: Vec<u32> = z.chunks_exact(n).map(first_max).collect();
        prop_assert_eq!(got.ids, want);
    }
}

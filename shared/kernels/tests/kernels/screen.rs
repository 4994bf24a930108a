//! `ArgmaxScreen`: per activation row, the outputs a Q8_0 lane product's
//! 8-bit screen keeps for its top `top` hold that row's top `top` of the
//! full exact product (by value, ties to the lower index), with the full
//! product's values bit for bit, so the first maximum and any top-k
//! selection agree — over random shapes, scales, activations with outliers,
//! rows duplicated to make exact ties, and rows the bound does not cover
//! (non-finite activations), which are computed in full. Its upper bounds lie on or
//! above every output, are a row's own whatever rows share the call, and one output
//! computed alone is the product's.

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

/// A screened case: a `matrix` of `n` outputs and `32 · blocks` inputs, its screen, `m`
/// activation rows with an outlier every 29th value (row `broken`, where it is one, starts
/// with an infinity) and their product on the portable loop.
struct Case {
    k: usize,
    w: LaneMatrix,
    screen: ArgmaxScreen,
    x: Vec<f32>,
    z: Vec<f32>,
}

fn case(
    (n, blocks, m, dup): (usize, usize, usize, usize),
    outlier: f32,
    broken: Option<usize>,
    seed: u64,
) -> Case {
    let k = 32 * blocks;
    let mut rng = Rng::new(seed);
    let w = matrix(n, k, dup, &mut rng);
    let screen = ArgmaxScreen::new(&w).expect("Q8_0");
    let mut x: Vec<f32> = (0..m * k)
        .map(|i| {
            if i % 29 == 3 {
                outlier * rng.unit()
            } else {
                rng.unit()
            }
        })
        .collect();
    if let Some(r) = broken.filter(|&r| r < m) {
        x[r * k] = f32::INFINITY;
    }
    let mut z = vec![0f32; m * n];
    w.matmul_with(Isa::Scalar, &x, m, &mut z).expect("product");
    Case { k, w, screen, x, z }
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
        top in 1usize..40,
        seed in any::<u64>(),
    ) {
        let Case { w, screen, x, z, .. } = case((n, blocks, m, dup), outlier, broken, seed);
        let got = screen.top_rows(&w, &x, m, top).expect("top rows");
        for (row, z) in got.rows.iter().zip(z.chunks_exact(n)) {
            prop_assert_eq!(row.first_max(), first_max(z));
            for (&j, &v) in row.ids.iter().zip(&row.values) {
                prop_assert_eq!(v.to_bits(), z[j as usize].to_bits());
            }
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b)));
            for want in order.iter().take(top) {
                prop_assert!(row.ids.binary_search(want).is_ok(), "top output {} missing", want);
            }
        }
    }

    #[test]
    fn upper_bounds_hold_and_are_each_rows_own(
        n in 1usize..300,
        blocks in 1usize..12,
        m in 1usize..14,
        outlier in 1.0f32..60.0,
        broken in proptest::option::of(0usize..14),
        seed in any::<u64>(),
    ) {
        let Case { k, w, screen, x, z } = case((n, blocks, m, 0), outlier, broken, seed);
        let got = screen.upper_rows(&w, &x, m).expect("upper rows");
        for (r, (row, z)) in got.iter().zip(z.chunks_exact(n)).enumerate() {
            let x = &x[r * k..][..k];
            prop_assert_eq!(row.exact, !ArgmaxScreen::available() || broken == Some(r));
            for (j, (&u, &z)) in row.upper.iter().zip(z).enumerate() {
                match row.exact {
                    true => prop_assert_eq!(u.to_bits(), z.to_bits()),
                    false => prop_assert!(u >= z, "row {} output {}: {} < {}", r, j, u, z),
                }
                if !z.is_nan() {
                    prop_assert_eq!(w.output(x, j).expect("output").to_bits(), z.to_bits());
                }
            }
            let alone = screen.upper_rows(&w, x, 1).expect("alone");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(alone[0].exact, row.exact);
            prop_assert_eq!(bits(&alone[0].upper), bits(&row.upper));
        }
    }
}

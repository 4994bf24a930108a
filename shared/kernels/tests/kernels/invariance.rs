//! Batch invariance of `matmul` and the exact lane product: each output row's bits
//! must not depend on how many other rows share the call, on how rows are
//! grouped into calls, or on the number of threads.

use proptest::prelude::*;
use tandem_kernels::{Isa, QMatrix, QType};
use tandem_testkit::bits;

use crate::common::{exact, isas, matmul, random_acts, random_k, random_matrix, Product, Rng};

/// Both products, by name.
const PRODUCTS: [(&str, Product); 2] = [("matmul", matmul), ("exact", exact)];

/// Index and values of the first difference, if any.
fn first_difference(a: &[u32], b: &[u32]) -> Option<(usize, f32, f32)> {
    if a.len() != b.len() {
        return Some((a.len().min(b.len()), f32::NAN, f32::NAN));
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y)?;
    Some((i, f32::from_bits(a[i]), f32::from_bits(b[i])))
}

/// Results of `x` (m rows) computed by `product` in consecutive calls of the
/// given sizes.
fn in_pieces(product: Product, w: &QMatrix, isa: Isa, x: &[f32], sizes: &[usize]) -> Vec<f32> {
    let k = w.k();
    let mut out = Vec::new();
    let mut row = 0;
    for &len in sizes {
        out.extend(product(w, isa, &x[row * k..(row + len) * k], len));
        row += len;
    }
    out
}

/// A random partition of `m` into positive parts.
fn random_split(m: usize, rng: &mut Rng) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut left = m;
    while left > 0 {
        let len = 1 + rng.below(left);
        sizes.push(len);
        left -= len;
    }
    sizes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn rows_are_bit_identical_for_any_batch(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let qtype = QType::ALL[rng.below(QType::ALL.len())];
        let m = 1 + rng.below(17);
        let n = 1 + rng.below(70);
        let k = random_k(qtype, 4, &mut rng);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        for (name, product) in PRODUCTS {
            for isa in isas() {
                let all = bits(&product(&w, isa, &x, m));
                let singles = bits(&in_pieces(product, &w, isa, &x, &vec![1; m]));
                let diff = first_difference(&all, &singles);
                prop_assert!(diff.is_none(), "{} {:?} {:?} m={} n={} k={}: batch vs single rows: {:?}", name, qtype, isa, m, n, k, diff);
                let sizes = random_split(m, &mut rng);
                let split = bits(&in_pieces(product, &w, isa, &x, &sizes));
                let diff = first_difference(&all, &split);
                prop_assert!(diff.is_none(), "{} {:?} {:?}: batch vs split {:?}: {:?}", name, qtype, isa, sizes, diff);
            }
        }
    }

    #[test]
    fn avx_vnni_is_bit_identical_to_avx2(seed in any::<u64>()) {
        // Nothing to compare without it (rejecting every case would fail the test).
        if !Isa::AvxVnni.is_available() {
            return Ok(());
        }
        let mut rng = Rng::new(seed);
        let qtype = QType::ALL[rng.below(QType::ALL.len())];
        let m = 1 + rng.below(17);
        let n = 1 + rng.below(70);
        let k = random_k(qtype, 4, &mut rng);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        for (name, product) in PRODUCTS {
            let avx2 = bits(&product(&w, Isa::Avx2, &x, m));
            let vnni = bits(&product(&w, Isa::AvxVnni, &x, m));
            let diff = first_difference(&avx2, &vnni);
            prop_assert!(diff.is_none(), "{} {:?} m={} n={} k={}: {:?}", name, qtype, m, n, k, diff);
        }
    }

    #[test]
    fn amx_is_bit_identical_to_its_reference(seed in any::<u64>()) {
        if !Isa::Amx.is_available() {
            return Ok(());
        }
        let mut rng = Rng::new(seed);
        let qtype = QType::ALL[rng.below(QType::ALL.len())];
        let m = 1 + rng.below(40);
        let n = 1 + rng.below(70);
        let k = random_k(qtype, 4, &mut rng);
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        for (name, product) in PRODUCTS {
            // The tiles serve 8-bit products of the Q8_0-activation types;
            // everything else is the `Isa::AvxVnni` code.
            let tiled = name == "matmul" && matches!(qtype, QType::Q4_0 | QType::Q5_0 | QType::Q8_0);
            let reference = if tiled { Isa::Scalar } else { Isa::AvxVnni };
            let expected = bits(&product(&w, reference, &x, m));
            let amx = bits(&product(&w, Isa::Amx, &x, m));
            let diff = first_difference(&expected, &amx);
            prop_assert!(diff.is_none(), "{} {:?} m={} n={} k={}: {:?}", name, qtype, m, n, k, diff);
        }
    }
}

#[test]
fn rows_are_bit_identical_across_thread_pools_and_batches() {
    let mut rng = Rng::new(11);
    for qtype in QType::ALL {
        let (m, n) = (9, 777);
        let k = if qtype.block_size() == 1 {
            517
        } else {
            2 * 256
        };
        let w = random_matrix(qtype, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        for ((name, product), isa) in PRODUCTS
            .into_iter()
            .flat_map(|p| isas().into_iter().map(move |i| (p, i)))
        {
            let reference = bits(&in_pieces(product, &w, isa, &x, &[1; 9]));
            for threads in [1, 2, 3] {
                let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
                    Ok(p) => p,
                    Err(e) => panic!("thread pool: {e}"),
                };
                let batched = pool.install(|| bits(&product(&w, isa, &x, m)));
                let diff = first_difference(&batched, &reference);
                assert!(
                    diff.is_none(),
                    "{name} {qtype:?} {isa:?} with {threads} threads: {diff:?}"
                );
                let split = pool.install(|| bits(&in_pieces(product, &w, isa, &x, &[4, 2, 3])));
                let diff = first_difference(&split, &reference);
                assert!(
                    diff.is_none(),
                    "{name} {qtype:?} {isa:?} split with {threads} threads: {diff:?}"
                );
            }
        }
    }
}

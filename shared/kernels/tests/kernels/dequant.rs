//! Dequantization: hand-made blocks with known values (encoded following
//! ggml's `quantize_row_*_ref` packing) and row/matrix consistency.

use half::f16;
use proptest::prelude::*;
use tandem_kernels::{QMatrix, QType};

use crate::common::{random_k, random_matrix, Rng};

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn dequant_one_row(qtype: QType, k: usize, bytes: Vec<u8>) -> Vec<f32> {
    let w = match QMatrix::new(qtype, 1, k, bytes) {
        Ok(w) => w,
        Err(e) => panic!("{qtype:?}: {e}"),
    };
    let mut row = vec![f32::NAN; k];
    assert_eq!(w.dequantize_row(0, &mut row), Ok(()));
    row
}

fn assert_values(qtype: QType, got: &[f32], want: impl Fn(usize) -> f32) {
    for (e, &g) in got.iter().enumerate() {
        assert_eq!(g, want(e), "{qtype:?} element {e}");
    }
}

/// ggml's 12-byte packing of eight 6-bit scales and mins (Q4_K / Q5_K).
fn pack_k4_scales(sc: [u8; 8], mn: [u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j];
            s[j + 4] = mn[j];
        } else {
            s[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (mn[j] >> 4) << 6;
        }
    }
    s
}

const K4_SC: [u8; 8] = [1, 2, 3, 4, 40, 45, 50, 63];
const K4_MN: [u8; 8] = [0, 5, 10, 15, 33, 37, 60, 17];

#[test]
fn known_blocks_dequantize_to_known_values() {
    let k = 32;
    let mut b = h(0.5).to_vec();
    b.extend((0..16u8).map(|l| l | ((15 - l) << 4)));
    let row = dequant_one_row(QType::Q4_0, k, b);
    assert_values(QType::Q4_0, &row, |e| {
        if e < 16 {
            (e as f32 - 8.0) * 0.5
        } else {
            (7.0 - (e - 16) as f32) * 0.5
        }
    });

    let mut b = h(1.0).to_vec();
    b.extend(0x0000_FFFFu32.to_le_bytes());
    b.extend((0..16u8).map(|l| l | (l << 4)));
    let row = dequant_one_row(QType::Q5_0, k, b);
    assert_values(QType::Q5_0, &row, |e| {
        if e < 16 {
            e as f32
        } else {
            (e - 16) as f32 - 16.0
        }
    });

    let mut b = h(2.0).to_vec();
    b.extend((0..32i8).map(|i| (i - 16) as u8));
    let row = dequant_one_row(QType::Q8_0, k, b);
    assert_values(QType::Q8_0, &row, |e| 2.0 * (e as f32 - 16.0));

    let k = 256;
    let (d, dmin) = (1.0f32, 0.5f32);
    let mut b = [h(d), h(dmin)].concat();
    b.extend(pack_k4_scales(K4_SC, K4_MN));
    b.extend((0..128).map(|i| (i % 16) as u8 | (((i % 16) as u8) << 4)));
    let row = dequant_one_row(QType::Q4_K, k, b);
    let sub = |e: usize| {
        (
            f32::from(K4_SC[e / 32]) * d,
            f32::from(K4_MN[e / 32]) * dmin,
        )
    };
    assert_values(QType::Q4_K, &row, |e| sub(e).0 * (e % 16) as f32 - sub(e).1);

    let mut b = [h(d), h(dmin)].concat();
    b.extend(pack_k4_scales(K4_SC, K4_MN));
    let value = |e: usize| ((e * 7) % 32) as u8;
    b.extend((0..32).map(|l| (0..8).map(|c| (value(32 * c + l) >> 4) << c).sum::<u8>()));
    b.extend((0..128).map(|i| {
        (value(64 * (i / 32) + i % 32) & 15) | ((value(64 * (i / 32) + 32 + i % 32) & 15) << 4)
    }));
    let row = dequant_one_row(QType::Q5_K, k, b);
    assert_values(QType::Q5_K, &row, |e| {
        sub(e).0 * f32::from(value(e)) - sub(e).1
    });

    let value = |e: usize| ((e * 7) % 64) as u8;
    let scale = |g: usize| g as i8 - 8;
    let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
    for half in 0..2 {
        let (j, ql, qh) = (128 * half, &mut ql[64 * half..], &mut qh[32 * half..]);
        for l in 0..32 {
            let v = |o: usize| value(j + l + o);
            ql[l] = (v(0) & 15) | ((v(64) & 15) << 4);
            ql[l + 32] = (v(32) & 15) | ((v(96) & 15) << 4);
            qh[l] = (v(0) >> 4) | ((v(32) >> 4) << 2) | ((v(64) >> 4) << 4) | ((v(96) >> 4) << 6);
        }
    }
    let mut b = [ql, qh].concat();
    b.extend((0..16).map(|g| scale(g) as u8));
    b.extend(h(0.25));
    let row = dequant_one_row(QType::Q6_K, k, b);
    assert_values(QType::Q6_K, &row, |e| {
        0.25 * f32::from(scale(e / 16)) * (f32::from(value(e)) - 32.0)
    });

    let mut b = 0.125f32.to_le_bytes().to_vec();
    b.extend((0..256).map(|e: i32| (e - 128) as i8 as u8));
    b.extend([0u8; 32]);
    let row = dequant_one_row(QType::Q8_K, k, b);
    assert_values(QType::Q8_K, &row, |e| 0.125 * (e as f32 - 128.0));

    let vals = [1.5f32, -2.25, 0.0, 65504.0];
    let row = dequant_one_row(QType::F16, 4, vals.iter().flat_map(|&v| h(v)).collect());
    assert_values(QType::F16, &row, |e| vals[e]);
    let row = dequant_one_row(
        QType::F32,
        4,
        vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
    );
    assert_values(QType::F32, &row, |e| vals[e]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn dequantize_row_matches_dequantize(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let qtype = QType::ALL[rng.below(QType::ALL.len())];
        let n = 1 + rng.below(9);
        let k = random_k(qtype, 3, &mut rng);
        let w = random_matrix(qtype, n, k, &mut rng);
        let all = w.dequantize();
        prop_assert_eq!(all.len(), n * k);
        let mut row = vec![0f32; k];
        for (j, want) in all.chunks_exact(k).enumerate() {
            prop_assert!(w.dequantize_row(j, &mut row).is_ok());
            let same = row.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{:?} row {}", qtype, j);
            prop_assert!(row.iter().all(|v| v.is_finite()));
        }
    }
}

/// `select_rows` copies whole rows: dequantized values and matmul outputs equal those of
/// the source rows bit for bit, and an out-of-range row is an error.
#[test]
fn select_rows_is_exact() {
    let mut rng = Rng::new(11);
    for qtype in [QType::F32, QType::Q8_0, QType::Q4_K, QType::Q6_K] {
        let (n, k) = (13, 256);
        let w = random_matrix(qtype, n, k, &mut rng);
        let pick = [7usize, 0, 12, 7];
        let s = w.select_rows(&pick).expect("select");
        assert_eq!((s.n(), s.k(), s.qtype()), (pick.len(), k, qtype));
        let (mut a, mut b) = (vec![0f32; k], vec![0f32; k]);
        for (i, &r) in pick.iter().enumerate() {
            w.dequantize_row(r, &mut a).expect("row");
            s.dequantize_row(i, &mut b).expect("row");
            assert_eq!(a, b, "{qtype:?} row {r}");
        }
        let x: Vec<f32> = (0..2 * k).map(|_| rng.unit()).collect();
        let (mut full, mut sel) = (vec![0f32; 2 * n], vec![0f32; 2 * pick.len()]);
        w.matmul(&x, 2, &mut full).expect("matmul");
        s.matmul(&x, 2, &mut sel).expect("matmul");
        for m in 0..2 {
            for (i, &r) in pick.iter().enumerate() {
                assert_eq!(sel[m * pick.len() + i].to_bits(), full[m * n + r].to_bits());
            }
        }
        assert_eq!(
            w.select_rows(&[n]).err(),
            Some(tandem_kernels::KernelError::RowOutOfRange { row: n, n })
        );
    }
}

//! `Isa::set_max` caps `Isa::detect`, and so every matmul that does not name
//! its implementation, for the whole process: a test binary of its own, since
//! the cap is global.

use tandem_kernels::{Isa, KernelError, LaneMatrix, QMatrix, QType};

#[test]
fn a_cap_holds_for_the_process_and_cannot_change() {
    let best = Isa::detect();
    assert_eq!(Isa::max(), None);
    // The fastest level at most AVX2 that this CPU has: AVX2 where the CPU
    // has more, so the cap changes which kernels run.
    let cap = best.min(Isa::Avx2);
    assert_eq!(Isa::set_max(cap), Ok(()));
    assert_eq!(Isa::detect(), cap);
    assert_eq!(Isa::max(), Some(cap));
    assert_eq!(Isa::set_max(cap), Ok(()));
    let other = if cap == Isa::Scalar {
        Isa::Amx
    } else {
        Isa::Scalar
    };
    assert_eq!(
        Isa::set_max(other),
        Err(KernelError::IsaCapAlreadySet {
            set: cap,
            wanted: other
        })
    );
    assert_eq!(Isa::detect(), cap);

    let (n, k, m) = (40, 64, 3);
    let bytes: Vec<u8> = (0..n * k / 32 * 34)
        .map(|i| {
            if i % 34 == 1 {
                0x20
            } else {
                (i * 37 % 251) as u8
            }
        })
        .collect();
    let w = QMatrix::new(QType::Q8_0, n, k, bytes).expect("a valid Q8_0 matrix");
    let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
    let (mut capped, mut named) = (vec![0f32; m * n], vec![0f32; m * n]);
    w.matmul(&x, m, &mut capped).expect("capped matmul");
    w.matmul_with(cap, &x, m, &mut named).expect("named matmul");
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&capped), bits(&named));

    // The exact lane product under the cap (256-bit tiles at most) gives the
    // portable loop's bits.
    let lanes = LaneMatrix::pack(&w).expect("quantized");
    let (mut capped, mut portable) = (vec![0f32; m * n], vec![0f32; m * n]);
    lanes
        .matmul(&x, m, &mut capped)
        .expect("capped lane matmul");
    lanes
        .matmul_with(Isa::Scalar, &x, m, &mut portable)
        .expect("portable lane matmul");
    assert_eq!(bits(&capped), bits(&portable));
}

//! Bad sizes and ids are reported as `KernelError`, never as panics.

use tandem_kernels::{Isa, KernelError, QMatrix, QType};

use crate::common::{random_matrix, Rng};

#[test]
fn qtype_geometry_and_ggml_ids() {
    for qtype in QType::ALL {
        assert_eq!(QType::from_ggml_id(qtype.ggml_id()), Ok(qtype));
    }
    let ids: Vec<u32> = QType::ALL.iter().map(|q| q.ggml_id()).collect();
    assert_eq!(ids, [0, 1, 2, 6, 8, 12, 13, 14, 15]);
    for bad in [3, 7, 10, 16, 30, 1000] {
        assert_eq!(
            QType::from_ggml_id(bad),
            Err(KernelError::UnsupportedGgmlType(bad))
        );
    }
    let sizes: Vec<(usize, usize)> = QType::ALL
        .iter()
        .map(|q| (q.block_size(), q.block_bytes()))
        .collect();
    let want = [
        (1, 4),
        (1, 2),
        (32, 18),
        (32, 22),
        (32, 34),
        (256, 144),
        (256, 176),
        (256, 210),
        (256, 292),
    ];
    assert_eq!(sizes, want);
    assert_eq!(QType::Q6_K.row_bytes(512), Ok(420));
    assert!(matches!(
        QType::Q4_0.row_bytes(33),
        Err(KernelError::MisalignedK { .. })
    ));
}

#[test]
fn bad_matrix_sizes_are_errors() {
    assert_eq!(
        QMatrix::new(QType::Q8_0, 0, 32, vec![]).map(|_| ()),
        Err(KernelError::EmptyMatrix { n: 0, k: 32 })
    );
    assert_eq!(
        QMatrix::new(QType::F32, 2, 0, vec![]).map(|_| ()),
        Err(KernelError::EmptyMatrix { n: 2, k: 0 })
    );
    assert_eq!(
        QMatrix::new(QType::Q4_K, 1, 640, vec![0; 360]).map(|_| ()),
        Err(KernelError::MisalignedK {
            qtype: QType::Q4_K,
            k: 640,
            block_size: 256
        })
    );
    assert_eq!(
        QMatrix::new(QType::Q8_0, 2, 64, vec![0; 135]).map(|_| ()),
        Err(KernelError::ByteLength {
            qtype: QType::Q8_0,
            n: 2,
            k: 64,
            expected: 136,
            actual: 135
        })
    );
    assert!(matches!(
        QMatrix::new(QType::F32, usize::MAX, 2, vec![]),
        Err(KernelError::SizeOverflow { .. })
    ));
    assert!(QMatrix::new(QType::Q8_0, 2, 64, vec![0; 136]).is_ok());
}

#[test]
fn bad_call_sizes_are_errors() {
    let w = random_matrix(QType::Q4_0, 3, 64, &mut Rng::new(1));
    let mut out = vec![0f32; 6];
    for isa in crate::common::isas() {
        assert_eq!(
            w.matmul_with(isa, &[0.0; 127], 2, &mut out),
            Err(KernelError::BufferLength {
                what: "activations",
                expected: 128,
                actual: 127
            })
        );
        assert_eq!(
            w.matmul_with(isa, &[0.0; 128], 2, &mut out[..5]),
            Err(KernelError::BufferLength {
                what: "output",
                expected: 6,
                actual: 5
            })
        );
        assert!(matches!(
            w.matmul_with(isa, &[0.0; 128], usize::MAX, &mut out),
            Err(KernelError::SizeOverflow { .. })
        ));
    }
    let mut row = vec![0f32; 64];
    assert_eq!(
        w.dequantize_row(3, &mut row),
        Err(KernelError::RowOutOfRange { row: 3, n: 3 })
    );
    assert_eq!(
        w.dequantize_row(0, &mut row[..63]),
        Err(KernelError::BufferLength {
            what: "dequantized row",
            expected: 64,
            actual: 63
        })
    );
    for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Amx]
        .into_iter()
        .filter(|i| !i.is_available())
    {
        assert_eq!(
            w.matmul_with(isa, &[0.0; 128], 2, &mut out),
            Err(KernelError::IsaUnavailable(isa))
        );
    }
}

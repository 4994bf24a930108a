//! Storage types ([`QType`]) and their ggml block geometry.

use crate::KernelError;

/// Elements per k-quant super-block (ggml's `QK_K`).
pub(crate) const QK_K: usize = 256;

/// Elements per Q4_0 / Q5_0 / Q8_0 block (ggml's `QK8_0`).
pub(crate) const QK8_0: usize = 32;

/// A ggml tensor storage type supported by the kernels.
///
/// The byte layouts are exactly ggml's (`ggml-common.h`), little endian:
///
/// | type   | elements | bytes | layout                                                    |
/// |--------|----------|-------|-----------------------------------------------------------|
/// | `F32`  | 1        | 4     | `f32`                                                     |
/// | `F16`  | 1        | 2     | `f16`                                                     |
/// | `Q4_0` | 32       | 18    | `f16 d`, `u8 qs[16]`                                      |
/// | `Q5_0` | 32       | 22    | `f16 d`, `u8 qh[4]`, `u8 qs[16]`                          |
/// | `Q8_0` | 32       | 34    | `f16 d`, `i8 qs[32]`                                      |
/// | `Q4_K` | 256      | 144   | `f16 d`, `f16 dmin`, `u8 scales[12]`, `u8 qs[128]`        |
/// | `Q5_K` | 256      | 176   | `f16 d`, `f16 dmin`, `u8 scales[12]`, `u8 qh[32]`, `u8 qs[128]` |
/// | `Q6_K` | 256      | 210   | `u8 ql[128]`, `u8 qh[64]`, `i8 scales[16]`, `f16 d`       |
/// | `Q8_K` | 256      | 292   | `f32 d`, `i8 qs[256]`, `i16 bsums[16]`                    |
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    /// 32-bit floats.
    F32,
    /// 16-bit IEEE half floats.
    F16,
    /// 4-bit quants with one f16 scale per 32: `w = d * (q - 8)`.
    Q4_0,
    /// 5-bit quants with one f16 scale per 32: `w = d * (q - 16)`.
    Q5_0,
    /// 8-bit quants with one f16 scale per 32: `w = d * q`.
    Q8_0,
    /// 4-bit k-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
    Q4_K,
    /// 5-bit k-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
    Q5_K,
    /// 6-bit k-quant: 16 sub-blocks of 16 with 8-bit signed scales.
    Q6_K,
    /// 8-bit k-quant with one f32 scale per 256 (ggml's activation format).
    Q8_K,
}

impl QType {
    /// Every supported type, in ggml id order.
    pub const ALL: [QType; 9] = [
        QType::F32,
        QType::F16,
        QType::Q4_0,
        QType::Q5_0,
        QType::Q8_0,
        QType::Q4_K,
        QType::Q5_K,
        QType::Q6_K,
        QType::Q8_K,
    ];

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        match self {
            QType::F32 | QType::F16 => 1,
            QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => QK8_0,
            QType::Q4_K | QType::Q5_K | QType::Q6_K | QType::Q8_K => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QType::F32 => 4,
            QType::F16 => 2,
            QType::Q4_0 => 18,
            QType::Q5_0 => 22,
            QType::Q8_0 => 34,
            QType::Q4_K => 144,
            QType::Q5_K => 176,
            QType::Q6_K => 210,
            QType::Q8_K => 292,
        }
    }

    /// The ggml type id (`enum ggml_type`) of this type.
    pub const fn ggml_id(self) -> u32 {
        match self {
            QType::F32 => 0,
            QType::F16 => 1,
            QType::Q4_0 => 2,
            QType::Q5_0 => 6,
            QType::Q8_0 => 8,
            QType::Q4_K => 12,
            QType::Q5_K => 13,
            QType::Q6_K => 14,
            QType::Q8_K => 15,
        }
    }

    /// Maps a ggml type id (as found in GGUF tensor infos) to a [`QType`].
    pub fn from_ggml_id(id: u32) -> Result<QType, KernelError> {
        QType::ALL
            .into_iter()
            .find(|t| t.ggml_id() == id)
            .ok_or(KernelError::UnsupportedGgmlType(id))
    }

    /// Bytes of one row of `k` elements; `k` must be a multiple of
    /// [`QType::block_size`].
    pub fn row_bytes(self, k: usize) -> Result<usize, KernelError> {
        let block_size = self.block_size();
        if !k.is_multiple_of(block_size) {
            return Err(KernelError::MisalignedK {
                qtype: self,
                k,
                block_size,
            });
        }
        (k / block_size)
            .checked_mul(self.block_bytes())
            .ok_or(KernelError::SizeOverflow { what: "row bytes" })
    }
}

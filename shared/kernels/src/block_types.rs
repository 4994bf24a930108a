//! Block sizes of the quantized types, by the `u8` type parameter the x86
//! 8-bit kernels are generic over.

use crate::kquants_avx2::qtype_of;
use crate::q8_x86::{Q4_0, Q5_0, Q8_0};
use crate::qtype::QType;

/// The quantized [`QType`] a type parameter `T` stands for.
const fn qtype<const T: u8>() -> QType {
    match T {
        Q4_0 => QType::Q4_0,
        Q5_0 => QType::Q5_0,
        Q8_0 => QType::Q8_0,
        _ => qtype_of::<T>(),
    }
}

/// Bytes per block of the quantized type `T`.
pub(crate) const fn block_bytes<const T: u8>() -> usize {
    qtype::<T>().block_bytes()
}

//! Integration tests of `tandem-kernels`: accuracy, the exact lane layout,
//! batch invariance, dequantization and error handling.

mod common;
mod dequant;
mod errors;
mod invariance;
mod lanes;
mod matmul;

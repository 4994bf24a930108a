//! Integration tests of `tandem-kernels`: accuracy, batch invariance,
//! dequantization and error handling.

mod common;
mod dequant;
mod errors;
mod invariance;
mod matmul;

//! Integration tests of `tandem-kernels`: accuracy, exact mode, batch
//! invariance, dequantization and error handling.

mod common;
mod dequant;
mod errors;
mod exact;
mod invariance;
mod lanes;
mod matmul;

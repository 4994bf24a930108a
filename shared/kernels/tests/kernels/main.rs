//! Integration tests of `tandem-kernels`: accuracy, the exact lane layout,
//! batch invariance, dequantization, the argmax screen and error handling.

mod common;
mod dequant;
mod errors;
mod invariance;
mod lanes;
mod matmul;
mod screen;

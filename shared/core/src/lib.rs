//! The pure core of tandem: sampling and the acceptance rules of speculative decoding.
//! No tensors, no I/O: plain slices in, plain values out, deterministic given a seed.

pub mod acceptance;
pub mod sampling;

pub use acceptance::{accept_greedy, accept_sampled, Verdict};
pub use sampling::{argmax, Sampler, SamplingError, SamplingParams, SparseDist};

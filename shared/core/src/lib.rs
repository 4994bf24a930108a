//! The pure core of tandem: sampling (and, as speculation lands, acceptance and stopping).
//! No tensors, no I/O: plain slices in, plain values out, deterministic given a seed.

pub mod sampling;

pub use sampling::{argmax, Sampler, SamplingError, SamplingParams, SparseDist};

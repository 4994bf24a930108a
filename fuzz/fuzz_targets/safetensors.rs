//! cargo-fuzz target `safetensors`: [`tandem_fuzz::files::safetensors`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::files::safetensors(data));

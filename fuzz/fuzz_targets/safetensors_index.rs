//! cargo-fuzz target `safetensors_index`: [`tandem_fuzz::files::safetensors_index`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::files::safetensors_index(data));

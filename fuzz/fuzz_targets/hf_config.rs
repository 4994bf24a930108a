//! cargo-fuzz target `hf_config`: [`tandem_fuzz::files::hf_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::files::hf_config(data));

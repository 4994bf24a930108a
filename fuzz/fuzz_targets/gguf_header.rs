//! cargo-fuzz target `gguf_header`: [`tandem_fuzz::files::gguf_header`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::files::gguf_header(data));

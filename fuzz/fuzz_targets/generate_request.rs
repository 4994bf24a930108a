//! cargo-fuzz target `generate_request`: [`tandem_fuzz::wire::generate_request`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::wire::generate_request(data));

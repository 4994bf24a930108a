//! cargo-fuzz target `draft_request`: [`tandem_fuzz::wire::draft_request`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::wire::draft_request(data));

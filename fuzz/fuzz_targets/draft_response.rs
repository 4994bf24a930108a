//! cargo-fuzz target `draft_response`: [`tandem_fuzz::wire::draft_response`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::wire::draft_response(data));

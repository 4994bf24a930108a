//! cargo-fuzz target `calibration`: [`tandem_fuzz::files::calibration`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::files::calibration(data));

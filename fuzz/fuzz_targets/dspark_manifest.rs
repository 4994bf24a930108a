//! cargo-fuzz target `dspark_manifest`: [`tandem_fuzz::files::dspark_manifest`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::files::dspark_manifest(data));

//! cargo-fuzz target `router_manifest`: [`tandem_fuzz::files::router_manifest`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tandem_fuzz::files::router_manifest(data));

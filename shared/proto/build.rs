//! Compiles proto/tandem/v1/*.proto with a vendored protoc (no system package needed).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files =
        ["common", "generation", "drafter"].map(|f| root.join(format!("tandem/v1/{f}.proto")));
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("tandem_v1_descriptor.bin"))
        .compile_protos(&files, std::slice::from_ref(&root))?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}

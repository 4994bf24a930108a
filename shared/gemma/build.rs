//! With the `cuda` feature, compiles tandem's own CUDA kernels (`kernels/*.cu`) to PTX with
//! `nvcc` (from `CUDA_ROOT`, else the `PATH`) for compute capability `CUDA_COMPUTE_CAP`
//! (default 80); the PTX is embedded in the crate and loaded on first use.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const KERNELS: [&str; 1] = ["step"];

fn main() {
    for k in KERNELS {
        println!("cargo:rerun-if-changed=kernels/{k}.cu");
    }
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = env::var("CUDA_ROOT").map_or("nvcc".into(), |r| format!("{r}/bin/nvcc"));
    let cap = env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    for k in KERNELS {
        let ptx = out.join(format!("{k}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", &format!("-arch=compute_{cap}"), "-o"])
            .arg(&ptx)
            .arg(format!("kernels/{k}.cu"))
            .status()
            .unwrap_or_else(|e| panic!("running {nvcc}: {e}"));
        assert!(status.success(), "{nvcc} failed on kernels/{k}.cu");
    }
}

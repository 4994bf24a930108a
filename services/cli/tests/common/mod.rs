//! Helpers of the `tandem` binary's tests: running it on the real Gemma 3 270M (fetched by
//! scripts/fetch-models.sh; tests never download) and reading what it printed.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Where the models are.
pub fn models_dir() -> PathBuf {
    std::env::var_os("TANDEM_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tandem/models")
        })
}

/// Runs `tandem args` with the models directory set.
pub fn tandem(args: &[&str]) -> Output {
    let dir = models_dir();
    assert!(
        dir.join("gemma-3-270m/gemma-3-270m-q4_k_m.gguf").is_file(),
        "models missing under {}: run scripts/fetch-models.sh first",
        dir.display()
    );
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .env("TANDEM_MODELS_DIR", &dir)
        .env_remove("TANDEM_MODEL")
        .env_remove("TANDEM_TOKENIZER")
        .output()
        .expect("run tandem")
}

/// What the run printed on stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails unless `out` is a failure with one line on stderr that names `needle`.
pub fn assert_one_line_error(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    let err = stderr(out);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(
        err.starts_with("tandem: error:") && err.contains(needle),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

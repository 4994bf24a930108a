//! Helpers of the `tandem` binary's tests: running it on the real Gemma 3 270M (fetched by
//! scripts/fetch-models.sh; tests never download) and reading what it printed.

use std::process::{Command, Output};

use tandem_testkit::{models_dir, real_gguf, MODELS_DIR_ENV};

/// `tandem args` with the models directory set.
pub fn command(args: &[&str]) -> Command {
    // The run needs the fetched model: fail here, clearly, when it is missing.
    real_gguf();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
    cmd.args(args)
        .env(MODELS_DIR_ENV, models_dir())
        .env_remove("TANDEM_MODEL")
        .env_remove("TANDEM_TOKENIZER");
    cmd
}

/// Runs `tandem args` to its end.
pub fn tandem(args: &[&str]) -> Output {
    command(args).output().expect("run tandem")
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

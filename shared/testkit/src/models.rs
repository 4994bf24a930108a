//! The models folder and the real files in it: the Gemma 3 270M GGUF and the Gemma 3
//! tokenizer that `scripts/fetch-models.sh` fetches.

use std::path::PathBuf;

/// The environment variable that names the models folder (as for the `tandem` command).
pub const MODELS_DIR_ENV: &str = "TANDEM_MODELS_DIR";

/// The real Gemma 3 270M (Q4_K_M GGUF), relative to [`models_dir`].
pub const REAL_GGUF: &str = "gemma-3-270m/gemma-3-270m-q4_k_m.gguf";

/// The real Gemma 3 tokenizer, relative to [`models_dir`].
pub const REAL_TOKENIZER: &str = "gemma-3-tokenizer/tokenizer.json";

/// The folder of the fetched models: `$TANDEM_MODELS_DIR`, else `~/.cache/tandem/models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os(MODELS_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tandem/models")
        })
}

/// The path of `rel` under [`models_dir`]; panics, saying to run `scripts/fetch-models.sh`,
/// when the file is not there.
pub fn existing(rel: &str) -> PathBuf {
    let p = models_dir().join(rel);
    assert!(
        p.is_file(),
        "{} missing: run scripts/fetch-models.sh first",
        p.display()
    );
    p
}

/// The real Gemma 3 270M GGUF ([`REAL_GGUF`]), which must have been fetched.
pub fn real_gguf() -> PathBuf {
    existing(REAL_GGUF)
}

/// The real Gemma 3 tokenizer ([`REAL_TOKENIZER`]), which must have been fetched.
pub fn real_tokenizer() -> PathBuf {
    existing(REAL_TOKENIZER)
}

//! scripts/fetch-corpus.sh refuses a download whose sha256 differs from the pinned one: its
//! `--verify-only FILE SHA256` mode (the check every download goes through, no network)
//! passes on the right file and fails with one line on a tampered one.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// sha256 of the six bytes "hello\n".
const HELLO_SHA256: &str = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-corpus.sh")
}

fn verify(file: &Path, sha: &str) -> Output {
    Command::new("bash")
        .arg(script())
        .arg("--verify-only")
        .arg(file)
        .arg(sha)
        .output()
        .unwrap()
}

#[test]
fn checksum_check_passes_on_the_right_file_and_fails_on_a_tampered_one() {
    let dir = std::env::temp_dir().join(format!("tandem-corpus-fetch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("archive.tgz");

    std::fs::write(&file, b"hello\n").unwrap();
    let ok = verify(&file, HELLO_SHA256);
    assert!(
        ok.status.success(),
        "right file refused: {}",
        String::from_utf8_lossy(&ok.stderr)
    );

    std::fs::write(&file, b"hellO\n").unwrap();
    let bad = verify(&file, HELLO_SHA256);
    assert!(!bad.status.success(), "tampered file accepted");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("sha256 mismatch"), "unexpected error: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "error is not one line: {err}"
    );

    let missing = verify(&dir.join("absent.tgz"), HELLO_SHA256);
    assert!(!missing.status.success(), "missing file accepted");

    std::fs::remove_dir_all(&dir).unwrap();
}

//! scripts/fetch-corpus.sh refuses a download whose sha256 differs from the pinned one: its
//! `--verify-only FILE SHA256` mode (the check every download goes through, no network)
//! passes on the right file and fails with one line on a tampered one. The `tasks` kind's
//! composer (scripts/corpus/tasks.py) is deterministic and writes requests in the forms
//! users send them, from the texts it is given.
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

/// The composer run on small made-up inputs: the same prompts twice, each in one of the
/// four forms, passages cut at sentence ends from the given texts, none of them markup.
#[test]
fn requests_are_composed_deterministically_from_the_given_text() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/corpus");
    let program = r#"
import json, tasks
prose = ["Marker sentence number %d is here. It says plenty about the harbour and the ships. " % i * 12 for i in range(40)]
prose.append("<html>{code} = markup; " * 80)
items = [{"task_description": "Add two numbers.", "code_sample": "def add(a, b):\n    return a + b"}]
a = tasks.tasks(["tea", "rivers"], prose, ["The film was a delight."], items, count=400)
b = tasks.tasks(["tea", "rivers"], prose, ["The film was a delight."], items, count=400)
print(json.dumps({"same": a == b, "prompts": a}))
"#;
    let out = Command::new("python3")
        .current_dir(&dir)
        .args(["-c", program])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["same"], true, "two runs differ");
    let prompts: Vec<&str> = (v["prompts"].as_array().unwrap().iter())
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(prompts.len(), 400);
    let chat = |p: &&str| {
        (p.starts_with("User: ") && p.ends_with("\nAssistant:"))
            || (p.starts_with("<start_of_turn>user\n") && p.ends_with("<start_of_turn>model\n"))
            || (p.starts_with("Question: ") && p.ends_with("\nAnswer:"))
    };
    let bare = prompts.iter().filter(|p| !chat(p)).count();
    assert!((40..200).contains(&bare), "{bare} of 400 bare requests");
    assert!(prompts
        .iter()
        .all(|p| !p.contains("<html>") && !p.contains("{code}")));
    let with_passage: Vec<&&str> = prompts.iter().filter(|p| p.contains("Marker")).collect();
    assert!(with_passage.len() > 40, "{} passages", with_passage.len());
    for p in with_passage {
        let at = p.find("Marker").unwrap();
        assert!(
            p[at..].contains("ships."),
            "a passage cut mid-sentence: {p}"
        );
    }
}

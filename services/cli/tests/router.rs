//! `tandem train-router` end to end on the real Gemma 3 270M tokenizer and the shipped
//! drafters: it fits a router on two small texts, writes a set whose drafter paths are
//! relative to it, and the set then drafts (greedy speculation identical to plain decoding,
//! the prompt routed by its tokens); bad arguments and a set given where one drafter is
//! needed get one clear line.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};

use common::{assert_one_line_error, stderr, tandem};

fn drafter(name: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../drafters")
        .join(name);
    dir.to_str().expect("utf-8").to_string()
}

/// Thirty-two files of each kind under `root/code` and `root/prose` (the held-out split
/// hashes each file's path, the temporary folder's random name included: with eight a kind,
/// all of one kind went to the held-out half about once in 128 runs).
fn texts(root: &Path) -> (PathBuf, PathBuf) {
    let (code, prose) = (root.join("code"), root.join("prose"));
    for d in [&code, &prose] {
        std::fs::create_dir_all(d).expect("dir");
    }
    for i in 0..32 {
        let c = format!(
            "def f{i}(x, y):\n    \"\"\"Return x plus {i}.\"\"\"\n    return x + y * {i}\n\n\
             class Thing{i}:\n    def __init__(self):\n        self.value = {i}\n"
        );
        let p = format!(
            "Dear friend, the garden was lovely this spring and the roses bloomed early. \
             We walked by the river on day {i} and talked about the old village.\n"
        );
        std::fs::write(code.join(format!("m{i}.py")), c.repeat(3)).expect("write");
        std::fs::write(prose.join(format!("letter{i}.txt")), p.repeat(3)).expect("write");
    }
    (code, prose)
}

fn train_router(out: &Path, root: &Path, default: &str) -> std::process::Output {
    let (code, prose) = texts(root);
    let (code, prose) = (
        code.to_str().expect("utf-8"),
        prose.to_str().expect("utf-8"),
    );
    let routes = [
        format!("code={}", drafter("gemma-3-270m-dspark")),
        format!("prose={}", drafter("gemma-3-270m-dspark-general")),
        format!("code={code}"),
        format!("prose={prose}"),
    ];
    let mut args = vec!["train-router", "--route", &routes[0], "--route", &routes[1]];
    args.extend([
        "--text",
        &routes[2],
        "--text",
        &routes[3],
        "--default",
        default,
    ]);
    args.extend([
        "--prompts",
        "24",
        "--held-out-prompts",
        "4",
        "--prompt-tokens",
        "16",
    ]);
    args.extend(["--held-out-percent", "50", "--min-count", "1"]);
    args.extend(["--out", out.to_str().expect("utf-8")]);
    tandem(&args)
}

#[test]
fn a_trained_router_routes_and_its_set_drafts_exactly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let set = tmp.path().join("set");
    let out = train_router(&set, tmp.path(), "prose");
    assert!(out.status.success(), "{}", stderr(&out));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(set.join("router.json")).expect("file"))
            .expect("json");
    let first = m["routes"][0]["drafter"].as_str().expect("path");
    assert!(Path::new(first).is_relative(), "{first}");
    assert!(set.join(first).join("dspark.json").is_file(), "{first}");
    assert_eq!(m["router"]["classes"], serde_json::json!(["code", "prose"]));
    let set = set.to_str().expect("utf-8");
    for prompt in ["def add(a, b):\n    return", "Dear friend, the garden"] {
        let out = tandem(&[
            "generate",
            "--prompt",
            prompt,
            "--max-tokens",
            "16",
            "--speculative",
            "--drafter",
            set,
        ]);
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("identical to plain"), "{err}");
    }
}

#[test]
fn bad_router_arguments_and_misused_sets_are_one_clear_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    let set = tmp.path().join("set");
    let out = train_router(&set, tmp.path(), "poetry");
    assert_one_line_error(&out, "--default poetry is not a route");
    let out = tandem(&[
        "train-router",
        "--route",
        "a=/nonexistent",
        "--route",
        "b=/nonexistent2",
        "--text",
        "a=/tmp",
        "--text",
        "b=/tmp",
        "--default",
        "a",
        "--out",
        "/tmp/x",
    ]);
    assert_one_line_error(&out, "is not a DSpark drafter folder");
    let shipped = drafter("gemma-3-270m-router");
    let out = tandem(&[
        "calibrate",
        "--drafter",
        &shipped,
        "--prompts",
        "/nonexistent.json",
    ]);
    assert_one_line_error(&out, "is a routed set of drafters; name one of them");
}

//! The OpenAI-compatible HTTP API driven by the official `openai` Python client: a real
//! `tandem up` process (every listener on port 0, the HTTP API's included; the shipped
//! drafter, speculation on) passes every check of tests/openai/check_openai.py (models,
//! completions and chat, streamed and not, stop, max_tokens, logprobs, seeds, n, the
//! extension fields, errors), and its greedy texts (completions, with speculation on and
//! off, and chat) equal what gRPC Generate (`tandem generate --server`) and plain
//! in-process decoding give. The client lives in the venv scripts/openai-venv.sh makes
//! ($TANDEM_OPENAI_VENV).

#[allow(dead_code)]
mod common;

use std::path::PathBuf;
use std::process::{Child, Output};

use common::{announced, start_up, stderr, stop_up, tandem, wait_healthy};

/// Prompts and token budgets of the greedy comparisons (small: the run stays short).
const GREEDY: [(&str, usize); 2] = [("The capital of France is", 16), ("def fibonacci(n):", 24)];

/// The python of the venv scripts/openai-venv.sh makes; fails clearly when it is missing.
fn venv_python() -> PathBuf {
    let venv = std::env::var_os("TANDEM_OPENAI_VENV").map_or_else(
        || {
            let home = std::env::var_os("HOME").expect("HOME");
            PathBuf::from(home).join(".cache/tandem/venv-openai")
        },
        PathBuf::from,
    );
    let python = venv.join("bin/python");
    assert!(
        python.is_file(),
        "no Python venv with the openai client at {}: run scripts/openai-venv.sh \
         (scripts/test does) or point TANDEM_OPENAI_VENV at one",
        venv.display()
    );
    python
}

/// Runs check_openai.py with `args` (the API's base URL first).
fn check_openai(args: &[&str]) -> Output {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai/check_openai.py");
    std::process::Command::new(venv_python())
        .arg(script)
        .args(args)
        .output()
        .expect("run check_openai.py")
}

/// The text `tandem generate` prints for `prompt` (greedy), through `--server url` or in
/// process (plain decoding) when `server` is `None`.
fn generate(server: Option<&str>, prompt: &str, max_tokens: usize) -> String {
    let max = max_tokens.to_string();
    let mut args = vec!["generate", "--prompt", prompt, "--max-tokens", &max];
    if let Some(url) = server {
        args.extend(["--server", url]);
    }
    let out = tandem(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Gemma 3's chat template around one user message, without the `<bos>` that
/// `tandem generate` prepends itself.
fn chat_prompt(user: &str) -> String {
    format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n")
}

/// A `tandem up` killed if the test fails before stopping it.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn the_openai_client_drives_the_http_api_and_greedy_text_equals_grpc_and_plain() {
    let python = venv_python();
    let (child, banner) = start_up("shipped", &[]);
    let mut up = Running(Some(child));
    let grpc = format!("http://{}", announced(&banner, "verifier on "));
    let http = announced(&banner, "HTTP on ");
    wait_healthy(&http);
    let base = format!("http://{http}/v1");
    eprintln!("{banner}\nclient: {}", python.display());

    let checks = check_openai(&[&base]);
    let report = String::from_utf8_lossy(&checks.stdout);
    eprintln!("{report}");
    assert!(
        checks.status.success(),
        "check_openai.py failed:\n{report}\n{}",
        stderr(&checks)
    );
    assert!(report.contains(" 0 failed"), "{report}");

    for (prompt, max_tokens) in GREEDY {
        let out = check_openai(&[&base, "--greedy", prompt, &max_tokens.to_string()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let http: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let text = |key: &str| http[key].as_str().expect("a text").to_string();
        let over_grpc = generate(Some(&grpc), prompt, max_tokens);
        assert!(!over_grpc.is_empty(), "{prompt:?}");
        assert_eq!(text("completion"), over_grpc, "HTTP vs gRPC, {prompt:?}");
        assert_eq!(text("completion_plain"), over_grpc, "{prompt:?}");
        let chat_grpc = generate(Some(&grpc), &chat_prompt(prompt), max_tokens);
        assert_eq!(text("chat"), chat_grpc, "HTTP chat vs gRPC, {prompt:?}");
        let plain = generate(None, prompt, max_tokens);
        assert_eq!(over_grpc, plain, "speculative gRPC vs plain, {prompt:?}");
    }
    stop_up(up.0.take().expect("running"));
}

//! End-to-end tests of the `tandem` binary on the real Gemma 3 270M (fetched by
//! scripts/fetch-models.sh): generation streams text and reports speed; bad input gives one
//! clear line and a non-zero exit, never a panic; the benches write their reports.

#[allow(dead_code)]
mod common;

use std::process::Output;

use common::{assert_one_line_error, stderr, tandem};

/// `tandem generate` of 12 tokens after "1, 2, 3," with `extra` flags: it must succeed and
/// continue the count; returns the run for further checks.
fn count_on(extra: &[&str]) -> Output {
    let mut args = vec!["generate", "--prompt", "1, 2, 3,", "--max-tokens", "12"];
    args.extend_from_slice(extra);
    let out = tandem(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout.clone()).expect("utf-8");
    assert!(
        text.starts_with(" 4, 5, 6,"),
        "unexpected continuation {text:?} with {extra:?}"
    );
    out
}

#[test]
fn generate_streams_greedy_text_and_speed() {
    let out = count_on(&[]);
    let err = stderr(&out);
    assert!(err.contains("decode") && err.contains("tok/s"), "{err}");
}

#[test]
fn capped_cpu_kernels_still_generate_and_bad_names_are_refused() {
    count_on(&["--max-cpu-kernels", "portable"]);
    // avx2 and avx-vnni are one family: the same int8 tokens whatever this CPU has.
    let int8 = |family: &str| {
        let out = tandem(&[
            "generate",
            "--prompt",
            "The history of the printing press",
            "--max-tokens",
            "32",
            "--precision",
            "int8",
            "--max-cpu-kernels",
            family,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    };
    assert_eq!(int8("avx2"), int8("avx-vnni"));
    let out = tandem(&["generate", "--prompt", "x", "--max-cpu-kernels", "avx512"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown CPU kernels \"avx512\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn speculative_generation_reports_acceptance_beside_plain() {
    let out = count_on(&["--speculative", "--gamma", "4"]);
    let err = stderr(&out);
    assert!(err.contains("mean acceptance length"), "{err}");
    assert!(
        err.contains("plain:") && err.contains("identical to plain"),
        "{err}"
    );
}

/// Runs `tandem bench <kind> <args> --json F`, which must succeed, and returns the JSON
/// report it wrote and its stdout.
fn bench_json(kind: &str, args: &[&str]) -> (serde_json::Value, String) {
    // One file per call: tests of one binary run at once, some of the same bench.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("tandem-{kind}-{}-{call}.json", std::process::id());
    let json = std::env::temp_dir().join(name);
    let mut all = vec!["bench", kind];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", json.to_str().expect("utf-8")]);
    let out = tandem(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("json");
    std::fs::remove_file(&json).ok();
    (report, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn bench_rpc_reports_the_network_overhead() {
    let (report, text) = bench_json("rpc", &["--max-tokens", "4", "--gamma", "2"]);
    assert_eq!(report["requests"], 8);
    assert!(report["grpc"]["rounds"].as_u64().expect("rounds") >= 8);
    assert!(report["overhead_share_of_round"].as_f64().is_some());
    assert!(text.contains("verifier-drafter overhead"), "{text}");
}

/// Two concurrent clients through a batched verifier in each mode: every request makes its
/// tokens, the levels are reported, the chart is drawn, and two clients shared steps.
#[test]
fn bench_load_reports_each_mode_and_concurrency() {
    let png = std::env::temp_dir().join(format!("tandem-load-{}.png", std::process::id()));
    let png_arg = png.to_str().expect("utf-8");
    let args = [
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--max-tokens",
        "8",
        "--gamma",
        "2",
    ];
    let mut all = args.to_vec();
    all.extend_from_slice(&["--png", png_arg]);
    let (report, text) = bench_json("load", &all);
    let levels = report["levels"].as_array().expect("levels");
    assert_eq!(levels.len(), 6, "{report}");
    for l in levels {
        assert_eq!(
            l["tokens"],
            8 * 2 * l["concurrency"].as_u64().expect("c"),
            "{l}"
        );
        assert!(l["aggregate_tok_s"].as_f64().expect("tok/s") > 0.0);
        assert!(
            l["ttft_p50_ms"].as_f64().expect("ttft") <= l["ttft_p99_ms"].as_f64().expect("p99")
        );
    }
    let plain2 = levels
        .iter()
        .find(|l| l["mode"] == "plain" && l["concurrency"] == 2)
        .expect("plain at 2");
    assert!(
        plain2["sessions_per_step"].as_f64().expect("sessions") > 1.0,
        "{plain2}"
    );
    assert!(text.contains("agg tok/s"), "{text}");
    assert!(std::fs::metadata(&png).expect("a chart").len() > 1000);
    std::fs::remove_file(&png).ok();
}

/// The drafter bench: every mode at every concurrency, each session's blocks answered;
/// batched drafting puts the blocks of several sessions in one step, drafting alone never.
#[test]
fn bench_drafter_reports_each_mode_and_concurrency() {
    let args = ["--sessions", "1,3", "--rounds", "4", "--context", "32"];
    let (report, text) = bench_json("drafter", &args);
    let points = report["points"].as_array().expect("points");
    assert_eq!(points.len(), 4, "{report}");
    for p in points {
        assert!(p["blocks_per_s"].as_f64().expect("blocks/s") > 0.0, "{p}");
        assert!(
            p["block_wait_p50_ms"].as_f64().expect("p50")
                <= p["block_wait_p99_ms"].as_f64().expect("p99")
        );
    }
    let at = |mode: &str| {
        let p = points
            .iter()
            .find(|p| p["mode"] == mode && p["sessions"] == 3)
            .expect("a point at 3 sessions");
        p["sessions_per_step"].as_f64().expect("sessions per step")
    };
    assert!(at("batched") > 1.0, "{report}");
    assert_eq!(at("alone"), 1.0, "{report}");
    assert!(text.contains("blocks/s"), "{text}");
}

/// A context whose snapshot rows exceed the drafter's 4 MiB message limit (600 rows of four
/// 640-wide taps, ~6 MB) reaches it in several messages, as a verifier sends it, and is
/// answered.
#[test]
fn bench_drafter_sends_a_long_context_in_several_messages() {
    let args = [
        "--sessions",
        "1",
        "--rounds",
        "2",
        "--context",
        "600",
        "--modes",
        "alone",
    ];
    let (report, text) = bench_json("drafter", &args);
    let points = report["points"].as_array().expect("points");
    assert_eq!(points.len(), 1, "{text}");
    assert!(
        points[0]["blocks_per_s"].as_f64().expect("blocks/s") > 0.0,
        "{text}"
    );
}

/// A short soak (the CI one; `docs/performance` has the long one): four sessions for 20
/// seconds with every behaviour and a drafter killed midway; nothing unexpected, nothing
/// lost, every gauge back at 0.
#[test]
fn bench_soak_survives_abuse_and_a_drafter_restart() {
    let args = [
        "--sessions",
        "4",
        "--seconds",
        "20",
        "--drafter",
        "random",
        "--max-tokens",
        "12",
        "--rss-limit-percent",
        "50",
    ];
    let (report, text) = bench_json("soak", &args);
    assert_eq!(report["unexpected_errors"], serde_json::json!({}), "{text}");
    assert_eq!(report["lost_generations"], 0, "{text}");
    assert_eq!(report["greedy_mismatches"], 0, "{text}");
    assert_eq!(report["failures"], serde_json::json!([]), "{text}");
    let gauges = report["gauges"].as_object().expect("gauges");
    assert_eq!(gauges.len(), 5, "{text}");
    assert!(gauges.values().all(|v| v == 0.0), "{text}");
    let outcomes = report["outcomes"].as_object().expect("outcomes");
    let seen = |b: &str, o: &str| outcomes[b][o].as_u64().unwrap_or(0) > 0;
    assert!(
        seen("greedy", "finished") && seen("sampled", "finished"),
        "{text}"
    );
    assert!(
        seen("slow_reader", "finished") && seen("stall", "slow_dropped"),
        "{text}"
    );
    assert!(seen("cancel", "cancelled_by_test"), "{text}");
    assert!(seen("bad_request", "bad_request_refused"), "{text}");
    assert!(outcomes.contains_key("deadline"), "{text}");
    let restart = &report["restart"];
    assert!(
        restart["restarted_at_s"].as_f64() > restart["killed_at_s"].as_f64(),
        "{text}"
    );
    assert!(text.contains("PASS"), "{text}");
}

#[test]
fn bench_target_reports_load_decode_and_block_costs() {
    let (report, text) = bench_json(
        "target",
        &[
            "--blocks",
            "1,3",
            "--repeats",
            "1",
            "--decode-tokens",
            "4",
            "--prompt-tokens",
            "8",
            "--context",
            "16",
            "--product-rows",
            "1,4",
        ],
    );
    let positive = |v: &serde_json::Value| v.as_f64().is_some_and(|x| x > 0.0 && x.is_finite());
    for key in [
        "load_s",
        "prefill_tok_s",
        "decode_tok_s",
        "decode_ms_per_token",
    ] {
        assert!(positive(&report[key]), "{key}: {}", report[key]);
    }
    let blocks = report["blocks"].as_array().expect("blocks");
    let sizes: Vec<_> = blocks.iter().map(|b| b["block"].as_u64()).collect();
    assert_eq!(sizes, [Some(1), Some(3)]);
    for b in blocks {
        for key in ["ms", "decode_steps", "greedy_ms", "greedy_decode_steps"] {
            assert!(positive(&b[key]), "{key}: {b}");
        }
    }
    assert!(
        text.contains("load") && text.contains("decode steps"),
        "{text}"
    );
    // Every weight matrix of the 18 layers (7 each) and the head, timed by storage type.
    let products = &report["products"];
    assert_eq!(products["rows"], serde_json::json!([1, 4]));
    let types = products["types"].as_array().expect("types");
    let matrices: u64 = types
        .iter()
        .map(|t| t["matrices"].as_u64().expect("n"))
        .sum();
    assert_eq!(matrices, 18 * 7 + 1, "{products}");
    for t in types {
        let ms = t["ms_per_forward"].as_array().expect("ms");
        assert!(ms.iter().all(positive), "{t}");
        assert_eq!(t["vs_one_row"][0], 1.0, "{t}");
    }
    assert!(text.contains("weight products per storage type"), "{text}");
}

/// Runs `tandem bench speculative` on one prompt (plus `extra` flags) and returns its JSON
/// report and the prompts it saved.
fn bench_speculative(extra: &[&str]) -> (serde_json::Value, Vec<Vec<u32>>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_string();
    let (prompts, json, png, saved) = (
        path("prompts.json"),
        path("bench.json"),
        path("bench.png"),
        path("saved.json"),
    );
    std::fs::write(&prompts, "[[2, 1018, 2, 3, 236764], [2, 818, 5279]]").expect("prompts");
    let mut args = vec![
        "bench",
        "speculative",
        "--prompts-file",
        &prompts,
        "--prompts",
        "1",
        "--max-tokens",
        "6",
        "--gammas",
        "1,2",
        "--json",
        &json,
        "--png",
        &png,
        "--save-prompts",
        &saved,
    ];
    args.extend_from_slice(extra);
    let out = tandem(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::metadata(&png).expect("png written").len() > 0);
    let again = path("again.png");
    let out_again = tandem(&["bench", "chart", "--json", &json, "--png", &again]);
    assert!(out_again.status.success(), "{}", stderr(&out_again));
    assert!(std::fs::metadata(&again).expect("chart redrawn").len() > 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("acceptance per position"), "{text}");
    let report =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("json");
    let saved =
        serde_json::from_str(&std::fs::read_to_string(&saved).expect("saved")).expect("ids");
    (report, saved)
}

/// Checks a bench report: greedy and sampled modes, each with one run per γ whose figures
/// are consistent.
fn check_report(report: &serde_json::Value, via: &str) {
    assert_eq!(report["via"], via);
    assert_eq!(report["prompts"], 1);
    let modes = report["modes"].as_array().expect("modes");
    assert_eq!(modes.len(), 2);
    assert_eq!(modes[0]["temperature"], 0.0);
    for m in modes {
        assert!(m["plain_tok_s"].as_f64().expect("plain") > 0.0);
        let runs = m["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), 2);
        for (run, gamma) in runs.iter().zip([1, 2]) {
            assert_eq!(run["gamma"], gamma);
            let tau = run["tau"].as_f64().expect("tau");
            assert!((1.0..=1.0 + gamma as f64).contains(&tau), "τ {tau}");
            let per_pos = run["acceptance_per_position"]
                .as_array()
                .expect("per position");
            assert_eq!(per_pos.len(), gamma);
            assert!(run["tok_s"].as_f64().expect("tok/s") > 0.0);
            assert!(run["verify_s"].as_f64().expect("verify") > 0.0);
            // Greedy speculation in process decodes what plain decoding does, both repeats.
            let identical = &run["identical_to_plain"];
            match via == "in-process" && m["temperature"] == 0.0 {
                true => assert_eq!(identical, &serde_json::json!([2, 2])),
                false => assert!(identical.is_null(), "{identical}"),
            }
        }
    }
}

/// `bench golden` on the CPU kernels: the first three cases agree with transformers to
/// their last token, plain and speculative; a fixture whose reference ids were altered
/// fails it with one clear line.
#[test]
fn bench_golden_holds_decoding_to_the_reference() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/gemma/tests/fixtures/gemma3_270m_transformers.json"
    );
    let (report, text) = bench_json("golden", &["--fixture", fixture, "--cases", "3"]);
    assert_eq!(report["passed"], true, "{text}");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3);
    for c in cases {
        for key in ["compared", "plain_agree", "speculative_agree"] {
            assert_eq!(c[key], 48, "{key}: {text}");
        }
        assert_eq!(c["speculative_equals_plain"], true);
    }
    let mut altered: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).expect("fixture")).expect("json");
    altered["cases"][0]["generated_ids"][5] = serde_json::json!(7);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("altered.json");
    std::fs::write(&path, altered.to_string()).expect("write");
    let path = path.to_str().expect("utf-8");
    let out = tandem(&["bench", "golden", "--fixture", path, "--cases", "1"]);
    assert_one_line_error(&out, "part from the reference");
}

#[test]
fn bench_speculative_runs_in_process() {
    let (report, saved) = bench_speculative(&[]);
    check_report(&report, "in-process");
    assert_eq!(saved, vec![vec![2, 1018, 2, 3, 236764]]);
}

#[test]
fn bench_speculative_runs_through_the_services() {
    let (report, _) = bench_speculative(&["--services"]);
    check_report(&report, "services");
}

#[test]
fn bench_ab_of_a_drafter_against_itself_finds_no_acceptance_difference() {
    let prompts = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../drafters/gemma-3-270m-dspark/held_out_prompts.json"
    );
    let (report, text) = bench_json(
        "ab",
        &[
            "--a",
            "shipped",
            "--b",
            "shipped",
            "--prompts-file",
            prompts,
            "--prompts",
            "2",
            "--max-tokens",
            "16",
        ],
    );
    // Greedy decoding is deterministic: the same drafter accepts the same tokens.
    let acc = &report["acceptance_pts"];
    for key in ["mean", "sd", "low", "high"] {
        assert_eq!(acc[key].as_f64(), Some(0.0), "{key}: {report}");
    }
    assert_eq!(acc["n"], 2);
    let t = &report["s_per_token"];
    assert!(t["low"].as_f64().expect("low") <= t["high"].as_f64().expect("high"));
    assert!(report["relative_speed"].as_f64().expect("speed") > 0.0);
    assert!(report["adopt"].is_boolean() && report["reason"].is_string());
    assert_eq!(report["a"]["acceptance_pct"], report["b"]["acceptance_pct"]);
    let pairs = report["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 2);
    for p in pairs {
        assert_eq!(p["a"]["accepted"], p["b"]["accepted"]);
        assert_eq!(p["a"]["tokens"], 15);
        assert!(p["b"]["drafted"].as_u64().expect("drafted") > 0);
    }
    assert!(text.contains("verdict: "), "{text}");
    assert_one_line_error(
        &tandem(&[
            "bench",
            "ab",
            "--a",
            "shipped",
            "--b",
            "/nonexistent",
            "--prompts-file",
            prompts,
        ]),
        "drafter /nonexistent",
    );
}

#[test]
fn sampling_is_reproducible_with_a_seed() {
    let args = [
        "generate",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "10",
        "--temperature",
        "0.9",
        "--top-k",
        "40",
        "--top-p",
        "0.95",
        "--seed",
        "7",
    ];
    let a = tandem(&args);
    let b = tandem(&args);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
    assert!(!a.stdout.is_empty());
}

#[test]
fn bad_input_is_one_clear_line() {
    assert_one_line_error(
        &tandem(&[
            "generate",
            "--prompt",
            "x",
            "--model",
            "/nonexistent/m.gguf",
        ]),
        "model not found",
    );
    assert_one_line_error(
        &tandem(&["generate", "--prompt", "x", "--temperature=-1"]),
        "temperature",
    );
    assert_one_line_error(
        &tandem(&[
            "bench",
            "speculative",
            "--prompts-file",
            "/nonexistent/prompts.json",
            "--top-p",
            "1.5",
        ]),
        "top_p",
    );
    assert_one_line_error(
        &tandem(&["generate", "--prompt", "x", "--top-p", "0"]),
        "top_p",
    );
    assert_one_line_error(
        &tandem(&["generate", "--prompt", "x", "--max-tokens", "0"]),
        "max-tokens",
    );
    assert_one_line_error(
        &tandem(&[
            "generate",
            "--prompt",
            "x",
            "--speculative",
            "--drafter",
            "/nonexistent",
        ]),
        "drafter",
    );
    if cfg!(not(feature = "cuda")) {
        assert_one_line_error(
            &tandem(&["generate", "--prompt", "x", "--device", "cuda"]),
            "opening CUDA device 0",
        );
        assert_one_line_error(
            &tandem(&[
                "train-drafter",
                "--corpus",
                "/tmp",
                "--device",
                "cuda:1",
                "--out",
                "/tmp/x",
            ]),
            "opening CUDA device 1",
        );
    }
    let tmp = std::env::temp_dir().join(format!("tandem-cli-bad-{}.gguf", std::process::id()));
    std::fs::write(&tmp, b"not a model").expect("write");
    let out = tandem(&[
        "generate",
        "--prompt",
        "x",
        "--model",
        tmp.to_str().expect("utf-8"),
    ]);
    assert_one_line_error(&out, "not a readable GGUF");
    let png = tmp.with_extension("png");
    let (tmp_s, png_s) = (tmp.to_str().expect("utf-8"), png.to_str().expect("utf-8"));
    assert_one_line_error(
        &tandem(&["bench", "chart", "--json", tmp_s, "--png", png_s]),
        "not a `tandem bench speculative` report",
    );
    std::fs::remove_file(&tmp).ok();
    assert!(!png.exists(), "no chart from a bad report");
    assert_one_line_error(
        &tandem(&[
            "generate",
            "--prompt",
            "x",
            "--model-sha256",
            &"0".repeat(64),
        ]),
        "checksum mismatch",
    );
}

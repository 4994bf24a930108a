//! `tandem calibrate` end to end on the real Gemma 3 270M and a copy of the shipped drafter:
//! it fits on half of the calibration prompts, lowers the expected calibration error of the
//! other half, saves the calibration beside the drafter (named in its manifest) and draws
//! the reliability diagram; the drafter then drafts with it, and a calibration of another
//! version is refused with one clear line. The same for a Gemma 4 assistant on the tiny
//! random checkpoints of the transformers goldens: its calibration file is written beside
//! it and the held-out error falls.

#[allow(dead_code)]
mod common;

use std::path::Path;

use common::{assert_one_line_error, stderr, tandem};

/// Copies the shipped drafter's files into `to`.
fn copy_shipped(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/gemma-3-270m-dspark");
    for e in std::fs::read_dir(&from).expect("shipped drafter") {
        let e = e.expect("entry");
        if e.path().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
    std::fs::remove_file(to.join("calibration.json")).ok();
}

/// The held-out expected calibration error of the model's tokens in `report` before and
/// after, weighted by each position's held-out count, per regime.
fn weighted_ece(report: &serde_json::Value) -> Vec<(f64, f64, f64)> {
    let sources = report["sources"].as_array().expect("sources");
    sources
        .iter()
        .filter(|s| s["source"] == "model")
        .map(|s| {
            let (mut before, mut after, mut n) = (0.0, 0.0, 0.0);
            for p in s["positions"].as_array().expect("positions") {
                let w = p["held_out"].as_f64().expect("count");
                before += w * p["ece_before"].as_f64().expect("ece");
                after += w * p["ece_after"].as_f64().expect("ece");
                n += w;
            }
            (s["temperature"].as_f64().expect("T"), before / n, after / n)
        })
        .collect()
}

/// How far a sampled regime's held-out error may rise by chance. At T = 0.7, 32 prompts of
/// 64 tokens (500–670 held-out drafted tokens) moved it by −0.054 to +0.027 over seeds 0–6
/// with one build and −0.028 to +0.012 with the next (draws from the same distributions by
/// other uniforms); greedy regimes are deterministic and must fall.
const SAMPLED_NOISE: f64 = 0.03;

/// Fails unless the report at `json` has two regimes and the held-out error of the model's
/// tokens fell in the greedy one and rose by no more than [`SAMPLED_NOISE`] in the sampled
/// one.
fn assert_held_out_ece_falls(json: &Path) {
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).expect("report")).expect("json");
    let regimes = weighted_ece(&report);
    assert_eq!(regimes.len(), 2, "{report}");
    for (t, before, after) in regimes {
        let slack = if t > 0.0 { SAMPLED_NOISE } else { 0.0 };
        assert!(
            after < before + slack,
            "T {t}: held-out ECE {before} → {after}"
        );
    }
}

#[test]
fn calibration_lowers_held_out_error_and_is_used_by_the_drafter() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("drafter");
    std::fs::create_dir(&dir).expect("dir");
    copy_shipped(&dir);
    let (d, json, png) = (
        dir.to_str().expect("utf-8"),
        tmp.path().join("report.json"),
        tmp.path().join("reliability.png"),
    );
    let prompts = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../drafters/eval/calibration.json"
    );
    let out = tandem(&[
        "calibrate",
        "--drafter",
        d,
        "--prompts",
        prompts,
        // Fewer rounds leave the sign of the held-out change to chance: at 16 prompts of
        // 48 tokens (about 200 held-out drafted tokens a regime) the error at T = 0.7 rose
        // for two seeds of four, and the greedy one rose at 16 of 64; at 32 of 64 the
        // greedy one falls and the sampled one stays within `SAMPLED_NOISE`.
        "--prompts-per-file",
        "32",
        "--max-tokens",
        "64",
        "--temperatures",
        "0,0.7",
        "--json",
        json.to_str().expect("utf-8"),
        "--png",
        png.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_held_out_ece_falls(&json);
    let manifest = std::fs::read_to_string(dir.join("dspark.json")).expect("manifest");
    let manifest: serde_json::Value = serde_json::from_str(&manifest).expect("json");
    assert_eq!(manifest["calibration"]["file"], "calibration.json");
    assert!(dir.join("calibration.json").is_file());
    let png_bytes = std::fs::read(&png).expect("png");
    assert!(png_bytes.starts_with(b"\x89PNG"), "not a PNG");
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--prompt",
            "User: What is a good name for a cat?\nAssistant:",
            "--max-tokens",
            "24",
            "--speculative",
            "--adaptive-gamma",
            "--drafter",
            d,
        ];
        args.extend_from_slice(extra);
        tandem(&args)
    };
    for extra in [&["--temperature", "0.7", "--seed", "3"][..], &[][..]] {
        let out = generate(extra);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("mean acceptance length"),
            "{}",
            stderr(&out)
        );
    }
    let cal = std::fs::read_to_string(dir.join("calibration.json")).expect("calibration");
    let stale = cal.replacen("\"version\": 1", "\"version\": 99", 1);
    std::fs::write(dir.join("calibration.json"), stale).expect("write");
    assert_one_line_error(&generate(&[]), "run tandem calibrate again");
}

/// The tiny Gemma 4 checkpoints of the transformers goldens.
fn gemma4_fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/gemma/tests/fixtures/gemma4")
}

#[test]
fn an_assistant_is_calibrated_beside_its_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("assistant");
    std::fs::create_dir(&dir).expect("dir");
    for f in ["config.json", "model.safetensors"] {
        let from = gemma4_fixtures().join("assistant_dense").join(f);
        std::fs::copy(from, dir.join(f)).expect("copy");
    }
    let mut state = 7u64;
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|i| {
            let mut ids = vec![2u32];
            ids.extend((0..4 + i % 5).map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                3 + (state >> 33) as u32 % 250
            }));
            ids
        })
        .collect();
    let prompts_file = tmp.path().join("prompts.json");
    std::fs::write(
        &prompts_file,
        serde_json::to_string(&prompts).expect("json"),
    )
    .expect("write");
    let (json, target) = (
        tmp.path().join("report.json"),
        gemma4_fixtures().join("target_ple"),
    );
    let out = tandem(&[
        "calibrate",
        "--drafter",
        dir.to_str().expect("utf-8"),
        "--model",
        target.to_str().expect("utf-8"),
        "--prompts",
        prompts_file.to_str().expect("utf-8"),
        "--prompts-per-file",
        "12",
        "--max-tokens",
        "40",
        "--temperatures",
        "0,1",
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_held_out_ece_falls(&json);
    let cal = std::fs::read_to_string(dir.join("calibration.json")).expect("calibration");
    let cal: serde_json::Value = serde_json::from_str(&cal).expect("json");
    assert_eq!(cal["regimes"].as_array().map(Vec::len), Some(2), "{cal}");
}

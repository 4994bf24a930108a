//! Golden test of the Gemma 4 assistant's per-step distributions against transformers 5.24
//! (`fixtures/gemma4/golden_dists.json`, made by scripts/golden/gemma4_transformers.py from
//! the checkpoints of `golden.json`): for each assistant (centroid head, dense head, tied
//! candidates) and anchor, the head's full logits at every step fed the golden greedy
//! drafts, and the distribution `tandem_core::distribution` makes of them under each
//! sampling setting against the one transformers' warpers make (same ids, probabilities
//! within 1e-4; the measured worst is printed).

mod common;

use std::collections::HashMap;

use common::gemma4::{anchor_rows, fixtures, prefill};
use serde::Deserialize;
use tandem_core::{distribution, SamplingParams, SparseDist};
use tandem_gemma::gemma4::{Gemma4, Gemma4Assistant};
use tandem_testkit::max_abs_diff;

const TOL: f32 = 1e-4;

#[derive(Deserialize)]
struct Golden {
    targets: HashMap<String, Target>,
}

#[derive(Deserialize)]
struct Target {
    prompt_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Dists {
    settings: Vec<Setting>,
    assistants: HashMap<String, Vec<AnchorCase>>,
}

#[derive(Deserialize)]
struct Setting {
    temperature: f32,
    top_k: Option<usize>,
    top_p: f32,
}

#[derive(Deserialize)]
struct AnchorCase {
    anchor: usize,
    tokens: Vec<u32>,
    /// Per step, every id's logit.
    logits: Vec<Vec<f32>>,
    /// Per setting, per step.
    dists: Vec<Vec<SparseDist>>,
}

fn read<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let text = std::fs::read_to_string(fixtures().join(name)).expect(name);
    serde_json::from_str(&text).expect(name)
}

/// Our logits of every step of both anchors, drafted in one batch, each row fed its golden
/// greedy tokens.
fn teacher_forced(name: &str, prompt: &[u32], cases: &[AnchorCase]) -> Vec<Vec<Vec<f32>>> {
    let model = Gemma4::load(&fixtures().join("target_ple")).expect("load target");
    let (cache, _, hidden) = prefill(&model, prompt);
    let anchors = cases.iter().map(|c| c.anchor);
    let rows = anchor_rows(prompt, &hidden, anchors, cache.donors().expect("donors"));
    let assistant = Gemma4Assistant::load(&fixtures().join(name)).expect("load assistant");
    let mut seen: Vec<Vec<Vec<f32>>> = vec![Vec::new(); cases.len()];
    let steps = cases[0].tokens.len();
    assistant
        .draft_with(&model.embedding(), &rows, steps, |r, logits| {
            seen[r].push(logits.to_vec());
            cases[r].tokens[seen[r].len() - 1]
        })
        .expect("draft");
    seen
}

/// The largest probability difference of two distributions over the same ids.
fn dist_diff(ours: &SparseDist, reference: &SparseDist, what: &str) -> f32 {
    let sorted = |d: &SparseDist| {
        let mut ids = d.ids.clone();
        ids.sort_unstable();
        ids
    };
    assert_eq!(sorted(ours), sorted(reference), "{what}: ids differ");
    let total: f32 = ours.probs.iter().sum();
    assert!((total - 1.0).abs() < 1e-5, "{what}: total {total}");
    reference
        .ids
        .iter()
        .zip(&reference.probs)
        .map(|(id, p)| (ours.prob(*id) - p).abs())
        .fold(0.0, f32::max)
}

#[test]
fn assistant_distributions_match_transformers() {
    let prompt = read::<Golden>("golden.json").targets["target_ple"]
        .prompt_ids
        .clone();
    let golden: Dists = read("golden_dists.json");
    for name in ["assistant_centroids", "assistant_dense", "assistant_tie"] {
        let cases = &golden.assistants[name];
        let ours = teacher_forced(name, &prompt, cases);
        let mut dl = 0f32;
        let mut dp = vec![0f32; golden.settings.len()];
        for (case, logits) in cases.iter().zip(&ours) {
            assert_eq!(logits.len(), case.logits.len());
            for (step, row) in logits.iter().enumerate() {
                dl = dl.max(max_abs_diff(row, &case.logits[step]));
                for (s, setting) in golden.settings.iter().enumerate() {
                    let params = SamplingParams {
                        temperature: setting.temperature,
                        top_k: setting.top_k,
                        top_p: setting.top_p,
                        seed: 0,
                    };
                    let what = format!("{name} anchor {} step {step} setting {s}", case.anchor);
                    let d = dist_diff(&distribution(row, &params), &case.dists[s][step], &what);
                    dp[s] = dp[s].max(d);
                }
            }
        }
        let per: Vec<String> = dp.iter().map(|d| format!("{d:.2e}")).collect();
        eprintln!(
            "{name}: max |logit diff| {dl:.2e}, max |prob diff| per setting {}",
            per.join(" ")
        );
        assert!(dl < TOL, "{name}: logits {dl}");
        assert!(dp.iter().all(|d| *d < TOL), "{name}: probabilities {dp:?}");
    }
}

/// The centroid head's row is transformers': 64 candidates, and the other 192 ids all at
/// the candidates' lowest logit minus 1, so that they keep some probability at
/// temperature 1.
#[test]
fn centroid_head_fills_the_other_ids_below_the_candidates() {
    let prompt = read::<Golden>("golden.json").targets["target_ple"]
        .prompt_ids
        .clone();
    let golden: Dists = read("golden_dists.json");
    let cases = &golden.assistants["assistant_centroids"];
    for row in teacher_forced("assistant_centroids", &prompt, cases).concat() {
        let fill = row.iter().copied().fold(f32::INFINITY, f32::min);
        let filled = row.iter().filter(|l| **l == fill).count();
        let lowest = row
            .iter()
            .copied()
            .filter(|l| *l != fill)
            .fold(f32::INFINITY, f32::min);
        assert_eq!(filled, 192);
        assert_eq!(fill, (f64::from(lowest) - 1.0) as f32);
        let full = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let other = row.iter().position(|l| *l == fill).expect("a filled id") as u32;
        assert!(distribution(&row, &full).prob(other) > 0.0);
    }
}

//! Golden tests of Gemma 4 text and the Gemma 4 assistant drafter against transformers 5.24
//! on tiny random checkpoints (`fixtures/gemma4/`, made and pinned by
//! scripts/golden/gemma4_transformers.py), plus load-failure tests.
//!
//! Tolerances: logits, hidden states and drafted-token logits within 1e-4 absolute (f32 on
//! both sides; the measured worst is printed); token ids exactly.

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use common::gemma4::{anchor_rows, fixtures, prefill, rows};
use serde::Deserialize;
use tandem_gemma::gemma4::{DonorKv, DraftRow, Gemma4, Gemma4Assistant};
use tandem_gemma::{GemmaError, LogitsMode};
use tandem_testkit::max_abs_diff;

const TOL: f32 = 1e-4;

#[derive(Deserialize)]
struct Golden {
    targets: HashMap<String, TargetCase>,
    assistants: HashMap<String, AssistantCase>,
}

#[derive(Deserialize)]
struct TargetCase {
    prompt_ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
    last_hidden: Vec<Vec<f32>>,
    greedy_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct AssistantCase {
    target: String,
    tied_ids: Option<Vec<u32>>,
    drafts: Vec<DraftCase>,
}

#[derive(Deserialize)]
struct DraftCase {
    anchor: usize,
    tokens: Vec<u32>,
    winning_logits: Vec<f32>,
    next_hidden: Vec<Vec<f32>>,
}

fn golden() -> Golden {
    let text = std::fs::read_to_string(fixtures().join("golden.json")).expect("golden.json");
    serde_json::from_str(&text).expect("parse golden.json")
}

fn target(name: &str) -> Gemma4 {
    Gemma4::load(&fixtures().join(name)).expect("load target")
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn target_logits_and_hidden_match_transformers() {
    let golden = golden();
    for name in ["target_ple", "target_keqv"] {
        let case = &golden.targets[name];
        let (_, logits, hidden) = prefill(&target(name), &case.prompt_ids);
        let dl = max_abs_diff(&logits.concat(), &case.logits.concat());
        let dh = max_abs_diff(&hidden.concat(), &case.last_hidden.concat());
        eprintln!("{name}: max |logit diff| {dl:.2e}, max |hidden diff| {dh:.2e}");
        assert!(dl < TOL && dh < TOL, "{name}: logits {dl}, hidden {dh}");
    }
}

#[test]
fn target_greedy_decoding_with_the_cache_matches_transformers() {
    let golden = golden();
    for name in ["target_ple", "target_keqv"] {
        let (model, case) = (target(name), &golden.targets[name]);
        let (mut cache, logits, _) = prefill(&model, &case.prompt_ids);
        let mut next = argmax(&logits[logits.len() - 1]);
        let mut ours = vec![next];
        while ours.len() < case.greedy_ids.len() {
            let pos = cache.len();
            let out = model
                .forward(&[next], pos, &mut cache, LogitsMode::Last)
                .expect("decode");
            next = argmax(&rows(out.logits.as_ref().expect("logits"))[0]);
            ours.push(next);
        }
        assert_eq!(ours, case.greedy_ids, "{name}");
    }
}

/// A block's logits equal one-token forwards bit for bit, and a rolled-back cache
/// recomputes the same positions bit for bit.
#[test]
fn block_equals_single_tokens_and_rollback_is_exact() {
    let golden = golden();
    let prompt = &golden.targets["target_ple"].prompt_ids;
    let model = target("target_ple");
    let (mut cache, block, _) = prefill(&model, prompt);
    let mut single = model.new_cache(64);
    for (i, t) in prompt.iter().enumerate() {
        let out = model
            .forward(&[*t], i, &mut single, LogitsMode::Last)
            .expect("single");
        let row = &rows(out.logits.as_ref().expect("logits"))[0];
        assert!(
            row.iter()
                .zip(&block[i])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "position {i}"
        );
    }
    cache.truncate(5).expect("truncate");
    let out = model
        .forward(&prompt[5..], 5, &mut cache, LogitsMode::All)
        .expect("after rollback");
    assert_eq!(
        rows(out.logits.as_ref().expect("logits")),
        block[5..].to_vec()
    );
    assert!(
        cache.truncate(13).is_err(),
        "truncate past the end must fail"
    );
    assert!(model
        .forward(&[1], 3, &mut cache, LogitsMode::None)
        .is_err());
    assert!(model
        .forward(&[999], 12, &mut cache, LogitsMode::None)
        .is_err());
    assert_eq!(cache.len(), 12, "failed forwards leave the cache alone");
}

/// Both anchors of a fixture drafted in one batch (per-row positions), from our own target
/// forward's donors and hidden states.
fn check_assistant(name: &str, golden: &Golden) -> Vec<Vec<u32>> {
    let case = &golden.assistants[name];
    let model = target(&case.target);
    let prompt = &golden.targets[&case.target].prompt_ids;
    let (cache, _, hidden) = prefill(&model, prompt);
    let assistant = Gemma4Assistant::load(&fixtures().join(name)).expect("load assistant");
    let anchors = case.drafts.iter().map(|d| d.anchor);
    let draft_rows = anchor_rows(prompt, &hidden, anchors, cache.donors().expect("donors"));
    let steps = case.drafts[0].tokens.len();
    let drafts = assistant
        .draft(&model.embedding(), &draft_rows, steps)
        .expect("draft");
    let (mut dl, mut dh) = (0f32, 0f32);
    for (ours, reference) in drafts.iter().zip(&case.drafts) {
        assert_eq!(
            ours.tokens, reference.tokens,
            "{name} anchor {}",
            reference.anchor
        );
        dl = dl.max(max_abs_diff(&ours.logits, &reference.winning_logits));
        dh = dh.max(max_abs_diff(
            &ours.next_hidden.concat(),
            &reference.next_hidden.concat(),
        ));
    }
    eprintln!("{name}: max |logit diff| {dl:.2e}, max |next hidden diff| {dh:.2e}");
    assert!(dl < TOL && dh < TOL, "{name}: logits {dl}, hidden {dh}");
    drafts.into_iter().map(|d| d.tokens).collect()
}

#[test]
fn assistant_with_centroid_head_matches_transformers() {
    let golden = golden();
    check_assistant("assistant_centroids", &golden);
    let a = Gemma4Assistant::load(&fixtures().join("assistant_centroids")).expect("load");
    assert!(a.uses_centroids());
}

#[test]
fn assistant_with_dense_head_matches_transformers() {
    let golden = golden();
    check_assistant("assistant_dense", &golden);
    let a = Gemma4Assistant::load(&fixtures().join("assistant_dense")).expect("load");
    assert!(!a.uses_centroids());
}

/// Two candidates with identical head rows: the lower id wins, as transformers' argmax over
/// the scattered vocabulary row picks it.
#[test]
fn assistant_centroid_tie_goes_to_the_lowest_id() {
    let golden = golden();
    let tied = golden.assistants["assistant_tie"]
        .tied_ids
        .clone()
        .expect("tied ids");
    assert!(tied[0] < tied[1]);
    let drafts = check_assistant("assistant_tie", &golden);
    assert_eq!(drafts[0][0], tied[0]);
}

#[test]
fn assistant_rejects_donors_that_do_not_fit() {
    let golden = golden();
    let prompt = &golden.targets["target_ple"].prompt_ids;
    let model = target("target_ple");
    let (mut cache, _, hidden) = prefill(&model, prompt);
    cache.truncate(4).expect("truncate");
    let assistant = Gemma4Assistant::load(&fixtures().join("assistant_dense")).expect("load");
    let row = DraftRow {
        token: prompt[6],
        hidden: &hidden[6],
        position: 6,
        donors: cache.donors().expect("donors"),
    };
    let err = assistant
        .draft(&model.embedding(), &[row], 1)
        .expect_err("donors hold 4 positions, position 6 needs 6");
    assert!(err.to_string().contains("holds 4 positions"), "{err}");
    let (cache, _, _) = prefill(&model, prompt);
    let mut donors = cache.donors().expect("donors");
    // The same floats read as heads of 8: not the assistant's sliding head width of 16.
    donors.sliding = DonorKv {
        kv_heads: 2,
        head_dim: 8,
        ..donors.sliding
    };
    let row = DraftRow { donors, ..row };
    let err = assistant
        .draft(&model.embedding(), &[row], 1)
        .expect_err("donor geometry differs");
    assert!(err.to_string().contains("key/value heads"), "{err}");
}

/// A copy of fixture `name` in a temporary directory, its tensors edited by `edit` and its
/// config by `config`.
fn edited(
    name: &str,
    edit: impl FnOnce(&mut HashMap<String, Tensor>),
    config: impl FnOnce(&mut serde_json::Value),
) -> tempfile::TempDir {
    let src = fixtures().join(name);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).expect("load");
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).expect("save");
    let text = std::fs::read_to_string(src.join("config.json")).expect("config");
    let mut value: serde_json::Value = serde_json::from_str(&text).expect("json");
    config(&mut value);
    std::fs::write(dir.path().join("config.json"), value.to_string()).expect("write");
    dir
}

fn load_both(dir: &Path, assistant: bool) -> Result<(), GemmaError> {
    match assistant {
        true => Gemma4Assistant::load(dir).map(|_| ()),
        false => Gemma4::load(dir).map(|_| ()),
    }
}

#[test]
fn missing_tensor_is_a_clear_error() {
    for (name, tensor, assistant) in [
        (
            "target_ple",
            "model.layers.4.per_layer_input_gate.weight",
            false,
        ),
        (
            "target_keqv",
            "model.layers.1.self_attn.v_proj.weight",
            false,
        ),
        (
            "assistant_centroids",
            "masked_embedding.token_ordering",
            true,
        ),
        ("assistant_dense", "post_projection.weight", true),
    ] {
        let dir = edited(name, |t| drop(t.remove(tensor)), |_| ());
        let err = load_both(dir.path(), assistant).expect_err("missing tensor");
        assert!(
            matches!(&err, GemmaError::MissingTensor(t) if t == tensor),
            "{name}: {err}"
        );
    }
}

#[test]
fn wrong_shape_is_a_clear_error() {
    let zeros = |shape: &[usize]| Tensor::zeros(shape, candle_core::DType::F32, &Device::Cpu);
    for (name, tensor, shape, assistant) in [
        (
            "target_ple",
            "model.layers.2.self_attn.k_proj.weight",
            [16, 64],
            false,
        ),
        (
            "assistant_centroids",
            "masked_embedding.centroids.weight",
            [8, 32],
            true,
        ),
    ] {
        let dir = edited(
            name,
            |t| drop(t.insert(tensor.into(), zeros(&shape).expect("zeros"))),
            |_| (),
        );
        let err = load_both(dir.path(), assistant).expect_err("wrong shape");
        assert!(
            matches!(&err, GemmaError::ShapeMismatch { tensor: t, actual, .. }
                if t == tensor && actual == &shape),
            "{name}: {err}"
        );
    }
}

/// A fixture, whether it is an assistant, a config change, and a phrase the error must hold.
type ConfigCase = (&'static str, bool, fn(&mut serde_json::Value), &'static str);

#[test]
fn wrong_config_is_a_clear_error() {
    let cases: [ConfigCase; 4] = [
        (
            "target_ple",
            false,
            |c| c["layer_types"][5] = "global".into(),
            "unknown layer type",
        ),
        (
            "target_ple",
            false,
            |c| c["num_kv_shared_layers"] = 5.into(),
            "no earlier layer",
        ),
        (
            "assistant_centroids",
            true,
            |c| c["num_centroids"] = 15.into(),
            "not a multiple",
        ),
        (
            "assistant_dense",
            true,
            |c| c["text_config"]["num_kv_shared_layers"] = 1.into(),
            "must read shared",
        ),
    ];
    for (name, assistant, change, expected) in cases {
        let dir = edited(name, |_| (), change);
        let err = load_both(dir.path(), assistant).expect_err("bad config");
        assert!(err.to_string().contains(expected), "{name}: {err}");
    }
}

#[test]
fn token_ordering_must_be_a_permutation() {
    let dir = edited(
        "assistant_centroids",
        |t| {
            let ids: Vec<i64> = (0..256).map(|i| i / 2).collect();
            t.insert(
                "masked_embedding.token_ordering".into(),
                Tensor::new(ids, &Device::Cpu).expect("ids"),
            );
        },
        |_| (),
    );
    let err = load_both(dir.path(), true).expect_err("duplicate ids");
    assert!(err.to_string().contains("not a permutation"), "{err}");
}

//! Checkpoints and configs: bit-exact save/load (single file and sharded), reproducible
//! initialisation, rejection of another target's drafter and of invalid configs, moving
//! to another draft vocabulary and growing a trained drafter.

mod common;

use common::*;
use tandem_core::{Sampler, SamplingParams};
use tandem_dspark::{
    check_manifest, index_shards, load_calibration, DraftRequest, Dspark, DsparkConfig,
    DsparkError, Growth, SaveOptions, TargetDims, MANIFEST,
};
use tandem_testkit::{max_abs_diff, Lcg};

fn drafted(model: &Dspark, head: &tandem_gemma::TargetHead) -> Vec<u32> {
    let drafter = model.drafter(head).expect("drafter");
    let mut cache = drafter.new_cache();
    let rows = taps(&mut Lcg::new(3), 6, model.row_width());
    drafter.extend(&mut cache, &rows).expect("extend");
    let mut s = Sampler::new(SamplingParams::default()).expect("sampler");
    let req = DraftRequest {
        anchor: 7,
        gamma: 4,
    };
    drafter.draft(&cache, &req, &mut s).expect("draft").tokens
}

#[test]
fn save_load_round_trip_is_bit_exact() {
    let head = tiny_head(1);
    let cfg = DsparkConfig {
        draft_vocab: Some(vec![5, 1, 60, 33, 2]),
        ..tiny_config()
    };
    let model = busy_drafter(cfg, &head, 2);
    let tmp = tempfile::tempdir().expect("tempdir");
    let one = tmp.path().join("one");
    model.save(&one).expect("save");
    assert!(one.join("model.safetensors").is_file() && one.join(MANIFEST).is_file());
    let sharded = tmp.path().join("sharded");
    let opts = SaveOptions { shard_bytes: 2048 };
    model.save_with(&sharded, &opts).expect("save sharded");
    let shards = std::fs::read_dir(&sharded)
        .expect("dir")
        .filter(|e| {
            let name = e.as_ref().expect("entry").file_name();
            name.to_string_lossy().starts_with("model-")
        })
        .count();
    assert!(shards > 2, "{shards} shards");
    assert!(sharded.join("model.safetensors.index.json").is_file());
    for dir in [&one, &sharded] {
        let loaded = Dspark::load(dir, &head).expect("load");
        assert_eq!(param_bits(&loaded), param_bits(&model));
        assert_eq!(loaded.config(), model.config());
        assert_eq!(loaded.vocab(), model.vocab());
        assert_eq!(drafted(&loaded, &head), drafted(&model, &head));
    }
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(one.join(MANIFEST)).expect("read"))
            .expect("json");
    assert_eq!(manifest["kind"], "dspark-drafter");
    assert_eq!(manifest["variant"], "dflash");
    assert_eq!(manifest["target"]["architecture"], "gemma3");
    assert_eq!(manifest["config"]["draft_vocab"][2], 60);
}

#[test]
fn initialisation_is_seeded_and_follows_the_paper() {
    let head = tiny_head(1);
    let a = Dspark::init(tiny_config(), &head, 5).expect("init");
    let b = Dspark::init(tiny_config(), &head, 5).expect("init");
    let c = Dspark::init(tiny_config(), &head, 6).expect("init");
    assert_eq!(param_bits(&a), param_bits(&b));
    assert_ne!(param_bits(&a), param_bits(&c));
    for (name, bits) in param_bits(&a) {
        let vals: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
        if name.ends_with("norm") {
            assert!(vals.iter().all(|v| *v == 1.0), "{name}");
        } else if ["markov.w2", "conf.w", "conf.b"].contains(&name.as_str()) {
            assert!(vals.iter().all(|v| *v == 0.0), "{name}");
        } else {
            let n = vals.len() as f32;
            let std = (vals.iter().map(|v| v * v).sum::<f32>() / n).sqrt();
            assert!(
                vals.len() < 64 || (std - 0.02).abs() < 0.005,
                "{name}: std {std}"
            );
        }
    }
}

#[test]
fn another_targets_drafter_is_rejected() {
    let head = tiny_head(1);
    let other = tiny_head(2);
    let model = Dspark::init(tiny_config(), &head, 1).expect("init");
    let tmp = tempfile::tempdir().expect("tempdir");
    model.save(tmp.path()).expect("save");
    let err = Dspark::load(tmp.path(), &other).err().expect("mismatch");
    let msg = err.to_string();
    assert!(matches!(err, DsparkError::TargetMismatch { .. }), "{msg}");
    let (want, found) = (head.identity().expect("id"), other.identity().expect("id"));
    assert!(msg.contains(&want.embedding_hash) && msg.contains(&found.embedding_hash));
    assert!(matches!(
        model.drafter(&other),
        Err(DsparkError::TargetMismatch { .. })
    ));
}

#[test]
fn an_index_or_manifest_cannot_name_files_outside_the_folder() {
    let index =
        |shard: &str| format!(r#"{{"weight_map": {{"W_c": "{shard}", "x": "b.safetensors"}}}}"#);
    assert_eq!(
        index_shards(&index("a.safetensors")).expect("plain names"),
        vec!["a.safetensors", "b.safetensors"]
    );
    for shard in [
        "../secret",
        "/etc/passwd",
        "sub/a.safetensors",
        "..",
        ".",
        "",
    ] {
        let e = index_shards(&index(shard)).expect_err("refused");
        assert!(e.to_string().contains("not a file name"), "{shard}: {e}");
    }
    let head = tiny_head(1);
    let model = Dspark::init(tiny_config(), &head, 1).expect("init");
    let tmp = tempfile::tempdir().expect("tempdir");
    model.save(tmp.path()).expect("save");
    let path = tmp.path().join(MANIFEST);
    let text = std::fs::read_to_string(&path).expect("manifest");
    let dims = TargetDims::of(&head);
    assert_eq!(check_manifest(&text, &dims).expect("valid"), tiny_config());
    let mut m: serde_json::Value = serde_json::from_str(&text).expect("json");
    m["calibration"] = serde_json::json!({"file": "../calibration.json", "version": 1});
    std::fs::write(&path, m.to_string()).expect("write");
    let e = load_calibration(tmp.path()).expect_err("refused");
    assert!(e.to_string().contains("not a file name"), "{e}");
}

#[test]
fn invalid_configs_are_rejected() {
    let head = tiny_head(1);
    let base = tiny_config();
    let cases: Vec<(DsparkConfig, &str)> = vec![
        (
            DsparkConfig {
                d_draft: 18,
                ..base.clone()
            },
            "not divisible by n_heads",
        ),
        (
            DsparkConfig {
                tap_layers: vec![1, LAYERS + 1],
                ..base.clone()
            },
            "tap layer 5 is out of range",
        ),
        (
            DsparkConfig {
                tap_layers: vec![],
                ..base.clone()
            },
            "tap_layers is empty",
        ),
        (
            DsparkConfig {
                draft_vocab: Some(vec![1, 64]),
                ..base.clone()
            },
            "id 64 is outside",
        ),
        (
            DsparkConfig {
                draft_vocab: Some(vec![3, 4, 3]),
                ..base.clone()
            },
            "id 3 appears twice",
        ),
        (
            DsparkConfig {
                draft_vocab: Some(vec![]),
                ..base.clone()
            },
            "vocabulary is empty",
        ),
        (
            DsparkConfig {
                n_layers: 0,
                ..base.clone()
            },
            "n_layers must be at least 1",
        ),
        (
            DsparkConfig {
                markov_rank: 0,
                ..base.clone()
            },
            "markov_rank must be at least 1",
        ),
        (
            DsparkConfig {
                d_draft: 0,
                ..base.clone()
            },
            "d_draft must be at least 1",
        ),
        (
            DsparkConfig {
                gamma: 1,
                ..base.clone()
            },
            "gamma must be at least 2",
        ),
    ];
    for (cfg, want) in cases {
        match Dspark::init(cfg, &head, 0) {
            Err(DsparkError::Config(msg)) => assert!(msg.contains(want), "{msg} vs {want}"),
            Err(other) => panic!("{want}: wrong error {other}"),
            Ok(_) => panic!("{want}: accepted"),
        }
    }
}

/// A drafter moved to another draft vocabulary keeps every parameter but the Markov head,
/// whose rows (W1) and columns (W2) follow the ids both vocabularies share; new ids start
/// as a fresh drafter's (W2 zero); the same vocabulary gives back the same drafter.
#[test]
fn another_draft_vocabulary_keeps_the_shared_markov_rows() {
    let head = tiny_head(1);
    let cfg = DsparkConfig {
        draft_vocab: Some(vec![5, 1, 60, 33, 2]),
        ..tiny_config()
    };
    let model = busy_drafter(cfg, &head, 2);
    let same = model
        .with_draft_vocab(vec![5, 1, 60, 33, 2], 9)
        .expect("same vocabulary");
    assert_eq!(param_bits(&same), param_bits(&model));
    let moved = model
        .with_draft_vocab(vec![33, 7, 5, 40], 9)
        .expect("new vocabulary");
    assert_eq!(moved.vocab().ids(), &[33, 7, 5, 40]);
    let (old, new) = (param_bits(&model), param_bits(&moved));
    for ((name, a), (name_b, b)) in old.iter().zip(&new) {
        assert_eq!(name, name_b);
        if !name.starts_with("markov.") {
            assert_eq!(a, b, "{name} changed");
        }
    }
    let r = model.config().markov_rank;
    let get = param_values;
    let (w1, w1n) = (get(&model, "markov.w1"), get(&moved, "markov.w1"));
    let (w2, w2n) = (get(&model, "markov.w2"), get(&moved, "markov.w2"));
    let row = |w: &[f32], i: usize| w[i * r..(i + 1) * r].to_vec();
    // 33 was draft index 3, 5 was 0; 7 and 40 are new; the outside row is last.
    assert_eq!(row(&w1n, 0), row(&w1, 3));
    assert_eq!(row(&w1n, 2), row(&w1, 0));
    assert_eq!(row(&w1n, 4), row(&w1, 5));
    assert!(row(&w1n, 1).iter().any(|x| *x != 0.0));
    for k in 0..r {
        assert_eq!(w2n[k * 4], w2[k * 5 + 3]);
        assert_eq!(w2n[k * 4 + 2], w2[k * 5]);
        assert_eq!((w2n[k * 4 + 1], w2n[k * 4 + 3]), (0.0, 0.0));
    }
    assert!(model.with_draft_vocab(vec![5, 5], 9).is_err());
}

/// A drafter grown by two layers and a doubled feed-forward drafts what it drafted before
/// (same logits and confidences over an incrementally built context), keeps every old
/// weight, starts its new residual branches at zero, survives a save and load, and
/// refuses to shrink.
#[test]
fn a_grown_drafter_scores_what_it_scored_before() {
    let head = tiny_head(1);
    let model = busy_drafter(tiny_config(), &head, 4);
    let grown = model
        .grown(
            Growth {
                layers: 4,
                ff_mult: 4,
            },
            7,
        )
        .expect("grow");
    assert_eq!((grown.config().n_layers, grown.config().ff_mult), (4, 4));
    let get = param_values;
    let (d, ff) = (16, 32);
    assert!(get(&grown, "bb.3.o").iter().all(|x| *x == 0.0));
    assert!(get(&grown, "bb.2.down").iter().all(|x| *x == 0.0));
    assert!(get(&grown, "bb.2.q").iter().any(|x| *x != 0.0));
    assert!(get(&grown, "bb.1.down")[ff * d..].iter().all(|x| *x == 0.0));
    assert_eq!(
        get(&grown, "bb.1.down")[..ff * d],
        get(&model, "bb.1.down")[..]
    );
    let (gate, wide) = (get(&model, "bb.0.gate"), get(&grown, "bb.0.gate"));
    for r in 0..d {
        assert_eq!(
            wide[r * 2 * ff..r * 2 * ff + ff],
            gate[r * ff..(r + 1) * ff]
        );
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    grown.save(tmp.path()).expect("save");
    let loaded = Dspark::load(tmp.path(), &head).expect("load");
    let mut rng = Lcg::new(3);
    let rows = taps(&mut rng, 9, model.row_width());
    let score = |m: &Dspark| {
        let drafter = m.drafter(&head).expect("drafter");
        let mut cache = drafter.new_cache();
        drafter.extend(&mut cache, &rows).expect("extend");
        let s = drafter.score(&cache, &[3, 9, 4, 1]).expect("score");
        (s.logits.concat(), s.confidences)
    };
    let (want, got, back) = (score(&model), score(&grown), score(&loaded));
    assert!(max_abs_diff(&want.0, &got.0) < 1e-5);
    assert!(max_abs_diff(&want.1, &got.1) < 1e-6);
    assert_eq!(got, back);
    assert!(grown
        .grown(
            Growth {
                layers: 3,
                ff_mult: 4
            },
            7
        )
        .is_err());
    assert!(grown
        .grown(
            Growth {
                layers: 4,
                ff_mult: 2
            },
            7
        )
        .is_err());
}

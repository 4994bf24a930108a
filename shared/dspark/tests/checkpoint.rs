//! Checkpoints and configs: bit-exact save/load (single file and sharded), reproducible
//! initialisation, rejection of another target's drafter and of invalid configs.

mod common;

use common::*;
use tandem_core::{Sampler, SamplingParams};
use tandem_dspark::{DraftRequest, Dspark, DsparkConfig, DsparkError, SaveOptions, MANIFEST};

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

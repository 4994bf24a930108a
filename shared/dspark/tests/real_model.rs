//! The drafter on the real Gemma 3 270M head (fetched by scripts/fetch-models.sh): a
//! random-initialised drafter with a 32k draft vocabulary reads real taps of 20 committed
//! positions and drafts a block of 8 valid target ids.

use std::sync::Arc;

use candle_core::Tensor;
use tandem_core::{ProposeRequest, Proposer, SamplingParams, SnapshotRows};
use tandem_dspark::{Dspark, DsparkConfig, DsparkProposer, TargetDims};
use tandem_gemma::{ForwardOptions, Gemma3, LogitsMode};
use tandem_testkit::real_gguf;

#[test]
fn random_drafter_proposes_on_real_taps() {
    let target = Gemma3::load(&real_gguf()).expect("load the real GGUF");
    let head = target.head();
    let cfg = DsparkConfig::small(&TargetDims::of(&head));
    let model = Arc::new(Dspark::init(cfg, &head, 1).expect("init"));
    let proposer = DsparkProposer::new(Arc::clone(&model), &head).expect("proposer");
    let tokens: Vec<u32> = (0..20).map(|i| 2 + i * 97).collect();
    let mut cache = target.new_cache(32);
    let opts = ForwardOptions {
        logits: LogitsMode::None,
        taps: proposer.snapshot_spec().tap_layers(),
    };
    let out = target
        .forward(&tokens, 0, &mut cache, &opts)
        .expect("forward");
    let rows = Tensor::cat(&out.taps, 1).expect("concat taps");
    let spec = proposer.snapshot_spec();
    assert_eq!(rows.dims(), &[20, spec.row_width()]);
    let mut s = proposer.open(&SamplingParams::default()).expect("open");
    s.extend(&SnapshotRows {
        start: 0,
        width: spec.row_width(),
        data: rows.flatten_all().expect("flat").to_vec1().expect("vec"),
        tokens: Vec::new(),
    })
    .expect("extend");
    let req = ProposeRequest {
        anchor: 818,
        position: 20,
        gamma: 8,
    };
    let block = s.propose(&req).expect("propose");
    assert_eq!(block.tokens.len(), 8);
    assert!(
        block.tokens.iter().all(|t| *t < 32_768),
        "{:?}",
        block.tokens
    );
    assert_eq!(block.dists.len(), 8);
}

//! The target head on its own: loading only the head from GGUF and HF files, sharing the
//! weights of a loaded model, restriction to a draft vocabulary, and the target identity
//! a drafter checkpoint is bound to.

mod common;

use candle_core::quantized::GgmlDType;
use common::*;
use tandem_gemma::testing::tiny_config;
use tandem_gemma::{export_hf, Gemma3, TargetHead};
use tandem_testkit::{bits, Lcg};

fn tiny_gguf(dir: &std::path::Path, seed: u64) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    write_gguf(
        &path,
        &GgufSpec {
            cfg: &tiny_config(),
            seed,
            matrix_type: GgmlDType::Q8_0,
            arch: "gemma3",
            skip: &[],
        },
    );
    path
}

/// A GGUF and its exact HF export have the same identity; another checkpoint does not.
#[test]
fn identity_survives_hf_export_and_separates_targets() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tiny_gguf(tmp.path(), 3);
    let hf = tmp.path().join("hf");
    export_hf(&gguf, &hf).expect("export");
    let a = TargetHead::load(&gguf).expect("gguf head");
    let b = TargetHead::load(&hf).expect("hf head");
    assert_eq!(a.identity().expect("id"), b.identity().expect("id"));
    assert_eq!(a.identity().expect("id").architecture, "gemma3");
    let other = tempfile::tempdir().expect("tempdir");
    let c = TargetHead::load(&tiny_gguf(other.path(), 4)).expect("other head");
    assert_ne!(a.identity().expect("id"), c.identity().expect("id"));
}

/// The standalone head, the model's shared head and the model itself agree: embeddings,
/// logits of restricted rows, dense rows and identity.
#[test]
fn head_matches_the_model() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tiny_gguf(tmp.path(), 5);
    let model = Gemma3::load(&gguf).expect("model");
    let head = TargetHead::load(&gguf).expect("head");
    let shared = model.head();
    assert_eq!((head.hidden(), head.vocab()), (32, 96));
    for t in [0u32, 17, 95] {
        let e = model.embed_token(t).expect("embed");
        assert_eq!(bits(&head.embed(t).expect("embed")), bits(&e));
        assert_eq!(bits(&shared.embed(t).expect("embed")), bits(&e));
    }
    assert!(head.embed(96).is_err());
    let ids = [5u32, 90, 0, 41];
    let restricted = head.restrict(&ids).expect("restrict");
    let full = head.full();
    let mut rng = Lcg::new(9);
    let x: Vec<f32> = (0..2 * 32).map(|_| rng.next()).collect();
    let all = full.logits(&x, 2).expect("logits");
    let some = restricted.logits(&x, 2).expect("logits");
    for m in 0..2 {
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                some[m * 4 + i].to_bits(),
                all[m * 96 + *id as usize].to_bits()
            );
        }
    }
    let dense = head.dense_rows(&ids).expect("dense");
    assert_eq!(dense.dims(), &[4, 32]);
    assert!(head.restrict(&[96]).is_err());
    // The `exact` model's head is lane-packed: same identity and dense rows, and its
    // restricted rows score exactly like the same rows of the full head.
    assert_eq!(shared.identity().expect("id"), head.identity().expect("id"));
    let shared_dense = shared.dense_rows(&ids).expect("dense");
    let values = |t: candle_core::Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>());
    assert_eq!(
        bits(&values(shared_dense).expect("values")),
        bits(&values(dense).expect("values"))
    );
    let all = shared.full().logits(&x, 2).expect("logits");
    let some = shared
        .restrict(&ids)
        .expect("restrict")
        .logits(&x, 2)
        .expect("logits");
    for m in 0..2 {
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                some[m * 4 + i].to_bits(),
                all[m * 96 + *id as usize].to_bits()
            );
        }
    }
}

//! The training and inference forwards of a tiny drafter: shapes, padding isolation, the
//! vanishing Markov term at initialisation, and the incremental context cache against a
//! full recompute by the training forward.

mod common;

use candle_core::{Device, Tensor};
use common::*;
use tandem_dspark::{Dspark, DsparkConfig, TrainBatch};
use tandem_testkit::{bits, max_abs_diff, Lcg};

fn batch(
    taps: Vec<f32>,
    mask: Option<Vec<f32>>,
    a: usize,
    l: usize,
    w: usize,
    head: &tandem_gemma::TargetHead,
    prev: &[u32],
) -> TrainBatch {
    let g = prev.len() / a;
    let emb: Vec<f32> = (0..a)
        .flat_map(|i| head.embed(prev[i * g]).expect("embed"))
        .collect();
    TrainBatch {
        ctx_taps: Tensor::from_vec(taps, (a, l, w), &Device::Cpu).expect("taps"),
        ctx_index: None,
        ctx_mask: mask.map(|m| Tensor::from_vec(m, (a, l), &Device::Cpu).expect("mask")),
        anchor_emb: Tensor::from_vec(emb, (a, HIDDEN), &Device::Cpu).expect("emb"),
        prev: Tensor::from_vec(prev.to_vec(), (a, g), &Device::Cpu).expect("prev"),
    }
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().expect("flat").to_vec1().expect("vec")
}

#[test]
fn training_forward_has_the_documented_shapes() {
    let head = tiny_head(1);
    let model = Dspark::init(tiny_config(), &head, 3).expect("init");
    let w = model.row_width();
    assert_eq!(w, 3 * HIDDEN);
    let mut rng = Lcg::new(5);
    let prev = [3u32, 9, 4, 1, 7, 7, 63, 0];
    let b = batch(taps(&mut rng, 2 * 6, w), None, 2, 6, w, &head, &prev);
    let dense = head.dense_rows(model.vocab().ids()).expect("dense");
    let out = model.forward_train(&b, &dense).expect("forward");
    assert_eq!(out.logits.dims(), &[2, 4, VOCAB]);
    assert_eq!(out.confidences.dims(), &[2, 4]);
    // A zero confidence head starts every confidence at exactly 1/2.
    assert!(flat(&out.confidences).iter().all(|c| *c == 0.5));
    let names: Vec<String> = model.vars().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 * 9 + 11);
    assert!(names.contains(&"markov.w2".to_string()));
}

/// A row's outputs do not depend on the padded rows it is batched with.
#[test]
fn padding_never_changes_real_rows() {
    let head = tiny_head(1);
    let model = busy_drafter(tiny_config(), &head, 4);
    let dense = head.dense_rows(model.vocab().ids()).expect("dense");
    let w = model.row_width();
    let mut rng = Lcg::new(6);
    let (short, long) = (5, 9);
    let alone_taps = taps(&mut rng, short, w);
    let other_taps = taps(&mut rng, long, w);
    let mut padded = alone_taps.clone();
    padded.extend(taps(&mut rng, long - short, w).iter().map(|x| x * 50.0));
    padded.extend(&other_taps);
    let mut mask = vec![1.0f32; 2 * long];
    mask[short..long].iter_mut().for_each(|m| *m = 0.0);
    let prev = [5u32, 6, 7, 8, 10, 11, 12, 13];
    let alone = model
        .forward_train(
            &batch(alone_taps, None, 1, short, w, &head, &prev[..4]),
            &dense,
        )
        .expect("alone");
    let both = model
        .forward_train(&batch(padded, Some(mask), 2, long, w, &head, &prev), &dense)
        .expect("batched");
    let row0 = |t: &Tensor| flat(&t.narrow(0, 0, 1).expect("row"));
    assert!(max_abs_diff(&flat(&alone.logits), &row0(&both.logits)) < 1e-5);
    assert!(max_abs_diff(&flat(&alone.confidences), &row0(&both.confidences)) < 1e-5);
}

/// With `W2 = 0` (the initial state) the logits do not depend on the previous tokens.
#[test]
fn zero_w2_makes_the_markov_term_vanish() {
    let head = tiny_head(1);
    let model = Dspark::init(tiny_config(), &head, 8).expect("init");
    let dense = head.dense_rows(model.vocab().ids()).expect("dense");
    let w = model.row_width();
    let ctx = taps(&mut Lcg::new(2), 4, w);
    let a = model
        .forward_train(
            &batch(ctx.clone(), None, 1, 4, w, &head, &[3, 1, 2, 3]),
            &dense,
        )
        .expect("a");
    let b = model
        .forward_train(&batch(ctx, None, 1, 4, w, &head, &[3, 60, 0, 17]), &dense)
        .expect("b");
    assert_eq!(flat(&a.logits), flat(&b.logits));
}

fn cache_matches_recompute(cfg: DsparkConfig, prev: &[u32]) {
    let head = tiny_head(1);
    let model = busy_drafter(cfg, &head, 9);
    let drafter = model.drafter(&head).expect("drafter");
    let dense = head.dense_rows(model.vocab().ids()).expect("dense");
    let w = model.row_width();
    let mut rng = Lcg::new(10);
    let chunks = [1usize, 3, 7, 2, 5];
    let all = taps(&mut rng, chunks.iter().sum(), w);
    let mut cache = drafter.new_cache();
    let mut at = 0;
    for (i, n) in chunks.iter().enumerate() {
        drafter
            .extend(&mut cache, &all[at * w..(at + n) * w])
            .expect("extend");
        at += n;
        let full = model
            .forward_train(
                &batch(all[..at * w].to_vec(), None, 1, at, w, &head, prev),
                &dense,
            )
            .expect("train");
        let scored = drafter.score(&cache, prev).expect("score");
        let got: Vec<f32> = scored.logits.concat();
        assert!(
            max_abs_diff(&got, &flat(&full.logits)) < 1e-5,
            "after chunk {i}"
        );
        assert!(max_abs_diff(&scored.confidences, &flat(&full.confidences)) < 1e-5);
    }
    assert_eq!(cache.len(), at);
}

/// Extending the cache in chunks of varying sizes gives the logits and confidences of
/// recomputing the whole context with the training forward.
#[test]
fn incremental_cache_equals_full_recompute() {
    cache_matches_recompute(tiny_config(), &[3, 9, 4, 1]);
}

/// The same with a draft vocabulary, including previous tokens outside it.
#[test]
fn incremental_cache_equals_full_recompute_with_a_draft_vocab() {
    let cfg = DsparkConfig {
        draft_vocab: Some((10..40).rev().collect()),
        ..tiny_config()
    };
    cache_matches_recompute(cfg, &[3, 12, 39, 50]);
}

/// Three anchors reading two shared sequences through `ctx_index` (one masked to a shorter
/// context) score exactly as with a copy of its context per anchor.
#[test]
fn shared_contexts_score_like_one_copy_per_anchor() {
    let head = tiny_head(1);
    let model = busy_drafter(tiny_config(), &head, 12);
    let dense = head.dense_rows(model.vocab().ids()).expect("dense");
    let (w, l) = (model.row_width(), 6);
    let mut rng = Lcg::new(13);
    let seqs = [taps(&mut rng, l, w), taps(&mut rng, l, w)];
    let prev = [5u32, 6, 7, 8, 10, 11, 12, 13, 1, 2, 3, 4];
    let order = [1usize, 0, 1];
    let mut mask = vec![1.0f32; 3 * l];
    mask[2 * l + 4..].iter_mut().for_each(|m| *m = 0.0);
    let copies: Vec<f32> = order.iter().flat_map(|s| seqs[*s].clone()).collect();
    let each = model
        .forward_train(
            &batch(copies, Some(mask.clone()), 3, l, w, &head, &prev),
            &dense,
        )
        .expect("copies");
    let copies: Vec<f32> = order.iter().flat_map(|s| seqs[*s].clone()).collect();
    let mut shared = batch(copies, Some(mask), 3, l, w, &head, &prev);
    shared.ctx_taps = Tensor::from_vec(seqs.concat(), (2, l, w), &Device::Cpu).expect("taps");
    let index: Vec<u32> = order.iter().map(|s| *s as u32).collect();
    shared.ctx_index = Some(Tensor::from_vec(index, 3, &Device::Cpu).expect("index"));
    let out = model.forward_train(&shared, &dense).expect("shared");
    assert!(max_abs_diff(&flat(&each.logits), &flat(&out.logits)) < 1e-6);
    assert!(max_abs_diff(&flat(&each.confidences), &flat(&out.confidences)) < 1e-6);
    shared.ctx_index = None;
    assert!(model.forward_train(&shared, &dense).is_err());
    shared.ctx_index = Some(Tensor::new(&[0u32, 2, 1], &Device::Cpu).expect("index"));
    assert!(model.forward_train(&shared, &dense).is_err());
}

/// The logits and confidences `model` scores after `prev` over `ctx`, through the
/// inference forward.
fn scored(model: &Dspark, head: &tandem_gemma::TargetHead, ctx: &[f32], prev: &[u32]) -> Vec<f32> {
    let drafter = model.drafter(head).expect("drafter");
    let mut cache = drafter.new_cache();
    drafter.extend(&mut cache, ctx).expect("extend");
    let s = drafter.score(&cache, prev).expect("score");
    [s.logits.concat(), s.confidences].concat()
}

/// A block of γ tokens runs its γ drafted rows and one mask row more, not the whole
/// configured block: the rows past them change nothing it gives (bit for bit), while a
/// block that runs them changes.
#[test]
fn a_short_block_never_reads_the_rows_past_it() {
    let head = tiny_head(1);
    let model = busy_drafter(tiny_config(), &head, 9);
    let ctx = taps(&mut Lcg::new(10), 6, model.row_width());
    let (short, whole) = ([3u32, 9], [3u32, 9, 4]);
    let before = [short.as_slice(), &whole].map(|p| scored(&model, &head, &ctx, p));
    let (_, mask) = model
        .vars()
        .into_iter()
        .find(|(n, _)| n == "mask_emb")
        .expect("mask_emb");
    let d = mask.dim(1).expect("width");
    let changed = Tensor::cat(
        &[
            mask.narrow(0, 0, 2).expect("kept rows"),
            Tensor::from_vec(Lcg::new(11).vec(d), (1, d), &Device::Cpu).expect("row"),
        ],
        0,
    )
    .expect("cat");
    mask.set(&changed).expect("set");
    let after = [short.as_slice(), &whole].map(|p| scored(&model, &head, &ctx, p));
    assert_eq!(
        bits(&before[0]),
        bits(&after[0]),
        "a block of 2 runs 3 rows"
    );
    assert_ne!(bits(&before[1]), bits(&after[1]), "a block of 3 runs all 4");
}

/// A block of γ tokens gives what the training forward gives for a drafter configured
/// with blocks of γ + 1 rows and the same parameters (its first γ positions).
#[test]
fn a_short_block_is_the_training_forward_of_a_block_one_row_longer() {
    let head = tiny_head(1);
    let model = busy_drafter(tiny_config(), &head, 9);
    let shorter = Dspark::init(
        DsparkConfig {
            gamma: 3,
            ..tiny_config()
        },
        &head,
        1,
    )
    .expect("init");
    let vars = model.vars();
    for (name, var) in shorter.vars() {
        let (_, from) = vars.iter().find(|(n, _)| *n == name).expect("same names");
        let rows = var.dim(0).expect("rows");
        var.set(&from.narrow(0, 0, rows).expect("first rows"))
            .expect("set");
    }
    let w = model.row_width();
    let ctx = taps(&mut Lcg::new(10), 6, w);
    let dense = head.dense_rows(shorter.vocab().ids()).expect("dense");
    let prev = [3u32, 9, 4];
    let full = shorter
        .forward_train(&batch(ctx.clone(), None, 1, 6, w, &head, &prev), &dense)
        .expect("train");
    let logits = flat(&full.logits);
    let want = [&logits[..2 * VOCAB], &flat(&full.confidences)[..2]].concat();
    let got = scored(&model, &head, &ctx, &prev[..2]);
    assert!(max_abs_diff(&got, &want) < 1e-5);
}

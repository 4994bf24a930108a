//! [`DeviceBatch`] (batched steps over a pool of KV slots, meant for GPUs; here on candle's
//! CPU backend in f32, op by op) against [`DeviceGemma3::forward`] of each sequence alone on
//! the same weights: sequences joining and leaving between steps, blocks of every length
//! class in one forward, rollbacks, reused slots, taps and every logits mode.

use candle_core::{DType, Device, Tensor};
use std::sync::Arc;
use tandem_gemma::testing::{tiny_config, write_hf};
use tandem_gemma::{
    DeviceBatch, DeviceCache, DeviceGemma3, DeviceOptions, ForwardOptions, ForwardOutput,
    LogitsMode, SlotCache, SlotSegment,
};
use tandem_testkit::{max_abs_diff, Lcg};

fn cpu_f32() -> DeviceOptions {
    DeviceOptions::new(Device::Cpu, DType::F32)
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().expect("flat").to_vec1().expect("vec")
}

/// One sequence run both ways: in the batch's slot and alone.
struct Pair {
    ids: Vec<u32>,
    slot: SlotCache,
    alone: DeviceCache,
    opts: ForwardOptions,
}

/// Each running pair's slot segment of its block in `blocks`.
fn segments<'a>(running: &'a mut [Pair], blocks: &'a [Vec<u32>]) -> Vec<SlotSegment<'a>> {
    (running.iter_mut().zip(blocks))
        .map(|(p, b)| SlotSegment {
            tokens: b,
            pos: p.slot.len(),
            cache: &mut p.slot,
            opts: &p.opts,
        })
        .collect()
}

/// The options of the `k`th block: logits modes and taps varied across sequences.
fn options(k: usize, layers: usize) -> ForwardOptions {
    let logits = [
        LogitsMode::All,
        LogitsMode::Top(1),
        LogitsMode::Last,
        LogitsMode::None,
    ][k % 4];
    let taps = match k % 3 {
        0 => vec![],
        1 => vec![1, layers],
        _ => vec![layers, 0],
    };
    ForwardOptions { logits, taps }
}

fn assert_same(got: &ForwardOutput, want: &ForwardOutput, what: &str) {
    match (&got.logits, &want.logits) {
        (Some(g), Some(w)) => {
            let diff = max_abs_diff(&flat(g), &flat(w));
            assert!(diff < 1e-4, "{what}: logits differ by {diff}");
            assert_eq!(g.dims(), w.dims(), "{what}");
        }
        (None, None) => {}
        _ => panic!("{what}: logits present one way only"),
    }
    assert_eq!(got.taps.len(), want.taps.len(), "{what}");
    for (g, w) in got.taps.iter().zip(&want.taps) {
        assert_eq!(g.dims(), w.dims(), "{what}");
        assert!(max_abs_diff(&flat(g), &flat(w)) < 1e-4, "{what}: taps");
    }
    let hidden = max_abs_diff(&flat(&got.last_hidden), &flat(&want.last_hidden));
    assert!(hidden < 1e-4, "{what}: final-norm rows differ by {hidden}");
    if let Some(top) = &got.top {
        let logits = want.logits.as_ref().expect("a greedy block has logits");
        let rows = logits.to_vec2::<f32>().expect("rows");
        for (row, t) in rows.iter().zip(top) {
            let best = (0..row.len()).fold(0, |b, j| if row[j] > row[b] { j } else { b });
            assert_eq!(t.ids, vec![best as u32], "{what}: argmax");
        }
    }
}

/// Rounds over up to 5 sequences in 3 slots: each round every running sequence sends one
/// block (a prompt chunk of 13–40 tokens, or a block of 1–9 after a wrong one rolled
/// back), all in one forward; a sequence leaves at its end and a new one takes its slot
/// (whose stale keys must stay hidden). Sequences reach 300 positions (spans 256 and 512,
/// across the window of 6).
#[test]
fn batched_steps_match_each_sequence_alone() {
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 17);
    let alone = DeviceGemma3::load(dir.path(), cpu_f32()).expect("load");
    let model = Arc::new(DeviceGemma3::load(dir.path(), cpu_f32()).expect("load"));
    let mut batch = DeviceBatch::new(model, 3).expect("batch");
    let slots = batch.slots();
    // Warming up builds the steps of blocks of 1..=9 rows (buckets 1, 2, 4, 8, 9) for
    // batches of 1 and 2 (3 free slots), and frees its slots again.
    let warm = options(1, cfg.num_hidden_layers);
    assert_eq!(batch.warm(9, &warm).expect("warm up"), 10);
    assert_eq!(slots.available(), 3);
    let lengths = [300usize, 120, 60, 200, 90];
    let mut waiting: Vec<Vec<u32>> = (0..lengths.len())
        .map(|s| Lcg::new(40 + s as u64).tokens(lengths[s], cfg.vocab_size))
        .collect();
    let mut running: Vec<Pair> = Vec::new();
    let (mut rng, mut round, mut finished) = (Lcg::new(3), 0usize, 0usize);
    while finished < lengths.len() {
        while let Some(ids) = waiting.pop() {
            let Some(slot) = slots.take(ids.len()) else {
                waiting.push(ids);
                break;
            };
            let alone_cache = alone.new_cache(ids.len());
            running.push(Pair {
                ids,
                slot,
                alone: alone_cache,
                opts: options(0, 0),
            });
        }
        round += 1;
        // Each sequence's block this round; a wrong block first where it decodes.
        let mut blocks: Vec<Vec<u32>> = Vec::new();
        for (k, p) in running.iter_mut().enumerate() {
            let pos = p.slot.len();
            let left = p.ids.len() - pos;
            let len = match pos {
                0 => 13 + (rng.next().abs() * 27.0) as usize,
                _ => 1 + (rng.next().abs() * 8.99) as usize,
            }
            .min(left);
            p.opts = options(round + k, cfg.num_hidden_layers);
            blocks.push(p.ids[pos..pos + len].to_vec());
        }
        if round % 2 == 0 {
            let wrong: Vec<Vec<u32>> = (blocks.iter())
                .map(|b| b.iter().map(|t| (t + 5) % cfg.vocab_size as u32).collect())
                .collect();
            let mut segs = segments(&mut running, &wrong);
            batch.forward(&mut segs).expect("wrong blocks");
            for (s, b) in segs.iter_mut().zip(&wrong) {
                let len = s.cache.len() - b.len();
                s.cache.truncate(len).expect("roll back");
            }
        }
        let mut segs = segments(&mut running, &blocks);
        let got = batch.forward(&mut segs).expect("batched forward");
        drop(segs);
        for ((p, b), got) in running.iter_mut().zip(&blocks).zip(&got) {
            let pos = p.alone.len();
            let want = alone.forward(b, pos, &mut p.alone, &p.opts).expect("alone");
            assert_same(
                got,
                &want,
                &format!("round {round}, block {pos}+{}", b.len()),
            );
            assert_eq!(p.slot.len(), p.alone.len());
        }
        let before = running.len();
        running.retain(|p| p.slot.len() < p.ids.len());
        finished += before - running.len();
    }
    assert!(
        batch.step_shapes() >= 6,
        "{} step shapes",
        batch.step_shapes()
    );
    assert_eq!(slots.available(), 3, "every slot is free again");
}

/// A forward with one bad segment (empty, a token outside the vocabulary, a wrong start, a
/// block past the cache's end, a cache of another pool, a tap past the last layer) fails
/// and commits nothing, for the good segments beside it too.
#[test]
fn a_bad_segment_fails_the_forward_and_commits_nothing() {
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 18);
    let model = Arc::new(DeviceGemma3::load(dir.path(), cpu_f32()).expect("load"));
    let mut batch = DeviceBatch::new(model.clone(), 2).expect("batch");
    let other = DeviceBatch::new(model, 1).expect("another batch");
    let slots = batch.slots();
    let mut good = slots.take(50).expect("slot");
    let mut bad = slots.take(8).expect("slot");
    let mut foreign = other.slots().take(8).expect("slot");
    let opts = ForwardOptions::default();
    let far = ForwardOptions {
        taps: vec![cfg.num_hidden_layers + 1],
        ..ForwardOptions::default()
    };
    let outside = [cfg.vocab_size as u32];
    let cases: [(&[u32], usize, bool, &ForwardOptions, &str); 6] = [
        (&[], 0, false, &opts, "empty block"),
        (&outside, 0, false, &opts, "outside the vocabulary"),
        (&[1, 2], 3, false, &opts, "starts at position 3"),
        (&[1; 9], 0, false, &opts, "context"),
        (&[1], 0, true, &opts, "another pool"),
        (&[1], 0, false, &far, "out of range"),
    ];
    for (tokens, pos, other_pool, opts, message) in cases {
        let victim = if other_pool { &mut foreign } else { &mut bad };
        let mut segs = [
            SlotSegment {
                tokens: &[3, 4, 5],
                pos: 0,
                cache: &mut good,
                opts: &ForwardOptions::default(),
            },
            SlotSegment {
                tokens,
                pos,
                cache: victim,
                opts,
            },
        ];
        let err = batch.forward(&mut segs).map(|_| ()).expect_err(message);
        assert!(err.to_string().contains(message), "{message}: {err}");
        assert_eq!((good.len(), bad.len(), foreign.len()), (0, 0, 0));
    }
    assert!(slots.take(8).is_none(), "both slots are held");
    assert_eq!(other.slots().available(), 0);
}

//! [`DeviceGemma3`] (the candle-tensor forward meant for GPUs) run on candle's CPU backend
//! in f32 against the CPU-kernel [`Gemma3`] on the same weights: a tiny random model over
//! blocks crossing its sliding window, with rollback and taps, and the real Gemma 3 270M.

use candle_core::{DType, Device};
use tandem_gemma::testing::{tiny_config, write_hf};
use tandem_gemma::{
    DeviceCache, DeviceGemma3, DeviceOptions, ForwardOptions, Gemma3, GemmaError, LogitsMode,
};
use tandem_testkit::{max_abs_diff, real_gguf, Lcg};

fn cpu_f32() -> DeviceOptions {
    DeviceOptions::new(Device::Cpu, DType::F32)
}

fn device_forward(
    m: &DeviceGemma3,
    tokens: &[u32],
    cache: &mut DeviceCache,
    opts: &ForwardOptions,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let out = m
        .forward(tokens, cache.len(), cache, opts)
        .expect("device forward");
    let flat = |t: &candle_core::Tensor| t.flatten_all().expect("flat").to_vec1().expect("vec");
    let logits = out.logits.as_ref().map_or_else(Vec::new, flat);
    (logits, out.taps.iter().map(flat).collect())
}

/// Blocks of 1..=7 tokens over 40 positions (the window is 6, GQA 4:2), a rollback in
/// between, and three taps: everything within 1e-4 of the CPU kernels.
#[test]
fn tiny_model_matches_the_cpu_kernels() {
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 5);
    let cpu = Gemma3::load(dir.path()).expect("load");
    let dev = DeviceGemma3::load(dir.path(), cpu_f32()).expect("load on device");
    let ids = Lcg::new(3).tokens(40, cfg.vocab_size);
    let opts = ForwardOptions {
        logits: LogitsMode::All,
        taps: vec![0, 3, cfg.num_hidden_layers],
    };
    let mut kv = cpu.new_cache(64);
    let mut dc = dev.new_cache(64);
    let (mut pos, mut b) = (0, 1);
    while pos < ids.len() {
        let len = b.min(ids.len() - pos);
        let block = &ids[pos..pos + len];
        // A wrong block first, rolled back: the cache must forget it.
        device_forward(&dev, &ids[..len], &mut dc, &opts);
        dc.truncate(pos).expect("truncate");
        let want = cpu.forward(block, pos, &mut kv, &opts).expect("forward");
        let (logits, taps) = device_forward(&dev, block, &mut dc, &opts);
        let flat = |t: &candle_core::Tensor| -> Vec<f32> {
            t.flatten_all().expect("flat").to_vec1().expect("vec")
        };
        let diff = max_abs_diff(&logits, &flat(want.logits.as_ref().expect("logits")));
        assert!(diff < 1e-4, "logits at {pos}+{len} differ by {diff}");
        for (got, want) in taps.iter().zip(&want.taps) {
            let diff = max_abs_diff(got, &flat(want));
            assert!(diff < 1e-4, "taps at {pos}+{len} differ by {diff}");
        }
        pos += len;
        b = b % 7 + 1;
    }
    assert_eq!(dc.len(), ids.len());
}

/// A block longer than the device model's chunk (1100 positions: chunks of 512, 512 and 76)
/// gives the logits and taps of the CPU kernels for every position.
#[test]
fn long_blocks_run_in_chunks() {
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 8);
    let cpu = Gemma3::load(dir.path()).expect("load");
    let dev = DeviceGemma3::load(dir.path(), cpu_f32()).expect("load on device");
    let ids = Lcg::new(4).tokens(1100, cfg.vocab_size);
    let opts = ForwardOptions {
        logits: LogitsMode::All,
        taps: vec![2],
    };
    let want = cpu
        .forward(&ids, 0, &mut cpu.new_cache(1200), &opts)
        .expect("forward");
    let mut dc = dev.new_cache(1200);
    let (logits, taps) = device_forward(&dev, &ids, &mut dc, &opts);
    let flat = |t: &candle_core::Tensor| -> Vec<f32> {
        t.flatten_all().expect("flat").to_vec1().expect("vec")
    };
    let diff = max_abs_diff(&logits, &flat(want.logits.as_ref().expect("logits")));
    assert!(diff < 1e-4, "logits differ by {diff}");
    assert!(max_abs_diff(&taps[0], &flat(&want.taps[0])) < 1e-4);
    assert_eq!(dc.len(), ids.len());
    let last = ForwardOptions {
        logits: LogitsMode::Last,
        taps: vec![],
    };
    let mut dc = dev.new_cache(1200);
    let (tail, _) = device_forward(&dev, &ids, &mut dc, &last);
    assert_eq!(tail.len(), cfg.vocab_size);
    assert!(max_abs_diff(&tail, &logits[logits.len() - cfg.vocab_size..]) < 1e-5);
}

/// Three sequences advanced together, through the trait both models share: a 1,100-token
/// prefill (chunked), then single steps across the window, with taps and last-row logits;
/// every row within 1e-4 of the CPU kernels run sequence by sequence (whose own batch
/// forward must equal that exactly).
#[test]
fn batches_of_sequences_match_one_sequence_at_a_time() {
    use tandem_gemma::Gemma3Model;
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 9);
    let cpu = Gemma3::load(dir.path()).expect("load");
    let dev = DeviceGemma3::load(dir.path(), cpu_f32()).expect("load on device");
    let seqs: Vec<Vec<u32>> = (0..3)
        .map(|s| Lcg::new(20 + s).tokens(1110, cfg.vocab_size))
        .collect();
    let opts = ForwardOptions {
        logits: LogitsMode::Last,
        taps: vec![1, cfg.num_hidden_layers],
    };
    let mut bc = dev.new_batch_cache(3, 1200);
    let mut cc = Gemma3Model::new_batch_cache(&cpu, 3, 1200);
    let mut kvs: Vec<_> = (0..3).map(|_| cpu.new_cache(1200)).collect();
    let flat = |t: &candle_core::Tensor| -> Vec<f32> {
        t.flatten_all().expect("flat").to_vec1().expect("vec")
    };
    for (start, len) in [(0, 1100), (1100, 1), (1101, 1), (1102, 8)] {
        let block: Vec<u32> = seqs
            .iter()
            .flat_map(|s| s[start..start + len].to_vec())
            .collect();
        let got = dev.forward(&block, start, &mut bc, &opts).expect("batch");
        let cpu_batch = cpu
            .forward_batch(&block, start, &mut cc, &opts)
            .expect("cpu batch");
        let (mut logits, mut taps) = (Vec::new(), vec![Vec::new(); 2]);
        for (s, kv) in seqs.iter().zip(&mut kvs) {
            let one = cpu
                .forward(&s[start..start + len], start, kv, &opts)
                .expect("one");
            logits.extend(flat(one.logits.as_ref().expect("logits")));
            for (all, tap) in taps.iter_mut().zip(&one.taps) {
                all.extend(flat(tap));
            }
        }
        assert_eq!(flat(cpu_batch.logits.as_ref().expect("logits")), logits);
        let diff = max_abs_diff(&flat(got.logits.as_ref().expect("logits")), &logits);
        assert!(diff < 1e-4, "logits at {start}+{len} differ by {diff}");
        for (got, want) in got.taps.iter().zip(&taps) {
            assert_eq!(got.dims(), &[3 * len, cfg.hidden_size]);
            let diff = max_abs_diff(&flat(got), want);
            assert!(diff < 1e-4, "taps at {start}+{len} differ by {diff}");
        }
    }
    assert_eq!((bc.len(), bc.batch()), (1110, 3));
    let err = dev.forward(&[1, 2], 1110, &mut bc, &opts).map(|_| ());
    assert!(err.is_err_and(|e| e.to_string().contains("3 equal blocks")));
}

#[test]
fn bad_calls_are_errors_and_change_nothing() {
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 6);
    let dev = DeviceGemma3::load(dir.path(), cpu_f32()).expect("load");
    let mut dc = dev.new_cache(8);
    let opts = ForwardOptions::default();
    assert!(err(dev.forward(&[], 0, &mut dc, &opts)).contains("empty block"));
    assert!(err(dev.forward(&[1], 3, &mut dc, &opts)).contains("position 3"));
    assert!(err(dev.forward(&[500], 0, &mut dc, &opts)).contains("outside the vocabulary"));
    assert!(err(dev.forward(&[1; 9], 0, &mut dc, &opts)).contains("context full"));
    let taps = ForwardOptions {
        taps: vec![99],
        ..ForwardOptions::default()
    };
    assert!(err(dev.forward(&[1], 0, &mut dc, &taps)).contains("tap 99"));
    assert!(err(dc.truncate(1)).contains("cannot truncate"));
    assert_eq!(dc.len(), 0);
    let bf = DeviceOptions {
        dtype: DType::U8,
        ..cpu_f32()
    };
    assert!(DeviceGemma3::load(dir.path(), bf).is_err());
}

/// The real 270M: a 520-token prefill (two chunks) and 12 greedy steps past the 512-token
/// sliding window: the same tokens as the CPU kernels, logits within 2e-3.
#[test]
fn real_model_matches_the_cpu_kernels() {
    let path = real_gguf();
    let cpu = Gemma3::load(&path).expect("load");
    let dev = DeviceGemma3::load(&path, cpu_f32()).expect("load on device");
    let vocab = cpu.config().vocab_size;
    let mut ids = vec![2u32];
    ids.extend(Lcg::new(9).tokens(519, 20_000).into_iter().map(|t| t + 100));
    let last = ForwardOptions {
        logits: LogitsMode::Last,
        taps: vec![],
    };
    let mut kv = cpu.new_cache(600);
    let mut dc = dev.new_cache(600);
    let mut want = cpu.forward(&ids, 0, &mut kv, &last).expect("prefill");
    let mut got = dev.forward(&ids, 0, &mut dc, &last).expect("prefill");
    for step in 0..12 {
        let flat = |o: &tandem_gemma::ForwardOutput| -> Vec<f32> {
            let l = o.logits.as_ref().expect("logits");
            l.flatten_all().expect("flat").to_vec1().expect("vec")
        };
        let (w, g) = (flat(&want), flat(&got));
        assert_eq!(w.len(), vocab);
        let diff = max_abs_diff(&w, &g);
        assert!(diff < 2e-3, "step {step}: logits differ by {diff}");
        let next = argmax(&w);
        assert_eq!(argmax(&g), next, "step {step}");
        let pos = kv.len();
        want = cpu.forward(&[next], pos, &mut kv, &last).expect("step");
        got = dev.forward(&[next], pos, &mut dc, &last).expect("step");
    }
}

/// The message of an error (empty when `r` is `Ok`).
fn err<T>(r: Result<T, GemmaError>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}

fn argmax(v: &[f32]) -> u32 {
    let best = v.iter().enumerate().fold(
        (0, f32::NEG_INFINITY),
        |b, (i, &x)| if x > b.1 { (i, x) } else { b },
    );
    best.0 as u32
}

/// A cache's bytes per position follow the model's dtype: what admission control budgets.
#[test]
fn kv_bytes_follow_the_dtype() {
    use tandem_gemma::Gemma3Model;
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 10);
    let cpu = Gemma3::load(dir.path()).expect("load");
    let f32_model = DeviceGemma3::load(dir.path(), cpu_f32()).expect("f32");
    let bf16 = DeviceOptions {
        dtype: DType::BF16,
        ..cpu_f32()
    };
    let bf16_model = DeviceGemma3::load(dir.path(), bf16).expect("bf16");
    let f32_bytes = Gemma3Model::kv_bytes_per_position(&f32_model);
    assert_eq!(f32_bytes, Gemma3Model::kv_bytes_per_position(&cpu));
    assert_eq!(f32_bytes, 2 * cfg.num_hidden_layers * cfg.kv_dim() * 4);
    assert_eq!(
        Gemma3Model::kv_bytes_per_position(&bf16_model) * 2,
        f32_bytes
    );
}

/// Fixed-shape steps (what a GPU replays as CUDA graphs; here op by op) against the plain
/// forward on the same weights: a 40-token prompt (op by op into the fixed cache), blocks of
/// 1..=9 tokens (padded to 1, 2, 4, 8 or 9 rows) to 300 positions (spans 256 and 512, across
/// the window) each after a wrong block rolled back, with taps and all logits; then a second
/// sequence in the first one's storage, whose stale keys and padding must stay hidden.
#[test]
fn fixed_shape_steps_match_the_plain_forward() {
    let cfg = tiny_config();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf(dir.path(), &cfg, 12);
    let plain = DeviceGemma3::load(dir.path(), cpu_f32()).expect("plain");
    let steps_opts = DeviceOptions {
        graphs: true,
        ..cpu_f32()
    };
    let fixed = DeviceGemma3::load(dir.path(), steps_opts).expect("fixed steps");
    let opts = ForwardOptions {
        logits: LogitsMode::All,
        taps: vec![0, 2, cfg.num_hidden_layers],
    };
    let check = |ids: &[u32], first: usize, blocks: &mut dyn FnMut() -> usize| {
        let mut want_cache = plain.new_cache(400);
        let mut got_cache = fixed.new_cache(400);
        let mut pos = 0;
        while pos < ids.len() {
            let len = if pos == 0 { first } else { blocks() }.min(ids.len() - pos);
            let block = &ids[pos..pos + len];
            if pos > 0 {
                let wrong: Vec<u32> = block.iter().map(|t| (t + 1) % 50).collect();
                device_forward(&fixed, &wrong, &mut got_cache, &opts);
                got_cache.truncate(pos).expect("truncate");
            }
            let want = device_forward(&plain, block, &mut want_cache, &opts);
            let got = device_forward(&fixed, block, &mut got_cache, &opts);
            let diff = max_abs_diff(&got.0, &want.0);
            assert!(diff < 1e-4, "logits at {pos}+{len} differ by {diff}");
            for (g, w) in got.1.iter().zip(&want.1) {
                assert!(max_abs_diff(g, w) < 1e-4, "taps at {pos}+{len}");
            }
            pos += len;
        }
        assert_eq!(got_cache.len(), ids.len());
        got_cache.fixed_steps().expect("a cache at fixed addresses")
    };
    let mut b = 0;
    let mut next = || {
        b = b % 9 + 1;
        b
    };
    let built = check(&Lcg::new(4).tokens(300, cfg.vocab_size), 40, &mut next);
    assert!(built >= 9, "{built} step shapes");
    // The next sequence reuses the dropped cache's storage and its steps.
    let again = check(&Lcg::new(5).tokens(60, cfg.vocab_size), 3, &mut || 1);
    assert!(again >= built, "the storage and its steps are reused");
    let last = ForwardOptions {
        logits: LogitsMode::Last,
        taps: vec![],
    };
    let ids = Lcg::new(6).tokens(5, cfg.vocab_size);
    let (want, _) = device_forward(&plain, &ids, &mut plain.new_cache(8), &last);
    let (got, _) = device_forward(&fixed, &ids, &mut fixed.new_cache(8), &last);
    assert_eq!(got.len(), cfg.vocab_size);
    assert!(max_abs_diff(&got, &want) < 1e-4);
}

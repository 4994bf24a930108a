//! The trainer on a tiny random target: it lowers the training loss and the held-out
//! total variation, a run resumed from a checkpoint repeats the uninterrupted run's losses,
//! teacher forcing a generated text reproduces its sample bit for bit, batched generation
//! and stored samples equal the ones made one at a time, and a teacher on the candle-device
//! forward makes the samples the CPU kernels make.

mod common;

use candle_core::{DType, Device};
use common::*;
use tandem_gemma::testing::{tiny_config, write_hf};
use tandem_gemma::{DeviceGemma3, DeviceOptions, Gemma3};
use tandem_testkit::bits;
use tandem_train::batch::frequent_ids;
use tandem_train::store::SampleStore;
use tandem_train::teacher::{forced, Pool, TeacherConfig};
use tandem_train::{Event, Trainer};

#[test]
fn training_lowers_the_loss() {
    let (_dir, model) = tiny_target();
    let (mut train, held) = pools(64, 4);
    let all: Vec<usize> = (0..train.len()).collect();
    train.ensure(&model, &all).expect("samples");
    let vocab = frequent_ids(&train.generated(), train.prompts(), 64, 96);
    assert_eq!(vocab.len(), 64);
    let mut t = Trainer::new(
        &model,
        drafter(&model, vocab, 1),
        (train, held),
        train_config(80),
    )
    .expect("trainer");
    let before = t.evaluate().expect("eval");
    let out = tempfile::tempdir().expect("tempdir");
    let mut losses = Vec::new();
    t.run(out.path(), &mut |e| {
        if let Event::Step(r) = e {
            losses.push(r.loss);
        }
    })
    .expect("train");
    let after = t.evaluate().expect("eval");
    assert_eq!(losses.len(), 80);
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let (first, last) = (mean(&losses[..10]), mean(&losses[70..]));
    assert!(last < 0.75 * first, "training loss {first} -> {last}");
    assert!(
        after.tv < before.tv,
        "held-out TV {} -> {}",
        before.tv,
        after.tv
    );
    assert!(after.tau >= before.tau, "τ {} -> {}", before.tau, after.tau);
    assert!(out.path().join("trainer.json").is_file());
}

#[test]
fn resume_repeats_the_uninterrupted_run() {
    let (_dir, model) = tiny_target();
    let vocab: Vec<u32> = (0..96).collect();
    let steps = 8;
    let mut whole = Trainer::new(
        &model,
        drafter(&model, vocab.clone(), 1),
        pools(6, 0),
        train_config(steps),
    )
    .expect("trainer");
    let reference: Vec<f32> = (0..steps)
        .map(|_| whole.step().expect("step").loss)
        .collect();

    let ckpt = tempfile::tempdir().expect("tempdir");
    let mut first = Trainer::new(
        &model,
        drafter(&model, vocab.clone(), 1),
        pools(6, 0),
        train_config(steps),
    )
    .expect("trainer");
    let mut resumed: Vec<f32> = (0..steps / 2)
        .map(|_| first.step().expect("step").loss)
        .collect();
    first.save(ckpt.path()).expect("save");
    drop(first);
    // A different initialisation: everything must come from the checkpoint.
    let mut second = Trainer::new(
        &model,
        drafter(&model, vocab, 99),
        pools(6, 0),
        train_config(steps),
    )
    .expect("trainer");
    second.resume(ckpt.path()).expect("resume");
    assert_eq!(second.steps_done(), steps / 2);
    resumed.extend((steps / 2..steps).map(|_| second.step().expect("step").loss));
    for (i, (a, b)) in reference.iter().zip(&resumed).enumerate() {
        assert!((a - b).abs() <= 1e-6, "step {i}: {a} vs {b}");
    }
    assert!(reference[steps - 1] < reference[0]);
}

#[test]
fn resume_refuses_other_data_settings() {
    let (_dir, model) = tiny_target();
    let vocab: Vec<u32> = (0..96).collect();
    let mut t = Trainer::new(
        &model,
        drafter(&model, vocab.clone(), 1),
        pools(6, 0),
        train_config(4),
    )
    .expect("trainer");
    t.step().expect("step");
    let ckpt = tempfile::tempdir().expect("tempdir");
    t.save(ckpt.path()).expect("save");
    let mut other = train_config(4);
    other.seed = 6;
    let mut u =
        Trainer::new(&model, drafter(&model, vocab, 1), pools(6, 0), other).expect("trainer");
    assert!(u.resume(ckpt.path()).is_err());
}

/// `train_only` steps the named parameters and leaves every other one as it was loaded;
/// a prefix that names none is refused.
#[test]
fn training_only_some_parameters_leaves_the_others_untouched() {
    let (_dir, model) = tiny_target();
    let vocab: Vec<u32> = (0..96).collect();
    let start = drafter(&model, vocab.clone(), 1);
    let before = values(&start);
    let mut cfg = train_config(4);
    cfg.train_only = vec!["bb.0.q".into(), "conf.".into()];
    let mut t = Trainer::new(&model, start, pools(6, 0), cfg).expect("trainer");
    for _ in 0..4 {
        t.step().expect("step");
    }
    let after = values(t.drafter());
    assert_eq!(before.len(), after.len());
    for ((name, old), (_, now)) in before.iter().zip(&after) {
        let stepped = name == "bb.0.q" || name.starts_with("conf.");
        assert_eq!(now != old, stepped, "{name} changed: {}", now != old);
    }
    let mut none = train_config(4);
    none.train_only = vec!["no.such.".into()];
    assert!(Trainer::new(&model, drafter(&model, vocab, 1), pools(6, 0), none).is_err());
}

/// Every parameter's values by name, in the drafter's canonical order.
fn values(d: &tandem_dspark::Dspark) -> Vec<(String, Vec<f32>)> {
    (d.vars().into_iter())
        .map(|(n, v)| {
            (
                n,
                v.flatten_all().and_then(|t| t.to_vec1()).expect("values"),
            )
        })
        .collect()
}

/// Generating in batches of 4 (two prompt lengths, so batches of one length) makes the
/// very samples of generating one prompt at a time on the CPU kernels.
#[test]
fn batched_generation_makes_the_one_at_a_time_samples() {
    let (_dir, model) = tiny_target();
    let (train, _) = pools(7, 1);
    let mut prompts = train.prompts().to_vec();
    prompts[2].truncate(5);
    prompts[5].truncate(5);
    let all: Vec<usize> = (0..prompts.len()).collect();
    let mut batched = Pool::new(prompts.clone(), teacher());
    let one = TeacherConfig {
        batch: 1,
        ..teacher()
    };
    let mut single = Pool::new(prompts, one);
    assert_eq!(batched.ensure(&model, &all).expect("batched"), 7);
    assert_eq!(single.ensure(&model, &all).expect("single"), 7);
    for i in all {
        let (a, b) = (batched.get(i).expect("a"), single.get(i).expect("b"));
        assert_eq!(
            (&a.tokens, &a.dists, a.prompt_len),
            (&b.tokens, &b.dists, b.prompt_len)
        );
        assert!(a.rows == b.rows, "rows of sample {i}");
    }
}

/// A pool with a store writes each sample it makes; another pool on that store reads them
/// back instead of generating (here from another target, whose samples would differ), and
/// remakes a damaged file.
#[test]
fn stored_samples_are_read_back_instead_of_made_again() {
    let (_dir, model) = tiny_target();
    let other_dir = tempfile::tempdir().expect("tempdir");
    write_hf(other_dir.path(), &tiny_config(), 8);
    let other = Gemma3::load(other_dir.path()).expect("other target");
    let store_dir = tempfile::tempdir().expect("tempdir");
    let store = SampleStore::new(store_dir.path()).expect("store");
    let (train, _) = pools(3, 1);
    let prompts = train.prompts().to_vec();
    let all = [0, 1, 2];
    let mut first = Pool::new(prompts.clone(), teacher()).with_store(store.clone());
    first.ensure(&model, &all).expect("made");
    let files: Vec<_> = std::fs::read_dir(store_dir.path())
        .expect("list")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 3);
    let mut again = Pool::new(prompts.clone(), teacher()).with_store(store.clone());
    assert_eq!(again.ensure(&other, &all).expect("read"), 3);
    for i in all {
        let (a, b) = (first.get(i).expect("a"), again.get(i).expect("b"));
        assert_eq!(
            (&a.tokens, &a.dists, &a.rows),
            (&b.tokens, &b.dists, &b.rows)
        );
    }
    std::fs::write(&files[0], b"damaged").expect("damage");
    let mut fresh = Pool::new(prompts.clone(), teacher());
    fresh.ensure(&other, &all).expect("other's samples");
    let mut mended = Pool::new(prompts, teacher()).with_store(store);
    mended.ensure(&other, &all).expect("mended");
    let remade = all
        .iter()
        .filter(|&&i| mended.get(i).expect("m").tokens == fresh.get(i).expect("f").tokens)
        .count();
    assert!(remade >= 1, "the damaged sample was not made again");
    assert!(std::fs::read(&files[0]).expect("read").len() > 100);
}

#[test]
fn teacher_forcing_a_generated_text_reproduces_its_sample() {
    let (_dir, model) = tiny_target();
    let (mut train, _) = pools(2, 1);
    train.ensure(&model, &[0]).expect("sample");
    let generated = train.get(0).expect("generated");
    let cfg = TeacherConfig {
        forced: true,
        ..teacher()
    };
    let scored = forced(&model, &generated.tokens, &cfg).expect("forced");
    assert_eq!(scored.prompt_len, generated.prompt_len);
    assert_eq!(scored.tokens, generated.tokens);
    assert_eq!(scored.dists, generated.dists);
    assert_eq!(bits(&scored.rows), bits(&generated.rows));
    assert!(forced(&model, &generated.tokens[..16], &cfg).is_err());
}

/// The teacher's forward on `DeviceGemma3` (here candle's CPU backend in f32, as it would
/// run on a GPU) gives the samples of the CPU kernels: the same continuations and kept ids,
/// taps and probabilities within float noise.
#[test]
fn a_device_teacher_makes_the_samples_of_the_cpu_kernels() {
    let (dir, model) = tiny_target();
    let opts = DeviceOptions::new(Device::Cpu, DType::F32);
    let device = DeviceGemma3::load(dir.path(), opts).expect("device target");
    let (mut on_cpu, _) = pools(6, 0);
    let mut on_device = Pool::new(on_cpu.prompts().to_vec(), teacher());
    let all: Vec<usize> = (0..on_cpu.len()).collect();
    assert_eq!(on_cpu.ensure(&model, &all).expect("cpu samples"), 6);
    assert_eq!(on_device.ensure(&device, &all).expect("device samples"), 6);
    for (a, b) in on_cpu.generated().iter().zip(on_device.generated()) {
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.rows.len(), b.rows.len());
        let rows = a.rows.iter().zip(&b.rows).map(|(x, y)| (x - y).abs());
        assert!(rows.fold(0f32, f32::max) < 1e-4);
        for (p, q) in a.dists.iter().zip(&b.dists) {
            assert_eq!(p.ids, q.ids);
            let probs = p.probs.iter().zip(&q.probs).map(|(x, y)| (x - y).abs());
            assert!(probs.fold(0f32, f32::max) < 1e-5);
        }
    }
}

/// A batch over sequences of two lengths: the shorter one's anchors score as they do alone
/// (its context is zero-padded past its end and masked).
#[test]
fn batches_mix_sequences_of_different_lengths() {
    use tandem_train::batch::{anchor_range, Anchor, BatchMaker};
    let (_dir, model) = tiny_target();
    let (train, _) = pools(2, 1);
    let mut prompts = train.prompts().to_vec();
    prompts[1].truncate(2);
    let mut pool = Pool::new(prompts, teacher());
    pool.ensure(&model, &[0, 1]).expect("samples");
    let samples = pool.generated();
    let vocab = frequent_ids(&samples, pool.prompts(), 64, 96);
    let d = drafter(&model, vocab, 2);
    let head = model.head();
    let rows = head.dense_rows(d.vocab().ids()).expect("rows");
    let maker = BatchMaker {
        head: &head,
        vocab: d.vocab(),
        gamma: d.config().gamma,
        device: &Device::Cpu,
    };
    let (long_end, short_mid) = (
        *anchor_range(samples[0], GAMMA).end(),
        *anchor_range(samples[1], GAMMA).start() + 1,
    );
    let short = Anchor {
        sample: 1,
        pos: short_mid,
    };
    let long = Anchor {
        sample: 0,
        pos: long_end,
    };
    let both = maker.make(&samples, &[long, short]).expect("mixed batch");
    let alone = maker.make(&samples, &[short]).expect("alone");
    let flat = |t: &candle_core::Tensor| -> Vec<f32> {
        t.flatten_all().expect("flat").to_vec1().expect("vec")
    };
    let mixed = d.forward_train(&both.0, &rows).expect("forward");
    let single = d.forward_train(&alone.0, &rows).expect("forward");
    let row1 = flat(&mixed.logits.narrow(0, 1, 1).expect("row"));
    let diff = row1
        .iter()
        .zip(flat(&single.logits))
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-5, "the short sequence's logits moved by {diff}");
    assert_eq!(
        flat(&both.1.probs.narrow(0, 1, 1).expect("row")),
        flat(&alone.1.probs)
    );
}

/// Sampled continuations (each prompt at the temperature its hash picks) are functions of
/// their prompts: batches of 4 and of 1 make the same samples, and so does `ensure_all`;
/// the sampled continuations leave the greedy ones, and they are kept apart in a store.
#[test]
fn sampled_continuations_do_not_depend_on_the_batch() {
    let (_dir, model) = tiny_target();
    let (train, _) = pools(9, 1);
    let mut prompts = train.prompts().to_vec();
    prompts[3].truncate(5);
    let all: Vec<usize> = (0..prompts.len()).collect();
    let sampled = TeacherConfig {
        temperatures: vec![0.7, 1.0, 0.0],
        seed: 5,
        ..teacher()
    };
    let mut batched = Pool::new(prompts.clone(), sampled.clone());
    let mut single = Pool::new(
        prompts.clone(),
        TeacherConfig {
            batch: 1,
            ..sampled.clone()
        },
    );
    let mut up_front = Pool::new(prompts.clone(), sampled.clone());
    let mut greedy = Pool::new(prompts.clone(), teacher());
    batched.ensure(&model, &all).expect("batched");
    single.ensure(&model, &all).expect("single");
    up_front
        .ensure_all(&model, 4, &mut |_| {})
        .expect("ensure_all");
    greedy.ensure(&model, &all).expect("greedy");
    let mut left_greedy = 0;
    for i in all {
        let (a, b, c) = (
            batched.get(i).expect("a"),
            single.get(i).expect("b"),
            up_front.get(i).expect("c"),
        );
        assert_eq!((&a.tokens, &a.dists), (&b.tokens, &b.dists));
        assert_eq!((&a.tokens, &a.dists), (&c.tokens, &c.dists));
        let g = greedy.get(i).expect("g");
        match sampled.temperature_of(&prompts[i]) {
            0.0 => assert_eq!(a.tokens, g.tokens, "a greedy prompt was sampled"),
            _ => left_greedy += usize::from(a.tokens != g.tokens),
        }
    }
    assert!(
        left_greedy > 0,
        "no sampled continuation differs from greedy"
    );

    let store_dir = tempfile::tempdir().expect("tempdir");
    let store = SampleStore::new(store_dir.path()).expect("store");
    let mut a = Pool::new(prompts.clone(), sampled).with_store(store.clone());
    a.ensure(&model, &[0, 1, 2]).expect("sampled");
    let mut b = Pool::new(prompts, teacher()).with_store(store);
    b.ensure(&model, &[0, 1, 2]).expect("greedy");
    let files = std::fs::read_dir(store_dir.path()).expect("list").count();
    let sampled_prompts = (0..3)
        .filter(|i| a.config().temperature_of(&a.prompts()[*i]) > 0.0)
        .count();
    assert_eq!(
        files,
        3 + sampled_prompts,
        "sampled and greedy samples share a file"
    );
}

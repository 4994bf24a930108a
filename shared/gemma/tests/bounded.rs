//! Bounded rows on the real Gemma 3 270M in `exact` precision ([`LogitsMode::Bounded`]):
//! every bound lies on or above its logit, one logit computed alone and the whole row are
//! the full head's bit for bit, and tokens drawn from the bounds
//! ([`tandem_core::draw_bounded`]) follow the softmax of the exact logits. A block's rows
//! ([`LogitsMode::BoundedAll`]) are each position's, as one forward of all logits gives
//! them, and chosen ids' logits together ([`BoundedRow::logits_of`]) are theirs too.

mod common;

use common::forward;
use tandem_gemma::{BoundedRow, ForwardOptions, Gemma3, LogitsMode};
use tandem_kernels::ArgmaxScreen;
use tandem_testkit::{real_gguf, real_tokenizer, Lcg};

/// The last position's exact logits and its bounded row, after `prompt`.
fn rows(m: &Gemma3, prompt: &[u32]) -> (Vec<f32>, Option<BoundedRow>) {
    let mut cache = m.new_cache(prompt.len());
    let mut other = m.new_cache(prompt.len());
    let z = forward(m, prompt, &mut cache, LogitsMode::Last);
    let opts = ForwardOptions {
        logits: LogitsMode::Bounded,
        taps: vec![],
    };
    let out = m.forward(prompt, 0, &mut other, &opts).expect("bounded");
    assert_eq!(out.bounded.len(), usize::from(ArgmaxScreen::available()));
    assert_eq!(out.logits.is_some(), !ArgmaxScreen::available());
    (z, out.bounded.into_iter().next())
}

#[test]
fn a_blocks_bounded_rows_are_its_positions() {
    let m = Gemma3::load(&real_gguf()).expect("load the real GGUF");
    let tok = tokenizers::Tokenizer::from_file(real_tokenizer()).expect("tokenizer");
    let mut prompt = vec![2];
    let text = "Dear Sam, thank you for the lovely weekend. The garden looked";
    prompt.extend(tok.encode(text, false).expect("encode").get_ids());
    let (context, block) = prompt.split_at(prompt.len() - 5);
    let mut all = m.new_cache(prompt.len());
    forward(&m, context, &mut all, LogitsMode::None);
    let mut bounded = all.clone();
    let z = forward(&m, block, &mut all, LogitsMode::All);
    let opts = ForwardOptions {
        logits: LogitsMode::BoundedAll,
        taps: vec![],
    };
    let out = m
        .forward(block, context.len(), &mut bounded, &opts)
        .expect("bounded");
    if !ArgmaxScreen::available() {
        assert!(out.bounded.is_empty(), "no screen: logits rows");
        assert_eq!(out.logits.expect("logits").dims2().expect("rows").0, 5);
        return;
    }
    assert_eq!(out.bounded.len(), block.len());
    let vocab = z.len() / block.len();
    let mut rng = Lcg::new(11);
    for (row, z) in out.bounded.iter().zip(z.chunks_exact(vocab)) {
        assert!(row.upper.iter().zip(z).all(|(u, z)| u >= z));
        let ids = rng.tokens(20, vocab);
        let got = row.logits_of(&ids).expect("logits");
        for (id, g) in ids.iter().zip(got) {
            assert_eq!(g.to_bits(), z[*id as usize].to_bits(), "id {id}");
        }
    }
}

#[test]
fn bounds_hold_and_draws_follow_the_exact_softmax() {
    let m = Gemma3::load(&real_gguf()).expect("load the real GGUF");
    let mut rng = Lcg::new(7);
    let tok = tokenizers::Tokenizer::from_file(real_tokenizer()).expect("tokenizer");
    let texts = [
        "The old lighthouse keeper climbed the stairs and",
        "<start_of_turn>user\nWhat should I cook tonight?<end_of_turn>\n<start_of_turn>model\n",
        "def fibonacci(n):\n    if n < 2:\n",
    ];
    for text in texts {
        let mut prompt = vec![2];
        prompt.extend(tok.encode(text, false).expect("encode").get_ids());
        let (z, Some(row)) = rows(&m, &prompt) else {
            return;
        };
        assert!(!row.exact, "a finite row is screened");
        for (j, (u, z)) in row.upper.iter().zip(&z).enumerate() {
            assert!(u >= z, "id {j}: bound {u} below logit {z}");
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&row.logits().expect("row")), bits(&z));
        for id in rng.tokens(64, z.len()) {
            let got = row.logit(id).expect("logit");
            assert_eq!(got.to_bits(), z[id as usize].to_bits(), "id {id}");
        }
        draws_follow(&row, &z, 1.0, 4_000, &mut rng);
    }
}

/// `n` draws at `t` from `row`: the share of each of the three likeliest ids lies within
/// five standard deviations of its exact probability.
fn draws_follow(row: &BoundedRow, z: &[f32], t: f32, n: usize, rng: &mut Lcg) {
    let max = z.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let w: Vec<f64> = z
        .iter()
        .map(|&v| (f64::from(v - max) / f64::from(t)).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut order: Vec<usize> = (0..z.len()).collect();
    order.sort_by(|&a, &b| z[b].total_cmp(&z[a]));
    let mut counts = [0usize; 3];
    for _ in 0..n {
        let exact = |id: u32| row.logit(id).expect("logit");
        let id =
            tandem_core::draw_bounded(&row.upper, t, exact, || (f64::from(rng.next()) + 1.0) / 2.0)
                .expect("a token");
        if let Some(k) = order[..3].iter().position(|&j| j == id as usize) {
            counts[k] += 1;
        }
    }
    for (k, &c) in counts.iter().enumerate() {
        let p = w[order[k]] / total;
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        let share = c as f64 / n as f64;
        assert!(
            (share - p).abs() <= 5.0 * sd,
            "id {}: drawn {share:.4}, probability {p:.4}",
            order[k]
        );
    }
}

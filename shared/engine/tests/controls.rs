//! Logit controls and log-probabilities on the real Gemma 3 270M: greedy decoding with
//! repetition, presence and frequency penalties equals a reference that steps the model one
//! token at a time and applies the penalties as transformers and OpenAI define them
//! (written here, apart from the engine's); speculative decoding with those controls,
//! min_tokens and stop token ids emits the plain output token for token; log-probabilities
//! are one per token, normalised, equal in both paths.

mod common;

use std::collections::HashMap;

use tandem_core::{Penalties, SnapshotSpec};
use tandem_engine::GenerationRequest;
use tandem_gemma::LogitsMode;

use common::{engine, generate, request, spec_270m, Oracle, Spoil};

const NEW: usize = 24;

/// Greedy continuation of `prompt` with `p`, one forward per token, penalties applied by
/// their definitions: repetition over prompt and output (divide positive logits, multiply
/// negative ones), presence and frequency over the output.
fn stepped(prompt: &[u32], p: Penalties, new: usize) -> Vec<u32> {
    let model = engine().model();
    let mut seq = model.start(prompt.len() + new + 1);
    let none = SnapshotSpec::default();
    let mut out: Vec<u32> = Vec::new();
    let mut feed = prompt.to_vec();
    for _ in 0..new {
        let step = seq
            .forward(&feed, seq.len(), LogitsMode::Last, &none)
            .expect("forward");
        let mut logits: Vec<f32> = step
            .logits
            .expect("logits")
            .squeeze(0)
            .expect("one row")
            .to_vec1()
            .expect("host");
        let mut counts: HashMap<u32, f32> = HashMap::new();
        out.iter()
            .for_each(|t| *counts.entry(*t).or_default() += 1.0);
        let mut seen: Vec<u32> = prompt.iter().chain(&out).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            let l = &mut logits[t as usize];
            *l = if *l > 0.0 {
                *l / p.repetition
            } else {
                *l * p.repetition
            };
        }
        for (t, n) in counts {
            logits[t as usize] -= p.frequency * n + p.presence;
        }
        let next = tandem_core::argmax(&logits);
        out.push(next);
        feed = vec![next];
    }
    out
}

fn penalised(prompt: &str) -> GenerationRequest {
    GenerationRequest {
        penalties: Penalties {
            repetition: 1.3,
            presence: 0.4,
            frequency: 0.3,
        },
        ..request(prompt, NEW, 0)
    }
}

#[test]
fn greedy_penalties_follow_their_definitions_and_change_the_output() {
    for prompt in ["1, 2, 3, 4,", "Monday, Tuesday, Wednesday,"] {
        let req = penalised(prompt);
        let got = generate(&req, None).0.tokens;
        assert_eq!(got, stepped(&req.prompt, req.penalties, NEW), "{prompt:?}");
        let free = generate(&request(prompt, NEW, 0), None).0.tokens;
        assert_ne!(got, free, "{prompt:?}: the penalties changed nothing");
    }
}

#[test]
fn speculation_with_controls_emits_the_plain_output() {
    for prompt in [
        "1, 2, 3, 4,",
        "The quick brown fox",
        "Here is a shopping list:\n- eggs\n- milk\n-",
    ] {
        let mut base = penalised(prompt);
        base.min_tokens = 6;
        base.ignore_eos = false;
        base.logprobs = Some(3);
        let plain = generate(&base, None).0;
        // A stop id the plain output emits after min_tokens (and not before) ends it there.
        let stop_at = *plain.tokens[6..]
            .iter()
            .find(|t| !plain.tokens[..6].contains(t))
            .expect("a new token after the sixth");
        let req = GenerationRequest {
            stop_token_ids: vec![stop_at],
            ..base.clone()
        };
        let (plain, plain_updates) = generate(&req, None);
        let cut = plain.tokens.iter().skip(5).position(|t| *t == stop_at);
        assert_eq!(Some(plain.tokens.len()), cut.map(|i| i + 6), "{prompt:?}");
        assert_eq!(plain.finish, tandem_core::FinishReason::Stop);
        let mut reference = req.prompt.clone();
        reference.extend(&plain.tokens);
        let oracle = Oracle {
            reference,
            spoil: Spoil::Rotating,
            spec: spec_270m(),
            max_gamma: 8,
        };
        let (spec, spec_updates) = generate(
            &GenerationRequest {
                gamma: 6,
                ..req.clone()
            },
            Some(&oracle),
        );
        assert_eq!(spec.tokens, plain.tokens, "{prompt:?}");
        assert_eq!(spec.finish, plain.finish);
        assert!(spec.spec.accepted_tokens > 0);
        let logprobs = |u: &[tandem_engine::Update]| {
            u.iter()
                .flat_map(|u| u.logprobs.clone())
                .collect::<Vec<_>>()
        };
        let (a, b) = (logprobs(&plain_updates), logprobs(&spec_updates));
        assert_eq!(a.len(), plain.tokens.len());
        assert_eq!(
            a, b,
            "{prompt:?}: log-probabilities differ between the paths"
        );
        for lp in &a {
            assert_eq!(lp.top.len(), 3);
            assert!(lp.logprob <= 0.0 && lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            let mass: f32 = lp.top.iter().map(|t| t.1.exp()).sum();
            assert!(mass <= 1.0 + 1e-5);
        }
    }
}

#[test]
fn unpenalised_logprobs_name_the_greedy_token_first() {
    let req = GenerationRequest {
        logprobs: Some(1),
        ..request("The capital of France is", 12, 0)
    };
    let (out, updates) = generate(&req, None);
    let lps: Vec<_> = updates.iter().flat_map(|u| u.logprobs.clone()).collect();
    for (t, lp) in out.tokens.iter().zip(&lps) {
        assert_eq!(lp.top[0].0, *t);
        assert_eq!(lp.top[0].1, lp.logprob);
    }
    assert_eq!(lps.len(), 12);
}

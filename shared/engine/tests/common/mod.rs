//! Shared helpers of the engine's tests: the real Gemma 3 270M (fetched by
//! scripts/fetch-models.sh; tests never download), prompts, and test proposers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tandem_core::{
    DraftBlock, ProposeError, ProposeRequest, Proposer, ProposerSession, SamplingParams,
    SnapshotRows, SnapshotSpec,
};
use tandem_engine::{Engine, GenerationRequest, Outcome, Placement, TargetFiles, Update};
use tandem_testkit::{real_gguf, real_tokenizer};

/// The real target and tokenizer, loaded once per test binary.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let files = TargetFiles {
            model: real_gguf(),
            tokenizer: real_tokenizer(),
        };
        Engine::load(&files, &Placement::Cpu(Default::default())).expect("the real target")
    })
}

/// Twenty prompts of different kinds: prose, lists, code, dialogue, numbers.
pub const PROMPTS: [&str; 20] = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Q: What is the boiling point of water at sea level?\nA:",
    "import numpy as np\n\nx = np.linspace(0, 1, 100)\n",
    "Dear hiring manager,\n\nI am writing to apply for",
    "The mitochondria is the powerhouse of",
    "SELECT name, email FROM users WHERE",
    "Photosynthesis converts sunlight into",
    "Here is a shopping list:\n- eggs\n- milk\n-",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n",
    "To make a cup of tea, first",
    "User: Can you recommend a good book?\nAssistant:",
    "The Pythagorean theorem states that",
    "<html>\n<head>\n<title>",
    "Monday, Tuesday, Wednesday,",
];

pub fn request(prompt: &str, max_tokens: usize, gamma: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: engine().tokenizer().encode(prompt, true).expect("encode"),
        max_tokens,
        ignore_eos: true,
        gamma,
        ..GenerationRequest::default()
    }
}

/// Runs a generation and collects every update.
pub fn generate(
    req: &GenerationRequest,
    proposer: Option<&dyn Proposer>,
) -> (Outcome, Vec<Update>) {
    let mut updates = Vec::new();
    let out = engine()
        .generate(req, proposer, &mut |u: &Update| {
            updates.push(u.clone());
            std::ops::ControlFlow::Continue(())
        })
        .expect("generate");
    (out, updates)
}

/// Prompt ++ plain greedy continuation of `new_tokens` (EOS ignored), computed once per
/// test binary.
pub fn reference(prompt: &str, new_tokens: usize) -> Vec<u32> {
    type Refs = Mutex<HashMap<(String, usize), Vec<u32>>>;
    static CACHE: OnceLock<Refs> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (prompt.to_string(), new_tokens);
    if let Some(r) = cache.lock().expect("lock").get(&key) {
        return r.clone();
    }
    let req = request(prompt, new_tokens, 0);
    let plain = generate(&req, None).0;
    assert_eq!(plain.tokens.len(), new_tokens, "{prompt:?}");
    let mut r = req.prompt;
    r.extend(plain.tokens);
    cache.lock().expect("lock").insert(key, r.clone());
    r
}

/// How an [`Oracle`] spoils its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spoil {
    /// Never: every round accepts the whole block.
    Never,
    /// In round `r`, the token at index `r % (γ + 1)` (none when that is γ): accept-all,
    /// reject-first and partial rounds in turn.
    Rotating,
}

/// A test proposer that knows the target's own continuation (`reference` = prompt ++
/// plain greedy output) and drafts it, possibly spoiled. It checks that the engine sends
/// snapshot rows in order and exactly once.
pub struct Oracle {
    pub reference: Vec<u32>,
    pub spoil: Spoil,
    pub spec: SnapshotSpec,
    pub max_gamma: usize,
}

struct OracleSession {
    reference: Vec<u32>,
    spoil: Spoil,
    width: usize,
    received: usize,
    round: usize,
    greedy: bool,
}

impl Proposer for Oracle {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.spec.clone()
    }
    fn max_gamma(&self) -> usize {
        self.max_gamma
    }
    fn open(&self, sampling: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        Ok(Box::new(OracleSession {
            reference: self.reference.clone(),
            spoil: self.spoil,
            width: self.spec.row_width(),
            received: 0,
            round: 0,
            greedy: sampling.is_greedy(),
        }))
    }
}

impl ProposerSession for OracleSession {
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError> {
        assert_eq!(
            rows.start, self.received,
            "rows arrive in order, exactly once"
        );
        assert_eq!(rows.width, self.width);
        assert!(rows.data.iter().all(|x| x.is_finite()));
        self.received += rows.rows();
        Ok(())
    }

    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        assert_eq!(
            req.position, self.received,
            "the anchor sits after the committed rows"
        );
        if self.greedy {
            assert_eq!(
                self.reference.get(req.position),
                Some(&req.anchor),
                "anchor is the target's"
            );
        }
        let mut tokens: Vec<u32> = (1..=req.gamma)
            .map(|i| self.reference.get(req.position + i).copied().unwrap_or(0))
            .collect();
        if self.spoil == Spoil::Rotating {
            if let Some(t) = tokens.get_mut(self.round % (req.gamma + 1)) {
                *t = (*t + 1) % 1000;
            }
        }
        self.round += 1;
        Ok(DraftBlock::point_masses(tokens, 1.0))
    }
}

/// The snapshot a DSpark drafter for the 270M would ask for.
pub fn spec_270m() -> SnapshotSpec {
    SnapshotSpec::taps(&[5, 11, 17, 18], 640)
}

//! Top-k sampling verified through the target's screen (`LogitsMode::Top`: per block row
//! only the logits that can rank among the k largest, on the real Gemma 3 270M where the
//! CPU runs the screen) emits, token for token, what verifying against every logit emits:
//! the same seeds, drafts, acceptances and residual draws. Greedy rounds (`Top(1)`: each
//! row's first maximum) are held to the full logits the same way.

mod common;

use std::sync::Arc;

use tandem_core::TargetIdentity;
use tandem_core::{SamplingParams, SnapshotSpec, SnapshotSupport};
use tandem_engine::{
    Engine, GenerationRequest, Result, Target, TargetFacts, TargetSequence, TargetStep,
};
use tandem_gemma::{LogitsMode, TargetHead};

use common::{engine, generate, request, spec_270m, Oracle, Spoil};

/// A target that answers every block with all logits.
struct FullLogits(Arc<dyn Target>);

struct FullSequence<'a>(Box<dyn TargetSequence + 'a>);

impl Target for FullLogits {
    fn facts(&self) -> TargetFacts {
        self.0.facts()
    }
    fn identity(&self) -> Result<TargetIdentity> {
        self.0.identity()
    }
    fn snapshot_support(&self) -> SnapshotSupport {
        self.0.snapshot_support()
    }
    fn head(&self) -> Option<TargetHead> {
        self.0.head()
    }
    fn start(&self, max_len: usize) -> Box<dyn TargetSequence + '_> {
        Box::new(FullSequence(self.0.start(max_len)))
    }
}

impl TargetSequence for FullSequence<'_> {
    fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        logits: LogitsMode,
        spec: &SnapshotSpec,
    ) -> Result<TargetStep> {
        let logits = match logits {
            LogitsMode::Top(_) => LogitsMode::All,
            other => other,
        };
        let step = self.0.forward(tokens, pos, logits, spec)?;
        assert!(step.top.is_none());
        Ok(step)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn max_len(&self) -> usize {
        self.0.max_len()
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.0.truncate(len)
    }
}

#[test]
fn screened_verification_emits_what_every_logit_emits() {
    let full = Engine::new(
        Arc::new(FullLogits(Arc::clone(engine().model()))),
        Arc::clone(engine().tokenizer()),
    );
    for (prompt, seed) in [("Once upon a time", 3), ("The three primary colors are", 5)] {
        let greedy = request(prompt, 32, 0);
        let mut reference = greedy.prompt.clone();
        reference.extend(generate(&greedy, None).0.tokens);
        let oracle = Oracle {
            reference,
            spoil: Spoil::Rotating,
            spec: spec_270m(),
            max_gamma: 8,
        };
        for (top_k, temperature) in [(Some(40), 0.8), (Some(3), 1.2), (None, 0.0)] {
            let req = GenerationRequest {
                sampling: SamplingParams {
                    temperature,
                    top_k,
                    top_p: 0.95,
                    seed,
                },
                ..request(prompt, 32, 6)
            };
            let want = full
                .generate(&req, Some(&oracle), &mut |_| {
                    std::ops::ControlFlow::Continue(())
                })
                .expect("generate")
                .tokens;
            let (got, _) = generate(&req, Some(&oracle));
            assert_eq!(
                got.tokens, want,
                "{prompt:?} top_k={top_k:?} T={temperature}"
            );
            assert!(got.spec.drafts > 0);
        }
    }
}

//! The plan of one generation, made once when its request is checked against the target:
//! the draft-length cap its rounds draft up to and the KV cache it may hold. A server admits
//! the request by the plan's cache size and the engine runs the same plan, so both use one
//! computation of each rule.

use crate::error::{EngineError, Result};
use crate::models::TargetFacts;
use crate::request::GenerationRequest;

/// A checked request and the figures it runs with. Made by [`crate::Engine::plan`]; the
/// only form of a request [`crate::Engine::run`] takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    request: GenerationRequest,
    gamma: usize,
    cache_positions: usize,
    cache_bytes: usize,
}

impl Plan {
    /// Checks `request` against a target with `facts` and plans it for a proposer that
    /// drafts at most `max_gamma` tokens a round (0: plain decoding).
    pub(crate) fn new(
        request: GenerationRequest,
        facts: &TargetFacts,
        max_gamma: usize,
    ) -> Result<Self> {
        request.validate()?;
        check_against(&request, facts)?;
        let gamma = drafting_gamma(request.gamma, max_gamma);
        let cache_positions = request.prompt.len() + request.max_tokens + gamma + 1;
        let cache_positions = cache_positions.min(facts.max_context);
        Ok(Self {
            cache_bytes: cache_positions * facts.kv_bytes_per_position,
            request,
            gamma,
            cache_positions,
        })
    }

    /// The request.
    pub fn request(&self) -> &GenerationRequest {
        &self.request
    }

    /// Most tokens a round drafts (0: plain decoding).
    pub fn gamma(&self) -> usize {
        self.gamma
    }

    /// Positions the generation's cache may need: the prompt, every new token and one
    /// block of drafts beyond them, within the model's context.
    pub fn cache_positions(&self) -> usize {
        self.cache_positions
    }

    /// Most KV-cache bytes the generation holds while it runs (the cache grows as
    /// positions commit; this is its ceiling).
    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }
}

/// The draft length rounds may use: what the request asks for, never more than the
/// proposer drafts (`proposer_max`, 0 without one).
pub fn drafting_gamma(requested: usize, proposer_max: usize) -> usize {
    requested.min(proposer_max)
}

/// The checks that need the target: every prompt token in its vocabulary, prompt and new
/// tokens within its context.
fn check_against(request: &GenerationRequest, facts: &TargetFacts) -> Result<()> {
    let invalid = |m: String| Err(EngineError::InvalidRequest(m));
    for (what, ids) in [
        ("prompt", &request.prompt),
        ("stop", &request.stop_token_ids),
    ] {
        if let Some(t) = ids.iter().find(|t| **t as usize >= facts.vocab_size) {
            return invalid(format!(
                "{what} token {t} is outside the vocabulary of {}",
                facts.vocab_size
            ));
        }
    }
    let context = facts.max_context;
    if request.prompt.len().saturating_add(request.max_tokens) > context {
        return invalid(format!(
            "prompt ({} tokens) + max_tokens ({}) exceeds the context limit of {context}",
            request.prompt.len(),
            request.max_tokens
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> TargetFacts {
        TargetFacts {
            vocab_size: 100,
            num_layers: 2,
            hidden_size: 8,
            max_context: 64,
            kv_bytes_per_position: 10,
        }
    }

    fn request(prompt: usize, max_tokens: usize, gamma: usize) -> GenerationRequest {
        GenerationRequest {
            prompt: vec![1; prompt],
            max_tokens,
            gamma,
            ..GenerationRequest::default()
        }
    }

    #[test]
    fn the_cache_holds_prompt_new_tokens_and_one_block_within_the_context() {
        let plan = Plan::new(request(10, 20, 8), &facts(), 4).expect("plan");
        assert_eq!(plan.gamma(), 4, "capped by the proposer");
        assert_eq!(plan.cache_positions(), 10 + 20 + 4 + 1);
        assert_eq!(plan.cache_bytes(), 35 * 10);
        let plain = Plan::new(request(10, 20, 8), &facts(), 0).expect("plan");
        assert_eq!((plain.gamma(), plain.cache_positions()), (0, 31));
        let full = Plan::new(request(10, 54, 8), &facts(), 8).expect("plan");
        assert_eq!(full.cache_positions(), 64, "never past the context");
    }

    #[test]
    fn requests_the_target_cannot_run_are_refused_with_the_reason() {
        let refused =
            |r: GenerationRequest| Plan::new(r, &facts(), 8).expect_err("refused").to_string();
        assert!(refused(request(10, 55, 0)).contains("exceeds the context limit of 64"));
        assert!(refused(request(1, usize::MAX, 0)).contains("context limit"));
        let mut outside = request(3, 4, 0);
        outside.prompt[1] = 100;
        assert!(refused(outside).contains("outside the vocabulary of 100"));
        assert!(refused(request(0, 4, 0)).contains("prompt is empty"));
        assert!(refused(request(3, 0, 0)).contains("max_tokens"));
    }
}

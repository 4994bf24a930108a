//! The logit controls `tandem generate` offers beyond temperature, top-k and top-p, for a
//! generation in process and for one sent to a verifier.

use clap::Args;
use tandem_core::Penalties;
use tandem_engine::GenerationRequest;
use tandem_proto::v1 as pb;

/// Penalties, min-p, min_tokens and stop token ids.
#[derive(Args, Debug, Clone, Default)]
pub struct ControlArgs {
    /// Drop tokens less likely than this fraction of the most likely one (after temperature).
    #[arg(long)]
    min_p: Option<f32>,
    /// Penalise tokens of the prompt and the output (1: off; above 1 repeats less).
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Subtract from the logit of every token the output holds (-2 to 2).
    #[arg(long)]
    presence_penalty: Option<f32>,
    /// Subtract, times its count in the output, from every token's logit (-2 to 2).
    #[arg(long)]
    frequency_penalty: Option<f32>,
    /// Generate at least this many tokens before end-of-sequence or a stop.
    #[arg(long)]
    min_tokens: Option<u32>,
    /// A token id that ends the generation (repeatable).
    #[arg(long = "stop-token-id")]
    stop_token_ids: Vec<u32>,
}

impl ControlArgs {
    /// Sets the controls on an engine request.
    pub fn apply(&self, req: &mut GenerationRequest) {
        let d = Penalties::default();
        req.penalties = Penalties {
            repetition: self.repetition_penalty.unwrap_or(d.repetition),
            presence: self.presence_penalty.unwrap_or(d.presence),
            frequency: self.frequency_penalty.unwrap_or(d.frequency),
        };
        req.min_p = self.min_p.unwrap_or(0.0);
        req.min_tokens = self.min_tokens.unwrap_or(0) as usize;
        req.stop_token_ids = self.stop_token_ids.clone();
    }

    /// Sets the controls on a wire request (its sampling parameters already there).
    pub fn apply_pb(&self, req: &mut pb::GenerateRequest) {
        let sampling = req.sampling.get_or_insert_with(Default::default);
        sampling.min_p = self.min_p;
        sampling.repetition_penalty = self.repetition_penalty;
        sampling.presence_penalty = self.presence_penalty;
        sampling.frequency_penalty = self.frequency_penalty;
        req.min_tokens = self.min_tokens;
        req.stop_token_ids = self.stop_token_ids.clone();
    }
}

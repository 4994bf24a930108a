//! Which drafter the CLI runs: a DSpark checkpoint directory, or a randomly initialised
//! small DSpark drafter (acceptance near zero; speculation stays lossless).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tandem_dspark::{Dspark, DsparkConfig, DsparkProposer, TargetDims};
use tandem_gemma::TargetHead;

/// Drafter selection flags.
#[derive(Args, Debug, Clone)]
pub struct DrafterArgs {
    /// DSpark drafter: a checkpoint directory, or `random` for a randomly initialised small
    /// drafter.
    #[arg(long, env = "TANDEM_DRAFTER", default_value = "random")]
    pub drafter: String,
    /// Seed of a random drafter's weights.
    #[arg(long, default_value_t = 0)]
    pub drafter_seed: u64,
}

impl DrafterArgs {
    /// Loads (or initialises) the drafter for the target whose head is `head`.
    pub fn load(&self, head: &TargetHead) -> Result<Arc<Dspark>> {
        let model = if self.drafter == "random" {
            let cfg = DsparkConfig::small(&TargetDims::of(head));
            Dspark::init(cfg, head, self.drafter_seed)?
        } else {
            let dir = Path::new(&self.drafter);
            Dspark::load(dir, head).with_context(|| format!("loading drafter {}", dir.display()))?
        };
        Ok(Arc::new(model))
    }

    /// The drafter as a proposer over `head`.
    pub fn proposer(&self, head: &TargetHead) -> Result<Arc<DsparkProposer>> {
        let model = self.load(head)?;
        Ok(Arc::new(DsparkProposer::new(model, head)?))
    }
}

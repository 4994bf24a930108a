//! Which drafter the CLI runs: the DSpark drafter shipped in this repository for Gemma 3
//! 270M (`drafters/gemma-3-270m-dspark`, the default), a DSpark checkpoint directory, or a
//! randomly initialised small DSpark drafter (acceptance near zero; speculation stays
//! lossless).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_dspark::{Dspark, DsparkConfig, DsparkProposer, TargetDims};
use tandem_gemma::TargetHead;

/// Drafter selection flags.
#[derive(Args, Debug, Clone)]
pub struct DrafterArgs {
    /// DSpark drafter: `shipped` (the drafter trained for Gemma 3 270M that ships in this
    /// repository), a checkpoint directory, or `random` for a randomly initialised small
    /// drafter.
    #[arg(long, env = "TANDEM_DRAFTER", default_value = SHIPPED)]
    pub drafter: String,
    /// Seed of a random drafter's weights.
    #[arg(long, default_value_t = 0)]
    pub drafter_seed: u64,
}

/// The `--drafter` value naming the shipped drafter.
pub const SHIPPED: &str = "shipped";

/// Where the shipped drafter lives: `drafters/gemma-3-270m-dspark` of the source tree this
/// binary was built from (container images put it there too).
fn shipped_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/gemma-3-270m-dspark")
}

impl DrafterArgs {
    /// Loads (or initialises) the drafter for the target whose head is `head`.
    pub fn load(&self, head: &TargetHead) -> Result<Arc<Dspark>> {
        let model = match self.drafter.as_str() {
            "random" => {
                let cfg = DsparkConfig::small(&TargetDims::of(head));
                Dspark::init(cfg, head, self.drafter_seed)?
            }
            SHIPPED => {
                let dir = shipped_dir();
                if !dir.join("dspark.json").is_file() {
                    bail!(
                        "the shipped drafter is not at {}: pass --drafter DIR or --drafter random",
                        dir.display()
                    );
                }
                Dspark::load(&dir, head).context("loading the shipped drafter")?
            }
            path => {
                let dir = Path::new(path);
                Dspark::load(dir, head)
                    .with_context(|| format!("loading drafter {}", dir.display()))?
            }
        };
        Ok(Arc::new(model))
    }

    /// The drafter as a proposer over `head`.
    pub fn proposer(&self, head: &TargetHead) -> Result<Arc<DsparkProposer>> {
        let model = self.load(head)?;
        Ok(Arc::new(DsparkProposer::new(model, head)?))
    }
}

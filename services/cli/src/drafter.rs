//! Which drafter the CLI runs, chosen by what `--drafter` names: `shipped` (the default: the
//! DSpark drafter trained for Gemma 3 270M in `drafters/gemma-3-270m-dspark`), a Gemma 4
//! assistant directory (its config.json says `gemma4_assistant`; the target must be the
//! Gemma 4 HF directory given as `--model`), a DSpark checkpoint directory, or `random`, a
//! randomly initialised small DSpark drafter (acceptance near zero; speculation stays
//! lossless).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Args;
use tandem_assistant::{AssistantOptions, AssistantProposer};
use tandem_core::calibration::Calibration;
use tandem_core::{Proposer, TargetIdentity};
use tandem_dspark::{DraftBatching, Dspark, DsparkConfig, DsparkProposer, TargetDims};
use tandem_gemma::TargetHead;

use crate::models::ModelArgs;

/// Drafter selection flags.
#[derive(Args, Debug, Clone)]
pub struct DrafterArgs {
    /// The drafter: `shipped` (the DSpark drafter trained for Gemma 3 270M that ships in
    /// this repository), a Gemma 4 assistant directory, a DSpark checkpoint directory, or
    /// `random` for a randomly initialised small DSpark drafter.
    #[arg(long, env = "TANDEM_DRAFTER", default_value = SHIPPED)]
    pub drafter: String,
    /// Seed of a random drafter's weights.
    #[arg(long, default_value_t = 0)]
    pub drafter_seed: u64,
    /// Draft with the model alone, without first looking the anchor up in the context
    /// (prompt and output): neither a DSpark drafter nor, in process, the round does.
    #[arg(long)]
    pub no_lookup: bool,
    /// Send a DSpark drafter's raw confidences even when it has a calibration
    /// (`tandem calibrate`).
    #[arg(long)]
    pub no_calibration: bool,
    /// A host DSpark drafter drafts each session's block alone instead of drafting the
    /// blocks of sessions that ask at once in one pass.
    #[arg(long)]
    pub no_draft_batching: bool,
    /// The longest a batched drafting step waits for sessions that have not asked yet.
    #[arg(long, default_value_t = DraftBatching::default().max_wait.as_secs_f64() * 1e3, value_name = "MS")]
    pub draft_batch_wait_ms: f64,
    /// The most blocks one batched drafting step drafts.
    #[arg(long, default_value_t = DraftBatching::default().max_sessions, value_name = "N")]
    pub draft_batch_max: usize,
}

/// The `--drafter` value naming the shipped drafter.
pub const SHIPPED: &str = "shipped";

/// Where the shipped drafter lives: `drafters/gemma-3-270m-dspark` of the source tree this
/// binary was built from (container images put it there too).
fn shipped_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/gemma-3-270m-dspark")
}

impl DrafterArgs {
    /// The directory of the DSpark checkpoint `--drafter` names (none for `random`).
    pub fn dir(&self) -> Result<Option<PathBuf>> {
        let dir = match self.drafter.as_str() {
            "random" => return Ok(None),
            SHIPPED => shipped_dir(),
            path => PathBuf::from(path),
        };
        if self.drafter == SHIPPED && !dir.join("dspark.json").is_file() {
            bail!(
                "the shipped drafter is not at {}: pass --drafter DIR or --drafter random",
                dir.display()
            );
        }
        Ok(Some(dir))
    }

    /// Loads (or initialises) the drafter for the target whose head is `head`.
    pub fn load(&self, head: &TargetHead) -> Result<Arc<Dspark>> {
        let model = match self.dir()? {
            None => {
                let cfg = DsparkConfig::small(&TargetDims::of(head));
                Dspark::init(cfg, head, self.drafter_seed)?
            }
            Some(dir) => Dspark::load(&dir, head)
                .with_context(|| format!("loading drafter {}", dir.display()))?,
        };
        Ok(Arc::new(model))
    }

    /// The calibration of the DSpark drafter `--drafter` names, unless switched off.
    pub fn calibration(&self) -> Result<Option<Calibration>> {
        match (self.dir()?, self.no_calibration) {
            (Some(dir), false) => tandem_dspark::load_calibration(&dir)
                .with_context(|| format!("loading the calibration of {}", dir.display())),
            _ => Ok(None),
        }
    }

    /// The drafter as a proposer over `head`, on `device` (the host when `None`; the flag
    /// says whether its steps are captured as CUDA graphs there).
    pub fn proposer(
        &self,
        head: &TargetHead,
        device: Option<(&Device, bool)>,
    ) -> Result<Arc<dyn Proposer>> {
        let model = self.load(head)?;
        let (lookup, calibration) = (!self.no_lookup, self.calibration()?);
        Ok(match device {
            Some((d, graphs)) => Arc::new(
                DsparkProposer::on_device(model, head, d, graphs)?
                    .with_lookup(lookup)
                    .with_calibration(calibration),
            ),
            None if !self.no_draft_batching => Arc::new(
                DsparkProposer::batched(model, head, self.batching()?)?
                    .with_lookup(lookup)
                    .with_calibration(calibration),
            ),
            None => Arc::new(
                DsparkProposer::new(model, head)?
                    .with_lookup(lookup)
                    .with_calibration(calibration),
            ),
        })
    }

    /// How a batched host drafter forms its steps.
    fn batching(&self) -> Result<DraftBatching> {
        let ms = self.draft_batch_wait_ms;
        if !(0.0..=1000.0).contains(&ms) {
            bail!("--draft-batch-wait-ms must be between 0 and 1000, got {ms}");
        }
        if self.draft_batch_max == 0 {
            bail!("--draft-batch-max must be at least 1");
        }
        Ok(DraftBatching {
            max_sessions: self.draft_batch_max,
            max_wait: Duration::from_secs_f64(ms / 1000.0),
        })
    }
}

/// A drafter ready to serve, with what it was made for.
pub struct LoadedDrafter {
    /// The proposer.
    pub proposer: Arc<dyn Proposer>,
    /// The target it drafts for.
    pub target: TargetIdentity,
    /// Its kind, as Info reports it.
    pub kind: &'static str,
}

impl DrafterArgs {
    /// Whether `--drafter` names a Gemma 4 assistant directory.
    pub fn is_assistant(&self) -> Result<bool> {
        let dir = Path::new(&self.drafter);
        Ok(dir.is_dir() && tandem_engine::model_type(dir)?.as_deref() == Some("gemma4_assistant"))
    }

    /// Loads whichever drafter `--drafter` names for the target of `models`; a DSpark
    /// drafter scores through `head` (the loaded target's) or, without one, through the
    /// head read from the target file, and runs where `--device` says.
    pub fn load_any(&self, models: &ModelArgs, head: Option<TargetHead>) -> Result<LoadedDrafter> {
        if self.is_assistant()? {
            models.cpu_kernels()?;
            let (dir, target) = (Path::new(&self.drafter), models.model_path()?);
            let calibration = match self.no_calibration {
                true => None,
                false => tandem_assistant::load_calibration(dir)?,
            };
            let p = AssistantProposer::load(dir, &target, AssistantOptions::default())
                .with_context(|| format!("loading assistant drafter {}", dir.display()))?
                .with_calibration(calibration);
            return Ok(LoadedDrafter {
                target: p.target().clone(),
                proposer: Arc::new(p),
                kind: "gemma4-assistant",
            });
        }
        let head = match head {
            Some(h) => h,
            None => models.load_head()?,
        };
        let device = models.candle_device()?;
        Ok(LoadedDrafter {
            target: head.identity()?,
            proposer: self.proposer(&head, device.as_ref().map(|d| (d, models.cuda_graphs)))?,
            kind: "dspark",
        })
    }
}

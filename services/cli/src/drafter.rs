//! Which drafter the CLI runs, chosen by what `--drafter` names: `shipped` (the default: the
//! routed set of DSpark drafters for Gemma 3 270M in `drafters/gemma-3-270m-router`), a
//! routed set's folder (its `router.json` names the drafters,
//! [`tandem_dspark::RouterManifest`]), a Gemma 4 assistant directory (its config.json says
//! `gemma4_assistant`; the target must be the Gemma 4 HF directory given as `--model`), a
//! DSpark checkpoint directory, or `random`, a randomly initialised small DSpark drafter
//! (acceptance near zero; speculation stays lossless).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Args;
use tandem_assistant::{AssistantOptions, AssistantProposer};
use tandem_core::calibration::Calibration;
use tandem_core::{Proposer, Route, Routed, TargetIdentity};
use tandem_dspark::{
    is_set, DraftBatching, Dspark, DsparkConfig, DsparkProposer, RouterManifest, TargetDims,
};
use tandem_gemma::TargetHead;

use crate::models::ModelArgs;

/// Drafter selection flags.
#[derive(Args, Debug, Clone)]
pub struct DrafterArgs {
    /// The drafter: `shipped` (the routed set of DSpark drafters for Gemma 3 270M that
    /// ships in this repository), a routed set's folder (with a router.json), a Gemma 4
    /// assistant directory, a DSpark checkpoint directory, or `random` for a randomly
    /// initialised small DSpark drafter.
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

/// Where the shipped drafters live: the routed set `drafters/gemma-3-270m-router` of the
/// source tree this binary was built from (container images put it there too).
fn shipped_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/gemma-3-270m-router")
}

impl DrafterArgs {
    /// The folder `--drafter` names (none for `random`): a DSpark checkpoint or a set.
    fn folder(&self) -> Result<Option<PathBuf>> {
        let dir = match self.drafter.as_str() {
            "random" => return Ok(None),
            SHIPPED => shipped_dir(),
            path => PathBuf::from(path),
        };
        if self.drafter == SHIPPED && !is_set(&dir) {
            bail!(
                "the shipped drafters are not at {}: pass --drafter DIR or --drafter random",
                dir.display()
            );
        }
        Ok(Some(dir))
    }

    /// The directory of the DSpark checkpoint `--drafter` names (none for `random`); a
    /// routed set has several, and is refused.
    pub fn dir(&self) -> Result<Option<PathBuf>> {
        let dir = self.folder()?;
        if let Some(set) = dir.as_ref().filter(|d| is_set(d)) {
            let dirs = RouterManifest::read(set)?.drafter_dirs(set);
            bail!(
                "--drafter {} is a routed set of drafters; name one of them ({})",
                self.drafter,
                (dirs.iter().map(|d| d.display().to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(dir)
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
        if let Some(set) = self.folder()?.filter(|d| is_set(d)) {
            return self.load_set(&set, models, head);
        }
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

impl DrafterArgs {
    /// The routed set in `set`: each route's DSpark drafter loaded as `--drafter` would load
    /// it alone (same flags), behind one [`Routed`] proposer.
    fn load_set(
        &self,
        set: &Path,
        models: &ModelArgs,
        head: Option<TargetHead>,
    ) -> Result<LoadedDrafter> {
        let m = RouterManifest::read(set)?;
        let head = match head {
            Some(h) => h,
            None => models.load_head()?,
        };
        let mut routes = Vec::new();
        for (spec, dir) in m.routes.iter().zip(m.drafter_dirs(set)) {
            let one = DrafterArgs {
                drafter: dir.display().to_string(),
                ..self.clone()
            };
            if is_set(&dir) {
                bail!(
                    "route {} of {}: a set inside a set",
                    spec.name,
                    set.display()
                );
            }
            let loaded = one
                .load_any(models, Some(head.clone()))
                .with_context(|| format!("route {} of {}", spec.name, set.display()))?;
            routes.push(Route {
                name: spec.name.clone(),
                proposer: loaded.proposer,
            });
        }
        let default = m
            .default_index()
            .context("a checked manifest has its default")?;
        let routed = Routed::new(routes, m.router.clone(), default)
            .with_context(|| format!("routing {}", set.display()))?;
        Ok(LoadedDrafter {
            proposer: Arc::new(routed),
            target: head.identity()?,
            kind: "dspark-routed",
        })
    }
}

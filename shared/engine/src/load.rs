//! Loading a target and its tokenizer into an [`Engine`]: Gemma 4 when the model is a
//! Hugging Face directory whose `config.json` says `gemma4*` (CPU only), Gemma 3 otherwise
//! (a GGUF file or an HF directory) on the CPU kernels or on a candle device. Every front end
//! (CLI, services, benches) loads targets through here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tandem_gemma::gemma4::Gemma4;
use tandem_gemma::{DeviceGemma3, DeviceOptions, Gemma3, LoadOptions};
use tandem_tokenizer::GemmaTokenizer;

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::models::{BatchLimits, BatchedDeviceGemma3, BatchedGemma3, Gemma4Target, Target};

/// Where a target runs.
#[derive(Debug, Clone)]
pub enum Placement {
    /// tandem's batch-invariant CPU kernels.
    Cpu(LoadOptions),
    /// A candle device (e.g. a CUDA GPU); Gemma 3 only.
    Device(DeviceOptions),
}

/// The files of a target.
#[derive(Debug, Clone)]
pub struct TargetFiles {
    /// A `.gguf` file or an HF directory (config.json + safetensors).
    pub model: PathBuf,
    /// The target's `tokenizer.json`.
    pub tokenizer: PathBuf,
}

impl Engine {
    /// Loads the target `files` name, placed as `placement` says, and its tokenizer.
    pub fn load(files: &TargetFiles, placement: &Placement) -> Result<Self> {
        Self::load_batched(files, placement, None)
    }

    /// [`Self::load`], with the forwards of concurrent generations batched within `batching`
    /// where the target is Gemma 3, on the CPU kernels or a device (Gemma 4 runs each
    /// generation alone, and says so in the log).
    pub fn load_batched(
        files: &TargetFiles,
        placement: &Placement,
        batching: Option<BatchLimits>,
    ) -> Result<Self> {
        let model = load_target(&files.model, placement, batching)?;
        let tokenizer = GemmaTokenizer::from_file(&files.tokenizer)
            .map_err(|e| load_error(&files.tokenizer, e))?;
        Ok(Self::new(model, Arc::new(tokenizer)))
    }
}

/// Loads the target at `path`, placed as `placement` says.
fn load_target(
    path: &Path,
    placement: &Placement,
    batching: Option<BatchLimits>,
) -> Result<Arc<dyn Target>> {
    let gemma4 = path.is_dir() && model_type(path)?.is_some_and(|t| t.starts_with("gemma4"));
    let fail = |e: tandem_gemma::GemmaError| load_error(path, e);
    if batching.is_some() && gemma4 {
        tracing::warn!("batching runs on Gemma 3; this target runs each generation alone");
    }
    Ok(match (placement, gemma4) {
        (Placement::Cpu(opts), false) => {
            let model = Gemma3::load_with(path, opts).map_err(fail)?;
            match batching {
                Some(limits) => Arc::new(BatchedGemma3::new(Arc::new(model), limits)?),
                None => Arc::new(model),
            }
        }
        (Placement::Cpu(_), true) => {
            let model = Gemma4::load(path).map_err(fail)?;
            Arc::new(Gemma4Target::new(Arc::new(model))?)
        }
        (Placement::Device(_), true) => {
            return Err(EngineError::Load(
                "Gemma 4 targets run on the CPU only".into(),
            ))
        }
        (Placement::Device(opts), false) => {
            let model = DeviceGemma3::load(path, opts.clone()).map_err(fail)?;
            match batching {
                Some(limits) => Arc::new(BatchedDeviceGemma3::new(Arc::new(model), limits)?),
                None => Arc::new(model),
            }
        }
    })
}

/// The `model_type` of an HF directory's config.json (`None` without one).
pub fn model_type(dir: &Path) -> Result<Option<String>> {
    let path = dir.join("config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| load_error(&path, e))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| load_error(&path, e))?;
    Ok(value["model_type"].as_str().map(str::to_string))
}

fn load_error(path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Load(format!("loading {}: {e}", path.display()))
}

//! Training checkpoints. The output folder is a loadable drafter (`Dspark::save`: manifest
//! plus f32 safetensors) with the trainer's state beside it: `trainer.json` (step, seed,
//! data settings) and `optimizer.safetensors` (AdamW moments). Every file is first written
//! to a sibling folder and then renamed into place, so an interrupted save leaves the
//! previous checkpoint readable. Data order and anchors are functions of (seed, step), so
//! these files are the whole state: a resumed run continues exactly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use tandem_dspark::Dspark;
use tandem_gemma::TargetHead;

use crate::error::{Result, TrainError};
use crate::optim::AdamW;

/// Trainer state file name.
pub const STATE: &str = "trainer.json";
/// Optimizer moments file name.
pub const MOMENTS: &str = "optimizer.safetensors";

/// What must match for a run to resume a checkpoint, and where it stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Updates done.
    pub step: usize,
    /// Settings that decide the data stream and the schedule (compared on resume).
    pub fingerprint: serde_json::Value,
}

/// Saves drafter, optimizer and state into `dir`.
pub fn save(dir: &Path, drafter: &Dspark, opt: &AdamW, state: &TrainState) -> Result<()> {
    let tmp = staging(dir);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    drafter.save(&tmp)?;
    candle_core::safetensors::save(&opt.moments(), tmp.join(MOMENTS))?;
    let json = serde_json::to_string_pretty(state)
        .map_err(|e| TrainError::checkpoint(dir, e.to_string()))?;
    std::fs::write(tmp.join(STATE), json).map_err(|e| TrainError::io(tmp.join(STATE), e))?;
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    let entries = std::fs::read_dir(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    for entry in entries {
        let from = entry.map_err(|e| TrainError::io(&tmp, e))?.path();
        let to = dir.join(from.file_name().unwrap_or_default());
        std::fs::rename(&from, &to).map_err(|e| TrainError::io(&to, e))?;
    }
    std::fs::remove_dir(&tmp).map_err(|e| TrainError::io(&tmp, e))
}

/// A checkpoint read back.
pub struct Restored {
    /// The drafter.
    pub drafter: Dspark,
    /// The optimizer moments.
    pub moments: HashMap<String, Tensor>,
    /// The state.
    pub state: TrainState,
}

/// Whether `dir` holds a training checkpoint.
pub fn exists(dir: &Path) -> bool {
    dir.join(STATE).is_file()
}

/// Loads a checkpoint saved by [`save`] for `head`'s target.
pub fn load(dir: &Path, head: &TargetHead) -> Result<Restored> {
    let path = dir.join(STATE);
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io(&path, e))?;
    let state: TrainState =
        serde_json::from_str(&text).map_err(|e| TrainError::checkpoint(&path, e.to_string()))?;
    let moments = candle_core::safetensors::load(dir.join(MOMENTS), &Device::Cpu)
        .map_err(|e| TrainError::checkpoint(dir.join(MOMENTS), e.to_string()))?;
    Ok(Restored {
        drafter: Dspark::load(dir, head)?,
        moments,
        state,
    })
}

fn staging(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dir.with_file_name(name)
}

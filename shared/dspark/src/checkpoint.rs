//! Drafter checkpoints: f32 safetensors (sharded with an HF-style index when larger than
//! a limit) plus a JSON manifest naming the target the drafter was made for, in the
//! layout of the DSpark reference (seeds/dflash-drafter.diff.txt: kind "dspark-drafter",
//! variant "dflash"). The target's LM head is shared, never stored here. A calibration of
//! the drafter's confidences ([`tandem_core::calibration`]) may sit beside it, named with
//! its version in the manifest; saving new weights drops it, since it was fitted to the
//! old ones.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use tandem_core::calibration::{Calibration, CALIBRATION_VERSION};
use tandem_core::TargetIdentity;
use tandem_gemma::TargetHead;

use crate::config::{DraftVocab, DsparkConfig, TargetDims};
use crate::error::{DsparkError, Result};
use crate::model::Dspark;
use crate::params::Params;

/// Manifest file name.
pub const MANIFEST: &str = "dspark.json";
const KIND: &str = "dspark-drafter";
const VARIANT: &str = "dflash";
const VERSION: u32 = 1;
/// Calibration file name, beside the manifest.
pub const CALIBRATION: &str = "calibration.json";
const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// Options of [`Dspark::save_with`].
#[derive(Debug, Clone, Copy)]
pub struct SaveOptions {
    /// Largest shard in bytes; parameters are never split, so one larger than this gets a
    /// shard of its own.
    pub shard_bytes: usize,
}

impl Default for SaveOptions {
    fn default() -> Self {
        Self {
            shard_bytes: 16 << 20,
        }
    }
}

/// The JSON manifest of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    kind: String,
    variant: String,
    version: u32,
    target: TargetIdentity,
    config: DsparkConfig,
    dims: TargetDims,
    draft_vocab_size: usize,
    param_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    calibration: Option<CalibrationRef>,
}

/// The manifest's pointer to a calibration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CalibrationRef {
    file: String,
    version: u32,
}

#[derive(Serialize, Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

impl Manifest {
    /// The manifest in `text` (read from `path`), of this kind, variant and version.
    fn parse(text: &str, path: &Path) -> Result<Self> {
        let m: Self =
            serde_json::from_str(text).map_err(|e| DsparkError::checkpoint(path, e.to_string()))?;
        if (m.kind.as_str(), m.variant.as_str(), m.version) != (KIND, VARIANT, VERSION) {
            return Err(DsparkError::checkpoint(
                path,
                format!(
                    "is {} / {} v{}, expected {KIND} / {VARIANT} v{VERSION}",
                    m.kind, m.variant, m.version
                ),
            ));
        }
        Ok(m)
    }

    /// The draft vocabulary, once the manifest's target dims are `dims` and its config
    /// valid for them.
    fn check(&self, dims: &TargetDims, path: &Path) -> Result<DraftVocab> {
        if *dims != self.dims {
            return Err(DsparkError::checkpoint(
                path,
                format!(
                    "target dims {:?} differ from the head's {dims:?}",
                    self.dims
                ),
            ));
        }
        self.config.validate(dims)?;
        DraftVocab::new(self.config.draft_vocab.as_deref(), dims.vocab)
    }
}

/// Parses a manifest ([`MANIFEST`]) and checks it as loading does against a target of
/// `dims`: kind and version, the dims it was made for, its config and draft vocabulary.
pub fn check_manifest(text: &str, dims: &TargetDims) -> Result<DsparkConfig> {
    let path = Path::new(MANIFEST);
    let m = Manifest::parse(text, path)?;
    m.check(dims, path)?;
    Ok(m.config)
}

/// The shard files an index (`model.safetensors.index.json`) names, sorted and once each;
/// every one must be a plain file name (no folder, no `..`), so an index cannot point
/// outside the drafter's folder.
pub fn index_shards(text: &str) -> Result<Vec<String>> {
    let idx: Index = serde_json::from_str(text).map_err(|e| DsparkError::Config(e.to_string()))?;
    let mut files: Vec<String> = idx.weight_map.into_values().collect();
    files.sort();
    files.dedup();
    if let Some(f) = files.iter().find(|f| !is_plain_file_name(f)) {
        return Err(DsparkError::Config(format!(
            "shard {f:?} is not a file name in the drafter's folder"
        )));
    }
    Ok(files)
}

/// One normal path component: no separator, root, `.` or `..`.
fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) && !name.contains('/')
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| DsparkError::io(path, e))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    serde_json::from_str(&read_text(path)?)
        .map_err(|e| DsparkError::checkpoint(path, e.to_string()))
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| DsparkError::checkpoint(path, e.to_string()))?;
    std::fs::write(path, text).map_err(|e| DsparkError::io(path, e))
}

/// Groups parameters into shards of at most `limit` bytes, keeping canonical order.
fn shards(params: Vec<(String, Tensor)>, limit: usize) -> Vec<Vec<(String, Tensor)>> {
    let (mut out, mut cur, mut bytes) = (Vec::new(), Vec::new(), 0);
    for (name, t) in params {
        let size = t.elem_count() * 4;
        if !cur.is_empty() && bytes + size > limit {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += size;
        cur.push((name, t));
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

impl Dspark {
    /// Saves to `dir` (created if absent) with default options.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.save_with(dir, &SaveOptions::default())
    }

    /// Saves the parameters and the manifest to `dir`.
    pub fn save_with(&self, dir: &Path, opts: &SaveOptions) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| DsparkError::io(dir, e))?;
        let named = self.vars();
        let manifest = Manifest {
            kind: KIND.into(),
            variant: VARIANT.into(),
            version: VERSION,
            target: self.target.clone(),
            config: self.cfg.clone(),
            dims: self.dims,
            draft_vocab_size: self.vocab.len(),
            param_names: named.iter().map(|(n, _)| n.clone()).collect(),
            calibration: None,
        };
        let tensors = named.into_iter().map(|(n, v)| (n, v.as_tensor().clone()));
        let groups = shards(tensors.collect(), opts.shard_bytes.max(1));
        let mut index = Index {
            weight_map: BTreeMap::new(),
        };
        for (i, group) in groups.iter().enumerate() {
            let file = match groups.len() {
                1 => SINGLE.to_string(),
                n => format!("model-{:05}-of-{n:05}.safetensors", i + 1),
            };
            let map: HashMap<String, Tensor> = group.iter().cloned().collect();
            index
                .weight_map
                .extend(group.iter().map(|(n, _)| (n.clone(), file.clone())));
            candle_core::safetensors::save(&map, dir.join(&file))?;
        }
        let index_path = dir.join(INDEX);
        if groups.len() > 1 {
            write_json(&index_path, &index)?;
        } else if index_path.is_file() {
            std::fs::remove_file(&index_path).map_err(|e| DsparkError::io(&index_path, e))?;
        }
        write_json(&dir.join(MANIFEST), &manifest)
    }

    /// Loads a drafter saved by [`Dspark::save`] for the target of `head`. Fails with
    /// [`DsparkError::TargetMismatch`] when it was made for another target.
    pub fn load(dir: &Path, head: &TargetHead) -> Result<Self> {
        let path = dir.join(MANIFEST);
        let m = Manifest::parse(&read_text(&path)?, &path)?;
        let found = head.identity()?;
        if found != m.target {
            return Err(DsparkError::TargetMismatch {
                expected: m.target,
                found,
            });
        }
        let dims = TargetDims::of(head);
        let vocab = m.check(&dims, &path)?;
        let tensors = Self::read_tensors(dir)?;
        let params = Params::from_tensors(&m.config, &dims, vocab.len(), tensors)
            .map_err(|e| DsparkError::checkpoint(dir, e.to_string()))?;
        Ok(Self {
            cfg: m.config,
            dims,
            target: m.target,
            vocab,
            params,
        })
    }

    fn read_tensors(dir: &Path) -> Result<HashMap<String, Tensor>> {
        let index = dir.join(INDEX);
        let files: Vec<String> = match index.is_file() {
            true => index_shards(&read_text(&index)?)
                .map_err(|e| DsparkError::checkpoint(&index, e.to_string()))?,
            false => vec![SINGLE.to_string()],
        };
        let mut all = HashMap::new();
        for f in files {
            let path = dir.join(&f);
            if !path.is_file() {
                return Err(DsparkError::checkpoint(&path, "missing shard"));
            }
            let part = candle_core::safetensors::load(&path, &Device::Cpu)
                .map_err(|e| DsparkError::checkpoint(&path, e.to_string()))?;
            all.extend(part);
        }
        Ok(all)
    }
}

/// The calibration the manifest in `dir` names, if any; an error when the file is missing,
/// unreadable or of another version.
pub fn load_calibration(dir: &Path) -> Result<Option<Calibration>> {
    let m: Manifest = read_json(&dir.join(MANIFEST))?;
    let Some(r) = m.calibration else {
        return Ok(None);
    };
    if !is_plain_file_name(&r.file) {
        return Err(DsparkError::checkpoint(
            dir.join(MANIFEST),
            format!(
                "calibration {:?} is not a file name in the drafter's folder",
                r.file
            ),
        ));
    }
    let path = dir.join(&r.file);
    if r.version != CALIBRATION_VERSION {
        return Err(DsparkError::checkpoint(
            &path,
            format!(
                "the manifest names calibration v{}, not v{CALIBRATION_VERSION}: run tandem calibrate again",
                r.version
            ),
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| DsparkError::io(&path, e))?;
    let cal = Calibration::from_json(&text).map_err(|e| DsparkError::checkpoint(&path, e))?;
    Ok(Some(cal))
}

/// Saves `cal` as [`CALIBRATION`] beside the drafter in `dir` and names it in the manifest.
pub fn attach_calibration(dir: &Path, cal: &Calibration) -> Result<()> {
    let path = dir.join(MANIFEST);
    let mut m: Manifest = read_json(&path)?;
    let file = dir.join(CALIBRATION);
    std::fs::write(&file, cal.to_json()).map_err(|e| DsparkError::io(&file, e))?;
    m.calibration = Some(CalibrationRef {
        file: CALIBRATION.into(),
        version: cal.version,
    });
    write_json(&path, &m)
}

//! Generated samples kept on disk, so that a resumed or repeated run (a GPU session runs in
//! commands of at most ten minutes) does not make them again. One safetensors file per
//! sample, named by a hash of its prompt and the teacher settings; a file that does not read
//! back as a sample of that prompt is made again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{Device, Tensor};

use crate::corpus::fnv1a;
use crate::error::{Result, TrainError};
use crate::teacher::{Sample, SparseTarget, TeacherConfig};

/// Numbers the partial files of concurrent saves.
static PARTIAL: AtomicU64 = AtomicU64::new(0);

/// A folder of samples.
#[derive(Debug, Clone)]
pub struct SampleStore {
    dir: PathBuf,
}

impl SampleStore {
    /// The store in `dir` (created if absent).
    pub fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The file of `prompt`'s sample under `cfg`.
    fn path(&self, prompt: &[u32], cfg: &TeacherConfig) -> PathBuf {
        let settings = [cfg.continuation_tokens, cfg.keep, usize::from(cfg.forced)];
        let words = cfg.taps.iter().chain([&usize::MAX]).chain(&settings);
        // A greedy continuation keeps the name it had before sampled ones existed.
        let sampled = match cfg.temperature_of(prompt) {
            t if t > 0.0 && !cfg.forced => vec![u64::MAX, u64::from(t.to_bits()), cfg.seed],
            _ => Vec::new(),
        };
        let words = words
            .map(|x| *x as u64)
            .chain(sampled)
            .chain(prompt.iter().map(|t| u64::from(*t)));
        let h = fnv1a(words.flat_map(u64::to_le_bytes));
        self.dir.join(format!("{h:016x}.safetensors"))
    }

    /// The stored sample of `prompt`, if there is a readable one.
    pub fn load(&self, prompt: &[u32], cfg: &TeacherConfig) -> Option<Sample> {
        let tensors = candle_core::safetensors::load(self.path(prompt, cfg), &Device::Cpu).ok()?;
        let sample = from_tensors(tensors).ok()?;
        let total = match cfg.forced {
            true => prompt.len(),
            false => prompt.len() + cfg.continuation_tokens,
        };
        let fits = sample.tokens.len() == total
            && sample.tokens.starts_with(prompt)
            && sample.dists.iter().all(|d| d.ids.len() <= cfg.keep.max(1))
            && sample.width.is_multiple_of(cfg.taps.len().max(1));
        fits.then_some(sample)
    }

    /// Stores `sample`, made from `prompt` under `cfg` (written beside, then renamed).
    pub fn save(&self, prompt: &[u32], cfg: &TeacherConfig, sample: &Sample) -> Result<()> {
        let path = self.path(prompt, cfg);
        // Two equal prompts saved at once must not write into one partial file.
        let n = PARTIAL.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("{}.{n}.partial", std::process::id()));
        candle_core::safetensors::save(&to_tensors(sample)?, &tmp)?;
        std::fs::rename(&tmp, &path).map_err(|e| TrainError::io(&path, e))
    }
}

fn to_tensors(s: &Sample) -> Result<HashMap<String, Tensor>> {
    let dev = Device::Cpu;
    let (n, k) = (s.dists.len(), s.dists.first().map_or(0, |d| d.ids.len()));
    if s.dists
        .iter()
        .any(|d| d.ids.len() != k || d.probs.len() != k)
    {
        return Err(TrainError::Invalid(
            "a sample's distributions differ in length".into(),
        ));
    }
    let ids: Vec<u32> = s.dists.iter().flat_map(|d| d.ids.clone()).collect();
    let probs: Vec<f32> = s.dists.iter().flat_map(|d| d.probs.clone()).collect();
    let rows = s.rows.len() / s.width.max(1);
    Ok(HashMap::from([
        ("tokens".into(), Tensor::new(s.tokens.as_slice(), &dev)?),
        (
            "prompt_len".into(),
            Tensor::new(&[s.prompt_len as u32], &dev)?,
        ),
        (
            "rows".into(),
            Tensor::from_slice(&s.rows, (rows, s.width), &dev)?,
        ),
        ("dist_ids".into(), Tensor::from_vec(ids, (n, k), &dev)?),
        ("dist_probs".into(), Tensor::from_vec(probs, (n, k), &dev)?),
    ]))
}

fn from_tensors(mut t: HashMap<String, Tensor>) -> Result<Sample> {
    let mut take = |name: &str| {
        t.remove(name)
            .ok_or_else(|| TrainError::Invalid(format!("a stored sample lacks {name}")))
    };
    let tokens = take("tokens")?.to_vec1::<u32>()?;
    let prompt_len = take("prompt_len")?.to_vec1::<u32>()?;
    let rows = take("rows")?;
    let (ids, probs) = (take("dist_ids")?, take("dist_probs")?);
    let (r, width) = rows.dims2()?;
    let p = prompt_len.first().copied().unwrap_or(0) as usize;
    let dists: Vec<SparseTarget> = ids
        .to_vec2::<u32>()?
        .into_iter()
        .zip(probs.to_vec2::<f32>()?)
        .map(|(ids, probs)| SparseTarget { ids, probs })
        .collect();
    if p == 0 || r + 1 != tokens.len() || dists.len() + p + 1 != tokens.len() {
        return Err(TrainError::Invalid(
            "a stored sample is inconsistent".into(),
        ));
    }
    Ok(Sample {
        tokens,
        prompt_len: p,
        rows: rows.flatten_all()?.to_vec1::<f32>()?,
        width,
        dists,
    })
}

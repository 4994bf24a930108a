//! Training samples made by the target itself: a prompt, its continuation (greedy, or
//! sampled at a temperature so the drafter also sees the paths a sampling client takes),
//! the hidden-state taps of every position a drafter may see as context, and the target's
//! next-token distribution (kept sparse: its most likely ids) at every continuation
//! position, from the target's forward on the CPU kernels (the batch-invariant one the
//! verifier runs on a CPU) or on a GPU (any [`Gemma3Model`]).
//!
//! A sampled continuation draws each token from the kept ids of the target's distribution
//! raised to `1/T` and renormalised (the tail past the kept ids is left out), with a
//! generator seeded by the prompt, the temperature and the teacher's seed: a sample is a
//! function of its prompt and the settings alone, whatever batch it is made in.

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use tandem_gemma::{ForwardOptions, Gemma3Model, LogitsMode};

use crate::corpus::fnv1a;
use crate::error::{Result, TrainError};
use crate::store::SampleStore;
use crate::topk::sparse_rows;

/// How samples are generated.
#[derive(Debug, Clone)]
pub struct TeacherConfig {
    /// Target layers whose outputs are tapped (the drafter's `tap_layers`).
    pub taps: Vec<usize>,
    /// Tokens the target appends to each prompt.
    pub continuation_tokens: usize,
    /// Most likely ids kept of each target distribution.
    pub keep: usize,
    /// Teacher forcing: the last `continuation_tokens` of each prompt are its continuation
    /// (corpus text), scored by one target forward, instead of a continuation generated
    /// token by token (about ten times cheaper; the drafter still learns the target's
    /// distributions, on text the target did not write).
    pub forced: bool,
    /// Prompts (of one length) whose continuations are generated together, in one batch
    /// forward per token.
    pub batch: usize,
    /// Temperatures of the generated continuations: prompt `i`'s continuation is written at
    /// the temperature [`TeacherConfig::temperature_of`] picks from this list by a hash of
    /// the prompt (0 = greedy). Empty means greedy for every prompt.
    pub temperatures: Vec<f32>,
    /// Seed of the sampled continuations.
    pub seed: u64,
}

impl TeacherConfig {
    /// The temperature `prompt`'s continuation is written at.
    pub fn temperature_of(&self, prompt: &[u32]) -> f32 {
        match self.temperatures.len() {
            0 => 0.0,
            n => self.temperatures[(prompt_hash(prompt) % n as u64) as usize],
        }
    }

    /// The generator of `prompt`'s sampled continuation.
    fn rng_of(&self, prompt: &[u32]) -> ChaCha20Rng {
        let t = u64::from(self.temperature_of(prompt).to_bits());
        ChaCha20Rng::seed_from_u64(prompt_hash(prompt) ^ self.seed.rotate_left(17) ^ (t << 1))
    }
}

/// FNV-1a of a prompt's token ids.
fn prompt_hash(prompt: &[u32]) -> u64 {
    fnv1a(prompt.iter().flat_map(|t| t.to_le_bytes()))
}

/// The next token of a continuation at `temperature` from the target's kept distribution:
/// the argmax at 0, else a draw from `p^(1/T)` renormalised over the kept ids.
pub fn pick_next<R: Rng>(dist: &SparseTarget, temperature: f32, rng: &mut R) -> u32 {
    if temperature <= 0.0 || dist.ids.len() < 2 {
        return dist.ids[0];
    }
    let top = dist.probs[0].max(f32::MIN_POSITIVE);
    let weights: Vec<f64> = dist
        .probs
        .iter()
        .map(|p| f64::from(p.max(0.0) / top).powf(1.0 / f64::from(temperature)))
        .collect();
    let mut u = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (id, w) in dist.ids.iter().zip(&weights) {
        if u < *w {
            return *id;
        }
        u -= w;
    }
    dist.ids[0]
}

/// The target's next-token distribution at one position, truncated to its most likely ids
/// (probabilities under the full vocabulary, descending; the first is the argmax).
#[derive(Debug, Clone, PartialEq)]
pub struct SparseTarget {
    /// Target ids.
    pub ids: Vec<u32>,
    /// Their probabilities.
    pub probs: Vec<f32>,
}

/// One prompt with its target continuation.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Prompt then continuation.
    pub tokens: Vec<u32>,
    /// Prompt length `P`.
    pub prompt_len: usize,
    /// Row-major taps of positions `0..tokens.len() - 1`, `width` floats each.
    pub rows: Vec<f32>,
    /// Floats per row.
    pub width: usize,
    /// `dists[i]`: the target's distribution at position `P + i`, which predicts token
    /// `P + i + 1`; one per position `P..tokens.len() - 1`.
    pub dists: Vec<SparseTarget>,
}

impl Sample {
    /// A sample of `tokens` (a prompt of `prompt_len` and maybe its continuation) with no
    /// taps or distributions yet, room made for `total` tokens' worth.
    fn start(tokens: &[u32], prompt_len: usize, width: usize, total: usize) -> Self {
        let mut kept = Vec::with_capacity(total);
        kept.extend_from_slice(tokens);
        Self {
            tokens: kept,
            prompt_len,
            rows: Vec::with_capacity(total.saturating_sub(1) * width),
            width,
            dists: Vec::with_capacity(total.saturating_sub(prompt_len + 1)),
        }
    }

    /// The taps of positions `0..n` (row-major).
    pub fn context(&self, n: usize) -> &[f32] {
        &self.rows[..n * self.width]
    }

    /// The distribution at position `pos` (`P <= pos < tokens.len() - 1`).
    pub fn dist(&self, pos: usize) -> Option<&SparseTarget> {
        pos.checked_sub(self.prompt_len)
            .and_then(|i| self.dists.get(i))
    }
}

/// Scores `text` (prompt then `cfg.continuation_tokens` of continuation) with one target
/// forward, recording the taps of every position and the distributions of the
/// continuation positions.
pub fn forced<M: Gemma3Model>(model: &M, text: &[u32], cfg: &TeacherConfig) -> Result<Sample> {
    let c = cfg.continuation_tokens;
    if c < 2 || text.len() <= c {
        return Err(TrainError::Invalid(format!(
            "teacher forcing needs a prompt and {c} >= 2 continuation tokens, got {} tokens",
            text.len()
        )));
    }
    let (p, total) = (text.len() - c, text.len());
    let mut cache = model.new_cache(total);
    let width = cfg.taps.len() * model.config().hidden_size;
    let mut sample = Sample::start(text, p, width, total);
    let mut logits = None;
    // The prompt needs no logits; the continuation's positions need all of theirs.
    for (span, mode) in [(0..p, LogitsMode::None), (p..total - 1, LogitsMode::All)] {
        let opts = ForwardOptions {
            logits: mode,
            taps: cfg.taps.clone(),
        };
        let out = model.forward(&text[span.clone()], span.start, &mut cache, &opts)?;
        push_rows(&out.taps, std::slice::from_mut(&mut sample))?;
        logits = out.logits;
    }
    let logits =
        logits.ok_or_else(|| TrainError::Invalid("the target returned no logits".into()))?;
    sample.dists = sparse_rows(&logits, cfg.keep.max(1))?;
    Ok(sample)
}

/// Runs the target after each of `prompts` (all of one length), greedily or sampling at
/// each prompt's temperature, recording taps and distributions: one batch forward per
/// token for all of them (the same samples as one by one, up to a device's numerics).
pub fn generate_batch<M: Gemma3Model>(
    model: &M,
    prompts: &[&[u32]],
    cfg: &TeacherConfig,
) -> Result<Vec<Sample>> {
    let p = prompts.first().map_or(0, |x| x.len());
    if p == 0 || cfg.continuation_tokens < 2 || prompts.iter().any(|x| x.len() != p) {
        return Err(TrainError::Invalid(
            "a batch of samples needs prompts of one length and at least 2 continuation tokens"
                .into(),
        ));
    }
    let total = p + cfg.continuation_tokens;
    let width = cfg.taps.len() * model.config().hidden_size;
    let mut samples: Vec<Sample> = prompts
        .iter()
        .map(|x| Sample::start(x, p, width, total))
        .collect();
    let mut rngs: Vec<(f32, ChaCha20Rng)> = prompts
        .iter()
        .map(|x| (cfg.temperature_of(x), cfg.rng_of(x)))
        .collect();
    let mut cache = model.new_batch_cache(prompts.len(), total);
    let opts = ForwardOptions {
        logits: LogitsMode::Last,
        taps: cfg.taps.clone(),
    };
    let mut out = model.forward_batch(&prompts.concat(), 0, &mut cache, &opts)?;
    loop {
        push_rows(&out.taps, &mut samples)?;
        let logits = out
            .logits
            .ok_or_else(|| TrainError::Invalid("the target returned no logits".into()))?;
        let dists = sparse_rows(&logits, cfg.keep.max(1))?;
        for ((s, next), (t, rng)) in samples.iter_mut().zip(dists).zip(&mut rngs) {
            s.tokens.push(pick_next(&next, *t, rng));
            if s.tokens.len() > p + 1 {
                s.dists.push(next);
            }
        }
        let len = samples[0].tokens.len();
        if len == total {
            return Ok(samples);
        }
        let next: Vec<u32> = samples.iter().map(|s| s.tokens[len - 1]).collect();
        out = model.forward_batch(&next, len - 1, &mut cache, &opts)?;
    }
}

/// Appends the taps of a batch forward's positions (rows sequence-major) to each sample,
/// interleaved per position.
fn push_rows(taps: &[candle_core::Tensor], samples: &mut [Sample]) -> Result<()> {
    let per_tap = taps
        .iter()
        .map(|t| t.to_vec2::<f32>())
        .collect::<candle_core::Result<Vec<_>>>()?;
    let m = per_tap.first().map_or(0, Vec::len) / samples.len().max(1);
    for (i, s) in samples.iter_mut().enumerate() {
        for pos in i * m..(i + 1) * m {
            for tap in &per_tap {
                s.rows.extend_from_slice(&tap[pos]);
            }
        }
    }
    Ok(())
}

/// Samples of a fixed list of prompts, generated on first use and kept.
pub struct Pool {
    prompts: Vec<Vec<u32>>,
    samples: Vec<Option<Sample>>,
    cfg: TeacherConfig,
    store: Option<SampleStore>,
}

impl Pool {
    /// A pool over `prompts`; nothing is generated yet.
    pub fn new(prompts: Vec<Vec<u32>>, cfg: TeacherConfig) -> Self {
        Self {
            samples: vec![None; prompts.len()],
            prompts,
            cfg,
            store: None,
        }
    }

    /// Keeps generated samples in `store` and takes them from there when present.
    pub fn with_store(self, store: SampleStore) -> Self {
        Self {
            store: Some(store),
            ..self
        }
    }

    /// Number of prompts.
    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    /// Whether the pool has no prompt.
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// The prompts, generated or not.
    pub fn prompts(&self) -> &[Vec<u32>] {
        &self.prompts
    }

    /// The generation settings.
    pub fn config(&self) -> &TeacherConfig {
        &self.cfg
    }

    /// Generates the samples of `indices` that are missing, in parallel or in batches of
    /// prompts of one length (each is a function of its prompt alone, so the order cannot
    /// matter), or reads them from the pool's store; returns how many it made or read.
    pub fn ensure<M: Gemma3Model>(&mut self, model: &M, indices: &[usize]) -> Result<usize> {
        let mut missing = Vec::new();
        for &i in indices {
            match self.samples.get(i) {
                None => {
                    return Err(TrainError::Invalid(format!(
                        "sample {i} of a pool of {}",
                        self.prompts.len()
                    )))
                }
                Some(None) if !missing.contains(&i) => missing.push(i),
                Some(_) => {}
            }
        }
        let mut made = Vec::new();
        if let Some(store) = &self.store {
            let stored: Vec<(usize, Option<Sample>)> = missing
                .par_iter()
                .map(|&i| (i, store.load(&self.prompts[i], &self.cfg)))
                .collect();
            missing.clear();
            for (i, s) in stored {
                match s {
                    Some(s) => made.push((i, s)),
                    None => missing.push(i),
                }
            }
        }
        let fresh = match self.cfg.forced {
            true => missing
                .par_iter()
                .map(|&i| forced(model, &self.prompts[i], &self.cfg).map(|s| (i, s)))
                .collect::<Result<Vec<_>>>()?,
            false => self.generate_missing(model, missing)?,
        };
        if let Some(store) = &self.store {
            fresh
                .par_iter()
                .try_for_each(|(i, s)| store.save(&self.prompts[*i], &self.cfg, s))?;
        }
        made.extend(fresh);
        let count = made.len();
        for (i, sample) in made {
            self.samples[i] = Some(sample);
        }
        Ok(count)
    }

    /// Makes (or reads from the store) every sample of the pool, `chunk` prompts at a time
    /// in order of prompt length so that teacher batches are full; `progress` hears the
    /// samples done after each chunk.
    pub fn ensure_all<M: Gemma3Model>(
        &mut self,
        model: &M,
        chunk: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<()> {
        let mut order: Vec<usize> = (0..self.prompts.len()).collect();
        order.sort_by_key(|&i| (self.prompts[i].len(), i));
        let mut done = 0;
        for part in order.chunks(chunk.max(1)) {
            self.ensure(model, part)?;
            done += part.len();
            progress(done);
        }
        Ok(())
    }

    /// Generates the samples of `missing`, batching prompts of one length.
    fn generate_missing<M: Gemma3Model>(
        &self,
        model: &M,
        mut missing: Vec<usize>,
    ) -> Result<Vec<(usize, Sample)>> {
        missing.sort_by_key(|&i| (self.prompts[i].len(), i));
        let mut made = Vec::with_capacity(missing.len());
        for group in missing.chunk_by(|a, b| self.prompts[*a].len() == self.prompts[*b].len()) {
            for batch in group.chunks(self.cfg.batch.max(1)) {
                let prompts: Vec<&[u32]> =
                    batch.iter().map(|&i| self.prompts[i].as_slice()).collect();
                let samples = generate_batch(model, &prompts, &self.cfg)?;
                made.extend(batch.iter().copied().zip(samples));
            }
        }
        Ok(made)
    }

    /// The sample of prompt `i`, if generated.
    pub fn get(&self, i: usize) -> Option<&Sample> {
        self.samples.get(i).and_then(Option::as_ref)
    }

    /// Every generated sample.
    pub fn generated(&self) -> Vec<&Sample> {
        self.samples.iter().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frequencies(t: f32) -> Vec<f64> {
        let dist = SparseTarget {
            ids: vec![7, 3, 9],
            probs: vec![0.5, 0.3, 0.2],
        };
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let n = 40_000;
        let mut count = [0usize; 3];
        for _ in 0..n {
            let id = pick_next(&dist, t, &mut rng);
            count[dist.ids.iter().position(|x| *x == id).expect("kept id")] += 1;
        }
        count.iter().map(|c| *c as f64 / n as f64).collect()
    }

    /// Draws follow the kept distribution raised to 1/T and renormalised; T = 0 is the
    /// argmax.
    #[test]
    fn draws_follow_the_tempered_distribution() {
        assert_eq!(frequencies(0.0), vec![1.0, 0.0, 0.0]);
        for (t, want) in [(1.0, [0.5, 0.3, 0.2]), (0.5, [0.25, 0.09, 0.04])] {
            let z: f64 = want.iter().sum();
            for (got, w) in frequencies(t).iter().zip(want) {
                assert!((got - w / z).abs() < 0.01, "T {t}: {got} against {}", w / z);
            }
        }
    }
}

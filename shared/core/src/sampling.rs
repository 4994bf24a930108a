//! Turning logits into tokens: temperature, top-k and top-p (in that order, as transformers
//! applies them) produce a [`SparseDist`]; a seeded [`Sampler`] draws from it. Temperature 0
//! means greedy (argmax, ties to the lowest id) and consumes no randomness.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

/// Invalid sampling parameters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// Temperature is negative or not finite.
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    /// top-p outside (0, 1].
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    /// top-k of zero.
    #[error("top_k must be at least 1 when given")]
    TopK,
}

/// Per-request sampling parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest most-likely set whose mass reaches `top_p`.
    pub top_p: f32,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if self.top_k == Some(0) {
            return Err(SamplingError::TopK);
        }
        Ok(())
    }

    /// Whether these parameters mean greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == Some(1)
    }

    /// Whether these parameters sample at a temperature alone (no top-k, no top-p): a
    /// distribution that can be reduced and drawn from on the device that made the logits.
    pub fn temperature_alone(&self) -> bool {
        !self.is_greedy() && self.top_k.is_none() && self.top_p >= 1.0
    }
}

/// A distribution over a subset of token ids: `probs[i]` is the probability of `ids[i]`;
/// probabilities sum to 1 and every id not listed has probability 0.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SparseDist {
    /// Token ids with non-zero probability.
    pub ids: Vec<u32>,
    /// Their probabilities.
    pub probs: Vec<f32>,
}

/// Largest probability mass a sampled proposal leaves out (see [`SparseDist::without_tail`]).
pub const PROPOSAL_TAIL: f32 = 1e-3;

impl SparseDist {
    /// A drafter's sampled proposal without its tail: the ids whose probability is below
    /// `PROPOSAL_TAIL / vocab_len` (together at most [`PROPOSAL_TAIL`] of the mass) go and
    /// the rest is renormalised. Drawing from and reporting the trimmed distribution keeps
    /// rejection sampling exact, and a block's distributions shrink from the whole
    /// vocabulary (a megabyte a position on the wire for 262k ids) to the ids that matter.
    pub fn without_tail(self, vocab_len: usize) -> SparseDist {
        let floor = PROPOSAL_TAIL / vocab_len.max(1) as f32;
        let (ids, probs): (Vec<u32>, Vec<f32>) = self
            .ids
            .into_iter()
            .zip(self.probs)
            .filter(|(_, p)| *p >= floor)
            .unzip();
        let total: f32 = probs.iter().sum();
        SparseDist {
            ids,
            probs: probs.into_iter().map(|p| p / total).collect(),
        }
    }

    /// The probability of `id` (0 when absent). Constant time when `id` sits at index `id`
    /// (a full-vocabulary distribution in id order), a scan otherwise.
    pub fn prob(&self, id: u32) -> f32 {
        if self.ids.get(id as usize) == Some(&id) {
            return self.probs[id as usize];
        }
        self.ids
            .iter()
            .position(|x| *x == id)
            .map_or(0.0, |i| self.probs[i])
    }

    /// Draws an id given a uniform number `u` in [0, 1).
    /// When rounding leaves `u` past the total, the last id with a non-zero probability.
    pub fn draw(&self, u: f64) -> u32 {
        let mut acc = 0f64;
        let mut last = None;
        for (id, p) in self.ids.iter().zip(&self.probs) {
            acc += *p as f64;
            if u < acc {
                return *id;
            }
            if *p > 0.0 {
                last = Some(*id);
            }
        }
        last.or(self.ids.last().copied())
            .expect("a distribution has at least one id")
    }
}

/// Index of the largest logit; ties go to the lowest id (the rule of
/// [`tandem_kernels::first_max`], which the exact head's screened argmaxes follow too).
pub fn argmax(logits: &[f32]) -> u32 {
    tandem_kernels::first_max(logits)
}

/// The distribution `params` makes of `logits` (for greedy: all mass on the argmax).
pub fn distribution(logits: &[f32], params: &SamplingParams) -> SparseDist {
    if params.is_greedy() {
        return SparseDist {
            ids: vec![argmax(logits)],
            probs: vec![1.0],
        };
    }
    let inv_t = 1.0 / params.temperature as f64;
    match (params.top_k, params.top_p < 1.0) {
        (None, false) => dense(logits, inv_t),
        (None, true) => nucleus(logits, inv_t, params.top_p),
        (Some(k), _) => truncated(logits.iter().zip(0u32..).map(key).collect(), k, params),
    }
}

/// A sort key of `(logit, id)`: larger for a larger logit (`total_cmp`'s order), then for
/// a lower id, so that one integer comparison orders ids as the sampler ranks them.
fn key((logit, id): (&f32, u32)) -> u64 {
    let bits = logit.to_bits();
    let ordered = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    };
    u64::from(ordered) << 32 | u64::from(u32::MAX - id)
}

/// The id of a [`key`].
fn id_of(key: u64) -> u32 {
    u32::MAX - key as u32
}

/// The logit of a [`key`].
fn logit_of(key: u64) -> f32 {
    let ordered = (key >> 32) as u32;
    f32::from_bits(match ordered >> 31 {
        1 => ordered & !(1 << 31),
        _ => !ordered,
    })
}

/// [`distribution`] from the logits `values` of some ids only (`ids` ascending), as the
/// target's screen returns them for greedy and top-k sampling. `ids` must hold every id
/// that can rank among the `top_k` largest logits (the first maximum when greedy), ties
/// at the boundary included; without `top_k`, every id. The result is then
/// [`distribution`]'s over the full logits, bit for bit.
pub fn distribution_of(ids: &[u32], values: &[f32], params: &SamplingParams) -> SparseDist {
    if params.is_greedy() {
        return SparseDist {
            ids: vec![ids[argmax(values) as usize]],
            probs: vec![1.0],
        };
    }
    match params.top_k {
        None => distribution(values, params),
        Some(k) => truncated(
            values.iter().zip(ids.iter().copied()).map(key).collect(),
            k,
            params,
        ),
    }
}

/// Top-k, then temperature and top-p, over the [`key`]s of some ids' logits (top-p alone
/// goes through [`nucleus`], temperature alone through [`dense`]).
fn truncated(mut keys: Vec<u64>, k: usize, params: &SamplingParams) -> SparseDist {
    let inv_t = 1.0 / params.temperature as f64;
    if k < keys.len() {
        keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
        keys.truncate(k);
    }
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let mut cand: Vec<(u32, f64)> = keys
        .iter()
        .map(|&key| (id_of(key), logit_of(key) as f64 * inv_t))
        .collect();
    let max = cand.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0f64;
    for c in cand.iter_mut() {
        c.1 = (c.1 - max).exp();
        total += c.1;
    }
    if params.top_p < 1.0 {
        let mut acc = 0f64;
        let keep = cand
            .iter()
            .position(|c| {
                acc += c.1 / total;
                acc >= params.top_p as f64
            })
            .map_or(cand.len(), |i| i + 1);
        cand.truncate(keep);
        total = cand.iter().map(|c| c.1).sum();
    }
    SparseDist {
        ids: cand.iter().map(|c| c.0).collect(),
        probs: cand.iter().map(|c| (c.1 / total) as f32).collect(),
    }
}

/// Ids sorted per round of [`nucleus`] at first (then four times as many each round).
const NUCLEUS_HEAD: usize = 64;

/// Top-p alone: [`dense`]'s weights, then the smallest set of the most likely ids (by
/// logit, ties to the lower id) whose share of their total reaches `top_p`, accumulated
/// in that order. The set is found by selecting and sorting ever larger heads of the ids
/// rather than sorting the whole vocabulary (measured: 10 ms per row of 262,144 logits
/// sorted, a decode step's worth).
fn nucleus(logits: &[f32], inv_t: f64, top_p: f32) -> SparseDist {
    let mut w = Vec::new();
    let total = tandem_kernels::softmax_weights(logits, inv_t as f32, &mut w);
    let mut keys: Vec<u64> = logits.iter().zip(0u32..).map(key).collect();
    let (mut done, mut head, mut acc) = (0, NUCLEUS_HEAD, 0f64);
    let keep = loop {
        let end = (done + head).min(keys.len());
        if end < keys.len() {
            keys[done..].select_nth_unstable_by(end - done - 1, |a, b| b.cmp(a));
        }
        keys[done..end].sort_unstable_by(|a, b| b.cmp(a));
        let reached = keys[done..end].iter().position(|&key| {
            acc += w[id_of(key) as usize] as f64 / total;
            acc >= top_p as f64
        });
        match reached {
            Some(i) => break done + i + 1,
            None if end == keys.len() => break end,
            None => (done, head) = (end, head * 4),
        }
    };
    let ids: Vec<u32> = keys[..keep].iter().map(|&key| id_of(key)).collect();
    let kept: f64 = ids.iter().map(|&id| w[id as usize] as f64).sum();
    SparseDist {
        probs: ids
            .iter()
            .map(|&id| (w[id as usize] as f64 / kept) as f32)
            .collect(),
        ids,
    }
}

/// Temperature alone: every id, in id order. The exponentials are computed in f32 (within
/// 2.4e-7 relative, vectorized: a full-vocabulary distribution per verified position is on
/// the sampled hot path) and normalised by their f64 sum.
fn dense(logits: &[f32], inv_t: f64) -> SparseDist {
    let mut probs = Vec::new();
    let total = tandem_kernels::softmax_weights(logits, inv_t as f32, &mut probs);
    let inv = (1.0 / total) as f32;
    probs.iter_mut().for_each(|p| *p *= inv);
    SparseDist {
        ids: (0..logits.len() as u32).collect(),
        probs,
    }
}

/// A seeded sampler: the same seed and logits give the same tokens.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
}

impl Sampler {
    /// A sampler for validated `params`.
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Self {
            rng: ChaCha20Rng::seed_from_u64(params.seed),
            params,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// A uniform number in [0, 1) from this sampler's stream.
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// Samples the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let dist = distribution(logits, &self.params);
        dist.draw(self.uniform())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The tail below `PROPOSAL_TAIL / |vocabulary|` goes, the rest keeps its proportions
    /// and sums to 1.
    #[test]
    fn trimming_a_proposal_drops_the_tail_and_renormalises() {
        let vocab = 1000;
        let floor = PROPOSAL_TAIL / vocab as f32;
        let mut probs = vec![0.5, 0.3, 0.15, floor * 0.9, floor * 1.1];
        let rest = 1.0 - probs.iter().sum::<f32>();
        probs.push(rest);
        let dist = SparseDist {
            ids: vec![7, 3, 9, 4, 1, 8],
            probs,
        };
        let t = dist.clone().without_tail(vocab);
        assert_eq!(t.ids, vec![7, 3, 9, 1, 8]);
        assert!((t.probs.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let scale = t.probs[0] / dist.probs[0];
        assert!((t.probs[1] / dist.probs[1] - scale).abs() < 1e-5);
        assert!(scale > 1.0 && scale < 1.0 + 2.0 * floor);
    }

    fn params(t: f32, k: Option<usize>, p: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            seed: 7,
        }
    }

    #[test]
    fn greedy_is_argmax_with_lowest_tie() {
        let mut s = Sampler::new(SamplingParams::default()).expect("valid");
        assert_eq!(s.sample(&[0.0, 2.0, 2.0, 1.0]), 1);
    }

    #[test]
    fn top_k_and_top_p_truncate() {
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let d = distribution(&logits, &params(1.0, Some(2), 1.0));
        assert_eq!(d.ids, vec![0, 1]);
        let d = distribution(&logits, &params(1.0, None, 0.5));
        assert_eq!(d.ids, vec![0]);
        let d = distribution(&logits, &params(1.0, None, 0.85));
        assert_eq!(d.ids, vec![0, 1]);
    }

    #[test]
    fn invalid_params_rejected() {
        assert!(Sampler::new(params(-1.0, None, 1.0)).is_err());
        assert!(Sampler::new(params(f32::NAN, None, 1.0)).is_err());
        assert!(Sampler::new(params(1.0, None, 0.0)).is_err());
        assert!(Sampler::new(params(1.0, Some(0), 1.0)).is_err());
    }

    #[test]
    fn empirical_frequencies_match_softmax() {
        let logits = [1.0f32, 0.0, -1.0, 0.5];
        let mut s = Sampler::new(params(1.0, None, 1.0)).expect("valid");
        let mut counts = [0usize; 4];
        let n = 40_000;
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        let z: f64 = logits.iter().map(|l| (*l as f64).exp()).sum();
        for (i, c) in counts.iter().enumerate() {
            let expect = (logits[i] as f64).exp() / z;
            assert!((*c as f64 / n as f64 - expect).abs() < 0.01, "{i}: {c}");
        }
    }

    proptest! {
        #[test]
        fn distributions_are_normalised_and_seeded(
            logits in proptest::collection::vec(-10.0f32..10.0, 1..50),
            t in 0.05f32..2.0, k in proptest::option::of(1usize..60), p in 0.05f32..=1.0,
            seed in any::<u64>(),
        ) {
            let prm = SamplingParams { temperature: t, top_k: k, top_p: p, seed };
            let d = distribution(&logits, &prm);
            let sum: f32 = d.probs.iter().sum();
            prop_assert!((sum - 1.0).abs() < 1e-4);
            prop_assert!(!d.ids.is_empty());
            prop_assert!(d.ids.contains(&argmax(&logits)));
            let mut a = Sampler::new(prm).expect("valid");
            let mut b = Sampler::new(prm).expect("valid");
            for _ in 0..5 {
                prop_assert_eq!(a.sample(&logits), b.sample(&logits));
            }
        }

        /// A key orders like the sampler's ranking (logit by `total_cmp`, then lower id)
        /// and gives back its logit's bits and its id.
        #[test]
        fn keys_rank_and_round_trip(a in any::<f32>(), b in any::<f32>(), i in any::<u32>(), j in any::<u32>()) {
            let (ka, kb) = (key((&a, i)), key((&b, j)));
            prop_assert_eq!(ka.cmp(&kb), a.total_cmp(&b).then(j.cmp(&i)));
            prop_assert_eq!((logit_of(ka).to_bits(), id_of(ka)), (a.to_bits(), i));
        }

        /// Top-p alone selects what sorting every id would: the shortest prefix of the ids
        /// ordered by logit (ties to the lower id) whose weights reach `top_p` of the total,
        /// with the same probabilities, bit for bit, over vocabularies that take several
        /// rounds of selection, tied logits, signed zeros and negative values.
        #[test]
        fn nucleus_equals_sorting_every_id(
            picks in proptest::collection::vec(0usize..40, 1..3000),
            t in 0.05f32..3.0, p in 0.01f32..1.0,
        ) {
            let grid: Vec<f32> = (0..40).map(|i| match i {
                0 => -0.0,
                1 => 0.0,
                _ => (i as f32 - 25.0) * 0.37,
            }).collect();
            let logits: Vec<f32> = picks.iter().map(|&i| grid[i]).collect();
            let inv_t = 1.0 / t as f64;
            let got = nucleus(&logits, inv_t, p);
            let mut w = Vec::new();
            let total = tandem_kernels::softmax_weights(&logits, inv_t as f32, &mut w);
            let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
            ids.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
            let mut acc = 0f64;
            let keep = ids
                .iter()
                .position(|&id| {
                    acc += w[id as usize] as f64 / total;
                    acc >= p as f64
                })
                .map_or(ids.len(), |i| i + 1);
            ids.truncate(keep);
            let kept: f64 = ids.iter().map(|&id| w[id as usize] as f64).sum();
            let probs: Vec<u32> = ids.iter().map(|&id| ((w[id as usize] as f64 / kept) as f32).to_bits()).collect();
            prop_assert_eq!(&got.ids, &ids);
            prop_assert_eq!(got.probs.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), probs);
        }

        /// From any ids that hold the top k (ties at the boundary included; all ids
        /// without k), `distribution_of` is `distribution` of the full logits, bit for bit.
        #[test]
        fn distributions_of_the_top_ids_are_the_full_ones(
            logits in proptest::collection::vec((-4i32..4).prop_map(|v| v as f32 * 0.5), 1..60),
            t in 0.05f32..2.0, k in proptest::option::of(1usize..20), p in 0.05f32..=1.0,
            greedy in any::<bool>(), extra in proptest::collection::vec(any::<bool>(), 60),
        ) {
            let prm = SamplingParams { temperature: if greedy { 0.0 } else { t }, top_k: k, top_p: p, seed: 1 };
            let mut sorted = logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let kth = match (greedy, k) {
                (true, _) => sorted[0],
                (false, Some(k)) => sorted[k.min(sorted.len()) - 1],
                (false, None) => f32::NEG_INFINITY,
            };
            let ids: Vec<u32> = (0..logits.len() as u32)
                .filter(|&i| logits[i as usize] >= kth || extra[i as usize])
                .collect();
            let values: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
            let (got, want) = (distribution_of(&ids, &values, &prm), distribution(&logits, &prm));
            prop_assert_eq!(&got.ids, &want.ids);
            let bits = |d: &SparseDist| d.probs.iter().map(|p| p.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&got), bits(&want));
        }
    }
}

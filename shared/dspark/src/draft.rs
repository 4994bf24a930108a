//! The inference forward (DSpark, arXiv 2607.05147, §3.1 and Alg. 1): a per-session
//! context cache holding each layer's projected context keys and values (committed
//! context never changes, so rows are appended once and never re-projected), then one
//! parallel backbone pass over the block and sequential Markov sampling of its tokens.

use candle_core::{Device, Tensor};
use candle_nn::kv_cache::{Cache, KvCache};
use tandem_core::{distribution, DraftBlock, Sampler, SparseDist};

use crate::backbone::ContextKv;
use crate::error::{DsparkError, Result};
use crate::model::{DraftHead, Dspark};

/// Initial capacity (positions) of a context cache, and its growth step.
const CACHE_CHUNK: usize = 256;

/// One session's committed context as the drafter has projected it.
pub struct ContextCache {
    ctx: Cache,
    layers: Vec<KvCache>,
    width: usize,
}

impl ContextCache {
    /// Number of context positions received.
    pub fn len(&self) -> usize {
        self.ctx.current_seq_len()
    }

    /// Whether no position was received yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `H_ctx [len, d]`: the projected, normalised context rows (`None` when empty).
    pub fn context_rows(&self) -> Result<Option<Tensor>> {
        Ok(self.ctx.current_data()?)
    }
}

/// A block to draft after `anchor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftRequest {
    /// The target token the block follows (target id).
    pub anchor: u32,
    /// Tokens to draft, `1..=gamma` of the config.
    pub gamma: usize,
}

/// Teacher-forced draft outputs of one block (for evaluation and tests).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredBlock {
    /// One row of draft-vocabulary logits per block position.
    pub logits: Vec<Vec<f32>>,
    /// One confidence per block position.
    pub confidences: Vec<f32>,
}

/// The parallel part of a block: final states and base logits (before Markov).
struct Backbone {
    out: Tensor,
    base: Vec<f32>,
    vd: usize,
}

impl Dspark {
    /// An empty context cache for one session.
    pub fn new_cache(&self) -> ContextCache {
        ContextCache {
            ctx: Cache::new(0, CACHE_CHUNK),
            layers: (0..self.cfg.n_layers)
                .map(|_| KvCache::new(0, CACHE_CHUNK))
                .collect(),
            width: self.row_width(),
        }
    }

    /// Appends snapshot rows (row-major, [`Dspark::row_width`] floats each) of the next
    /// committed positions: projects them once into every layer's keys and values.
    pub fn extend(&self, cache: &mut ContextCache, rows: &[f32]) -> Result<()> {
        if cache.width != self.row_width() || !rows.len().is_multiple_of(cache.width) {
            return Err(DsparkError::Invalid(format!(
                "{} floats is not a whole number of rows of {}",
                rows.len(),
                self.row_width()
            )));
        }
        let n = rows.len() / cache.width;
        if n == 0 {
            return Ok(());
        }
        let taps = Tensor::from_slice(rows, (n, cache.width), &Device::Cpu)?;
        let h_ctx = self.params.context(&taps, self.dims.eps)?;
        for (layer, kv) in self.params.layers.iter().zip(&mut cache.layers) {
            let (k, v) = layer.context_kv(&h_ctx, self.dims.eps)?;
            kv.append(&k, &v)?;
        }
        cache.ctx.append(&h_ctx)?;
        Ok(())
    }

    /// The block after `anchor` with teacher-forced previous tokens `prev` (target ids,
    /// `prev[0] == anchor`), one position per entry: the logits and confidences of the
    /// training forward, computed through the cache and the quantized head.
    pub fn score(
        &self,
        cache: &ContextCache,
        head: &DraftHead,
        prev: &[u32],
    ) -> Result<ScoredBlock> {
        let anchor = *prev
            .first()
            .ok_or_else(|| DsparkError::Invalid("no previous tokens".into()))?;
        self.check_request(DraftRequest {
            anchor,
            gamma: prev.len(),
        })?;
        let bb = self.backbone(cache, head, anchor, prev.len())?;
        let mut scored = ScoredBlock {
            logits: Vec::new(),
            confidences: Vec::new(),
        };
        for (k, t) in prev.iter().enumerate() {
            self.check_token(*t)?;
            let (logits, conf) = self.markov_step(&bb, k, *t)?;
            scored.logits.push(logits);
            scored.confidences.push(conf);
        }
        Ok(scored)
    }

    /// Drafts `req.gamma` tokens after `req.anchor`: greedy or sampled by `sampler`'s
    /// parameters, each token's distribution returned exactly (target ids).
    pub fn draft(
        &self,
        cache: &ContextCache,
        head: &DraftHead,
        req: &DraftRequest,
        sampler: &mut Sampler,
    ) -> Result<DraftBlock> {
        self.check_request(*req)?;
        let bb = self.backbone(cache, head, req.anchor, req.gamma)?;
        let mut block = DraftBlock::default();
        let mut prev = req.anchor;
        for k in 0..req.gamma {
            let (logits, conf) = self.markov_step(&bb, k, prev)?;
            let dist = distribution(&logits, sampler.params());
            let pick = match dist.ids.len() {
                1 => dist.ids[0],
                _ => dist.draw(sampler.uniform()),
            };
            prev = self.vocab.target_id(pick as usize);
            block.tokens.push(prev);
            block.confidences.push(conf);
            block.dists.push(SparseDist {
                ids: dist
                    .ids
                    .iter()
                    .map(|i| self.vocab.target_id(*i as usize))
                    .collect(),
                probs: dist.probs,
            });
        }
        Ok(block)
    }

    fn check_request(&self, req: DraftRequest) -> Result<()> {
        if req.gamma == 0 || req.gamma > self.cfg.gamma {
            return Err(DsparkError::Invalid(format!(
                "gamma {} is outside 1..={}",
                req.gamma, self.cfg.gamma
            )));
        }
        self.check_token(req.anchor)
    }

    fn check_token(&self, t: u32) -> Result<()> {
        if t as usize >= self.dims.vocab {
            return Err(DsparkError::Invalid(format!(
                "token {t} is outside the target vocabulary of {}",
                self.dims.vocab
            )));
        }
        Ok(())
    }

    /// The backbone over the full configured block (as trained), base logits of the first
    /// `gamma` positions through the quantized head.
    fn backbone(
        &self,
        cache: &ContextCache,
        head: &DraftHead,
        anchor: u32,
        gamma: usize,
    ) -> Result<Backbone> {
        if head.restricted.len() != self.vocab.len() {
            return Err(DsparkError::Invalid(format!(
                "the head scores {} tokens, the drafter {}",
                head.restricted.len(),
                self.vocab.len()
            )));
        }
        let p = &self.params;
        let emb = head.target.embed(anchor)?;
        let emb = Tensor::from_vec(emb, (1, self.dims.hidden), &Device::Cpu)?;
        let mut block = p.block(&emb)?;
        for (layer, kv) in p.layers.iter().zip(&cache.layers) {
            let (k, v) = (kv.k()?, kv.v()?);
            let (k, v) = (unsqueeze(k)?, unsqueeze(v)?);
            let ctx = ContextKv {
                k: k.as_ref(),
                v: v.as_ref(),
                bias: None,
            };
            block = layer.forward(&block, &ctx, self.shape())?;
        }
        let (out, hidden) = p.outputs(&block.squeeze(0)?, self.dims.eps)?;
        let rows = hidden
            .narrow(0, 0, gamma)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let base = head.restricted.logits(&rows, gamma)?;
        Ok(Backbone {
            out,
            base,
            vd: head.restricted.len(),
        })
    }

    /// Logits and confidence of block position `k` given the previous token `prev`.
    fn markov_step(&self, bb: &Backbone, k: usize, prev: u32) -> Result<(Vec<f32>, f32)> {
        let p = &self.params;
        let e1 = p.markov_w1.narrow(0, self.vocab.markov_row(prev), 1)?;
        let markov = e1.matmul(&p.markov_w2)?.squeeze(0)?.to_vec1::<f32>()?;
        let mut logits = bb.base[k * bb.vd..(k + 1) * bb.vd].to_vec();
        logits.iter_mut().zip(&markov).for_each(|(l, m)| *l += m);
        let conf = p
            .confidence(&bb.out.narrow(0, k, 1)?, &e1)?
            .squeeze(0)?
            .to_scalar::<f32>()?;
        Ok((logits, conf))
    }
}

fn unsqueeze(t: Option<Tensor>) -> Result<Option<Tensor>> {
    Ok(t.map(|t| t.unsqueeze(0)).transpose()?)
}

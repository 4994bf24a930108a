//! Drafting the blocks of several sessions in one pass (DSpark, arXiv 2607.05147: the
//! block forward is one forward for many rows). The backbone takes every session's block
//! rows together — each projection reads its weights once for the whole batch — with
//! attention per session over its own context and its own rows (as many as its own γ
//! asks for, so a session's block never depends on another's γ); the restricted head
//! scores every drafted position at once; the sequential Markov pass runs block position
//! `k` of every session as one product. The kernels are batch invariant, so each
//! session's block is bit for bit the block it gets drafting alone, and each session
//! draws from its own sampler.

use tandem_core::{distribution, DraftBlock, Sampler, SparseDist};
use tandem_kernels::rms_norm;

use crate::config::DraftVocab;
use crate::draft::{block_rows, check_request, check_token, ContextCache, DraftRequest, Drafter};
use crate::error::{DsparkError, Result};
use crate::frozen::first_rows;

/// One session's block in a batched draft: its context, what it asks for, its sampler.
pub struct DraftJob<'a> {
    /// The session's projected context.
    pub cache: &'a ContextCache,
    /// The block to draft.
    pub req: DraftRequest,
    /// The session's sampler (greedy or sampled by its parameters).
    pub sampler: &'a mut Sampler,
}

/// The parallel part of the blocks of a batch: final states of every block row of every
/// session (its drafted positions and one more, [`block_rows`]), and base logits (before
/// Markov) of the positions drafted.
pub(crate) struct Backbones {
    /// The first row of `out` of each session.
    out_row: Vec<usize>,
    /// `[Σ rows, d]`.
    out: Vec<f32>,
    /// `[Σ γ, vd]`: each session's drafted positions in order.
    base: Vec<f32>,
    /// The first row of `base` of each session.
    base_row: Vec<usize>,
}

/// Block position `k` of session `item` after target token `prev`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MarkovRow {
    pub(crate) item: usize,
    pub(crate) k: usize,
    pub(crate) prev: u32,
}

impl Drafter {
    /// Drafts the block each job asks for, all in one pass: the same blocks (tokens,
    /// confidences, distributions, sampler draws) as drafting each alone. A job whose
    /// request is invalid fails alone; the others are drafted.
    pub fn draft_many(&self, jobs: &mut [DraftJob<'_>]) -> Vec<Result<DraftBlock>> {
        let mut out: Vec<Option<Result<DraftBlock>>> = jobs
            .iter()
            .map(|j| {
                check_request(j.req, self.gamma, self.vocab_size)
                    .err()
                    .map(Err)
            })
            .collect();
        let valid: Vec<usize> = (0..jobs.len()).filter(|i| out[*i].is_none()).collect();
        if !valid.is_empty() {
            match self.draft_valid(jobs, &valid) {
                Ok(blocks) => valid
                    .iter()
                    .zip(blocks)
                    .for_each(|(i, b)| out[*i] = Some(Ok(b))),
                Err(e) => valid.iter().for_each(|i| {
                    out[*i] = Some(Err(DsparkError::Batch(e.to_string())));
                }),
            }
        }
        out.into_iter().flatten().collect()
    }

    /// [`Drafter::draft_many`] of the checked jobs `valid`.
    fn draft_valid(&self, jobs: &mut [DraftJob<'_>], valid: &[usize]) -> Result<Vec<DraftBlock>> {
        let items: Vec<(&ContextCache, DraftRequest)> = valid
            .iter()
            .map(|i| (jobs[*i].cache, jobs[*i].req))
            .collect();
        let bb = self.backbones(&items)?;
        let reqs: Vec<DraftRequest> = items.iter().map(|(_, r)| *r).collect();
        let mut samplers: Vec<&mut Sampler> = jobs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| valid.contains(i))
            .map(|(_, j)| &mut *j.sampler)
            .collect();
        let params: Vec<_> = samplers.iter().map(|s| *s.params()).collect();
        sample_blocks(&self.vocab, &reqs, &mut samplers, |rows| {
            let scored = self.markov_rows(&bb, rows)?;
            Ok(scored
                .into_iter()
                .zip(rows)
                .map(|((logits, conf), r)| (distribution(&logits, &params[r.item]), conf))
                .collect())
        })
    }

    /// The backbone over each item's block rows ([`block_rows`]), base logits of its
    /// first `gamma` positions through the restricted head.
    pub(crate) fn backbones(&self, items: &[(&ContextCache, DraftRequest)]) -> Result<Backbones> {
        let f = &self.frozen;
        let d = f.heads.width();
        let rows: Vec<usize> = items
            .iter()
            .map(|(_, req)| block_rows(req.gamma, self.gamma))
            .collect();
        let mut h = Vec::with_capacity(rows.iter().sum::<usize>() * d);
        for ((_, req), n) in items.iter().zip(&rows) {
            h.extend_from_slice(&f.heads.block(&self.target.embed(req.anchor)?)?[..n * d]);
        }
        for (l, layer) in f.layers.iter().enumerate() {
            let ctxs: Vec<_> = items.iter().map(|(c, _)| &c.layers[l]).collect();
            h = layer.forward(&h, (&ctxs, &rows), self.heads, self.eps)?;
        }
        let out = rms_norm(&h, &f.out_norm, self.eps);
        let out_row = first_rows(&rows);
        let (mut drafted, mut base_row) = (Vec::new(), Vec::with_capacity(items.len()));
        for ((_, req), first) in items.iter().zip(&out_row) {
            base_row.push(drafted.len() / d);
            drafted.extend_from_slice(&out[first * d..(first + req.gamma) * d]);
        }
        let m = drafted.len() / d;
        let hidden = f.out_proj.apply(&drafted, m)?;
        let base = self.restricted.logits(&hidden, m)?;
        Ok(Backbones {
            out_row,
            out,
            base,
            base_row,
        })
    }

    /// Logits over the draft vocabulary and confidence of each row, the Markov head's
    /// products of all rows in one.
    pub(crate) fn markov_rows(
        &self,
        bb: &Backbones,
        rows: &[MarkovRow],
    ) -> Result<Vec<(Vec<f32>, f32)>> {
        let f = &self.frozen;
        let (vd, d) = (self.restricted.len(), f.heads.width());
        let mut e1 = Vec::new();
        for r in rows {
            check_token(r.prev, self.vocab_size)?;
            e1.extend_from_slice(f.heads.markov_e1(self.vocab.markov_row(r.prev)));
        }
        let markov = f.markov_w2.apply(&e1, rows.len())?;
        Ok(rows
            .iter()
            .zip(markov.chunks_exact(vd))
            .map(|(r, m)| {
                let at = bb.base_row[r.item] + r.k;
                let mut logits = m.to_vec();
                logits
                    .iter_mut()
                    .zip(&bb.base[at * vd..(at + 1) * vd])
                    .for_each(|(l, b)| *l += b);
                let state = (bb.out_row[r.item] + r.k) * d;
                let row = self.vocab.markov_row(r.prev);
                let conf = f.heads.confidence(&bb.out[state..state + d], row);
                (logits, conf)
            })
            .collect())
    }
}

/// Draws the blocks of `reqs`, block position by block position (Alg. 1's sequential
/// Markov pass): `step(rows)` gives, for position `k` of every block still drafting, its
/// distribution over the draft vocabulary and its confidence after the target token drawn
/// before it (`prev`, the anchor at `k = 0`); each block draws from its own sampler (one
/// uniform a position), from the distribution without its tail ([`SparseDist::without_tail`]).
pub(crate) fn sample_blocks(
    vocab: &DraftVocab,
    reqs: &[DraftRequest],
    samplers: &mut [&mut Sampler],
    mut step: impl FnMut(&[MarkovRow]) -> Result<Vec<(SparseDist, f32)>>,
) -> Result<Vec<DraftBlock>> {
    let mut blocks = vec![DraftBlock::default(); reqs.len()];
    let mut prev: Vec<u32> = reqs.iter().map(|r| r.anchor).collect();
    let longest = reqs.iter().map(|r| r.gamma).max().unwrap_or(0);
    for k in 0..longest {
        let rows: Vec<MarkovRow> = (0..reqs.len())
            .filter(|i| reqs[*i].gamma > k)
            .map(|item| MarkovRow {
                item,
                k,
                prev: prev[item],
            })
            .collect();
        for (r, (dist, conf)) in rows.iter().zip(step(&rows)?) {
            let dist = match dist.ids.len() {
                1 => dist,
                _ => dist.without_tail(vocab.len()),
            };
            // One uniform a position, drawn or not, as the device's sampled pass takes them.
            let u = samplers[r.item].uniform();
            let pick = match dist.ids.len() {
                1 => dist.ids[0],
                _ => dist.draw(u),
            };
            prev[r.item] = vocab.target_id(pick as usize);
            let block = &mut blocks[r.item];
            block.tokens.push(prev[r.item]);
            block.confidences.push(conf);
            block.dists.push(SparseDist {
                ids: dist
                    .ids
                    .iter()
                    .map(|i| vocab.target_id(*i as usize))
                    .collect(),
                probs: dist.probs,
            });
        }
    }
    Ok(blocks)
}

//! The Gemma 4 assistant drafter (reference: transformers 5.24 `Gemma4AssistantForCausalLM`
//! driven by `SinglePositionMultiTokenCandidateGenerator`; the maths also follows the MLX
//! drafter in seeds/gemma-assistant-drafter.diff.txt).
//!
//! One step per drafted token, batched over rows (sessions) that each have their own
//! position and donors: `h = pre_projection([E_target(token) · sqrt(H); target hidden])`,
//! then a few Gemma 4 layers whose attention is query-only over the target's donor keys
//! and values (the last non-shared sliding layer for sliding layers, the last full one for
//! full layers) at the row's fixed position, the final norm, the head, and
//! `post_projection(h)` as the next step's "target hidden". The head's logits (transformers'
//! row, see [`super::draft_head`]) go to a caller's choice of the step's token, which is the
//! next step's input: [`Gemma4Assistant::draft`] takes the greedy token, as transformers'
//! loop does, and [`Gemma4Assistant::draft_with`] lets the caller sample. A row's donors
//! hold either the row's position itself (the token was already run by the target) or only
//! the positions before it (speculative decoding: the anchor is not yet run, and the hidden
//! is that of the position before it, as in transformers' generation loop); queries attend
//! to every donor position up to the row's. Sliding layers see donor positions `kv` with
//! `position - kv <= sliding_window`: transformers' assistant mask is
//! `|position - kv| <= sliding_window` (the MLX drafter uses `sliding_window`).

use std::path::Path;

use tandem_kernels::QMatrix;

use super::block::{linear, FeedForward, Query, Weights};
use super::cache::{DonorKv, Donors};
use super::config::{AssistantConfig, LayerSpec};
use super::draft_head::{greedy_token, DraftHead};
use super::model::Gemma4Embedding;
use crate::attention::{attend, AttnSpec};
use crate::error::{GemmaError, Result};
use crate::ops::rms_norm;

/// Where one row's drafting starts.
#[derive(Debug, Clone, Copy)]
pub struct DraftRow<'a> {
    /// The last committed token (its target embedding is the first input).
    pub token: u32,
    /// The target's final-norm hidden state at the last position it ran: `position`, or
    /// `position - 1` when `token` is not yet run (`backbone_hidden_size` floats).
    pub hidden: &'a [f32],
    /// Position of `token`; every step of the row attends from here.
    pub position: usize,
    /// The target's donor keys and values, holding at least positions `0..position` (and
    /// at least one position); keys past `position` are not read.
    pub donors: Donors<'a>,
}

/// What one row drafted.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Draft {
    /// Drafted token ids.
    pub tokens: Vec<u32>,
    /// The head's logit of each drafted token.
    pub logits: Vec<f32>,
    /// `post_projection` output of each step (the next step's hidden input).
    pub next_hidden: Vec<Vec<f32>>,
}

struct Layer {
    spec: LayerSpec,
    query: Query,
    o: QMatrix,
    ffn: FeedForward,
}

/// A loaded assistant drafter. Immutable and shareable across threads.
pub struct Gemma4Assistant {
    cfg: AssistantConfig,
    pre: QMatrix,
    post: QMatrix,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    head: DraftHead,
}

impl Gemma4Assistant {
    /// Loads an HF directory. A missing tensor, a wrong shape or an invalid config is an
    /// error, and nothing loaded so far is kept.
    pub fn load(dir: &Path) -> Result<Self> {
        let (w, text) = Weights::open(dir)?;
        let cfg = AssistantConfig::from_hf_json(&text).map_err(|e| match e {
            GemmaError::Config(reason) => GemmaError::format(dir.join("config.json"), reason),
            other => other,
        })?;
        let t = &cfg.text;
        let (h, bb) = (t.hidden_size, cfg.backbone_hidden_size);
        let layers = (0..t.num_layers())
            .map(|i| {
                let spec = t.layers[i];
                let o_name = w.model(&format!("layers.{i}.self_attn.o_proj.weight"));
                Ok(Layer {
                    spec,
                    query: Query::load(&w, t, i, spec)?,
                    o: w.matrix(&o_name, h, t.num_attention_heads * spec.head_dim)?,
                    ffn: FeedForward::load(&w, t, i)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            pre: w.matrix("pre_projection.weight", h, 2 * bb)?,
            post: w.matrix("post_projection.weight", bb, h)?,
            layers,
            final_norm: w.vector(&w.model("norm.weight"), h)?,
            head: DraftHead::load(&w, &cfg)?,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AssistantConfig {
        &self.cfg
    }

    /// Whether the centroid head (rather than the dense tied head) scores tokens.
    pub fn uses_centroids(&self) -> bool {
        self.head.uses_centroids()
    }

    /// Drafts `steps` greedy tokens for every row (the highest logit, ties to the lowest
    /// id), all rows in one batch per step.
    pub fn draft(
        &self,
        embedding: &Gemma4Embedding,
        rows: &[DraftRow<'_>],
        steps: usize,
    ) -> Result<Vec<Draft>> {
        self.draft_with(embedding, rows, steps, |_, logits| greedy_token(logits))
    }

    /// Drafts `steps` tokens for every row, all rows in one batch per step: at each step,
    /// `choose(row, logits)` picks row `row`'s token from the head's `vocab_size` logits, and
    /// that token is the row's next input. A token outside the vocabulary is an error.
    pub fn draft_with(
        &self,
        embedding: &Gemma4Embedding,
        rows: &[DraftRow<'_>],
        steps: usize,
        mut choose: impl FnMut(usize, &[f32]) -> u32,
    ) -> Result<Vec<Draft>> {
        self.check(embedding, rows)?;
        let bb = self.cfg.backbone_hidden_size;
        let mut tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
        let mut hidden: Vec<f32> = rows.iter().flat_map(|r| r.hidden.iter().copied()).collect();
        let mut drafts = vec![Draft::default(); rows.len()];
        for _ in 0..steps {
            let mut x = vec![0f32; rows.len() * 2 * bb];
            for ((input, t), h) in x
                .chunks_exact_mut(2 * bb)
                .zip(&tokens)
                .zip(hidden.chunks(bb))
            {
                embedding.embed_into(*t, &mut input[..bb])?;
                input[bb..].copy_from_slice(h);
            }
            let (logits, next) = self.step(&x, rows)?;
            for (r, (d, h)) in drafts.iter_mut().zip(next.chunks(bb)).enumerate() {
                let token = choose(r, &logits[r]);
                let logit = logits[r].get(token as usize).ok_or_else(|| {
                    GemmaError::Request(format!("row {r}: token {token} is outside the vocabulary"))
                })?;
                d.tokens.push(token);
                d.logits.push(*logit);
                d.next_hidden.push(h.to_vec());
                tokens[r] = token;
            }
            hidden = next;
        }
        Ok(drafts)
    }

    fn check(&self, embedding: &Gemma4Embedding, rows: &[DraftRow<'_>]) -> Result<()> {
        let bb = self.cfg.backbone_hidden_size;
        if embedding.width() != bb {
            return Err(GemmaError::Request(format!(
                "target embedding width {} is not the assistant's backbone size {bb}",
                embedding.width()
            )));
        }
        for (r, row) in rows.iter().enumerate() {
            if row.hidden.len() != bb {
                return Err(GemmaError::Request(format!(
                    "row {r}: hidden of {} floats, expected {bb}",
                    row.hidden.len()
                )));
            }
            for l in &self.layers {
                let heads = self.cfg.text.num_attention_heads;
                check_donor(r, row, self.donor(row, l.spec.sliding), l, heads)?;
            }
        }
        Ok(())
    }

    fn donor<'a>(&self, row: &DraftRow<'a>, sliding: bool) -> DonorKv<'a> {
        match sliding {
            true => row.donors.sliding,
            false => row.donors.full,
        }
    }

    /// One step: inputs `x` are `rows × 2*backbone`; returns each row's logits and the
    /// next hiddens.
    fn step(&self, x: &[f32], rows: &[DraftRow<'_>]) -> Result<(Vec<Vec<f32>>, Vec<f32>)> {
        let t = &self.cfg.text;
        let (b, eps) = (rows.len(), t.rms_norm_eps as f32);
        let positions: Vec<usize> = rows.iter().map(|r| r.position).collect();
        let mut h = linear(&self.pre, x, b)?;
        for l in &self.layers {
            let normed = rms_norm(&h, &l.ffn.input_norm, eps);
            let q = l.query.compute(&normed, &positions, eps)?;
            let attn = self.attend(l, &q, rows);
            let o = linear(&l.o, &attn, b)?;
            l.ffn.finish(&mut h, o, eps)?;
            l.ffn.scale(&mut h);
        }
        let normed = rms_norm(&h, &self.final_norm, eps);
        let logits = normed
            .chunks_exact(t.hidden_size)
            .map(|row| self.head.logits(row))
            .collect::<Result<Vec<_>>>()?;
        Ok((logits, linear(&self.post, &normed, b)?))
    }

    fn attend(&self, l: &Layer, q: &[f32], rows: &[DraftRow<'_>]) -> Vec<f32> {
        let q_dim = self.cfg.text.num_attention_heads * l.spec.head_dim;
        rows.iter()
            .zip(q.chunks_exact(q_dim))
            .flat_map(|(row, qr)| {
                let donor = self.donor(row, l.spec.sliding);
                // The last key read; checked to be `position` or `position - 1`.
                let last = row.position.min(donor.len() - 1);
                let window = self.cfg.text.sliding_window + 1 + last - row.position;
                let spec = AttnSpec {
                    pos0: last,
                    n_heads: self.cfg.text.num_attention_heads,
                    n_kv_heads: donor.kv_heads,
                    head_dim: donor.head_dim,
                    scale: 1.0,
                    window: l.spec.sliding.then_some(window),
                    softcap: None,
                };
                attend(qr, donor.k, donor.v, spec)
            })
            .collect()
    }
}

/// The donor must hold the row's position and have the layer's head width; its key/value
/// heads are shared by query heads in groups, as in transformers' `repeat_kv`.
fn check_donor(
    r: usize,
    row: &DraftRow<'_>,
    donor: DonorKv<'_>,
    l: &Layer,
    heads: usize,
) -> Result<()> {
    let kind = if l.spec.sliding { "sliding" } else { "full" };
    if donor.head_dim != l.spec.head_dim
        || donor.kv_heads == 0
        || !heads.is_multiple_of(donor.kv_heads)
    {
        return Err(GemmaError::Request(format!(
            "row {r}: {kind} donor has {} key/value heads of {}, the assistant needs heads of {} \
             in groups of its {heads} query heads",
            donor.kv_heads, donor.head_dim, l.spec.head_dim
        )));
    }
    if donor.len() < row.position.max(1) || donor.v.len() != donor.k.len() {
        return Err(GemmaError::Request(format!(
            "row {r}: {kind} donor holds {} positions, position {} needs {}",
            donor.len(),
            row.position,
            row.position.max(1)
        )));
    }
    Ok(())
}

//! One generation's mirror of the target: the donor keys and values of every committed
//! position (sliding and full donor layer) and the last committed position's hidden state,
//! appended in order from snapshot rows; `propose` drafts from them, each token chosen by
//! [`crate::choice`] with the session's own seeded sampler.

use std::sync::Arc;

use tandem_core::calibration::Regime;
use tandem_core::{
    DraftBlock, DraftSource, ProposeError, ProposeRequest, ProposerSession, Sampler, SnapshotRows,
};
use tandem_gemma::gemma4::{DonorKv, Donors, DraftRow};

use crate::choice::{choose, Choice};
use crate::proposer::{DonorLayer, Shared};

/// Keys and values of one donor layer, `len × width` each.
#[derive(Default)]
struct Mirror {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Mirror {
    fn view(&self, d: DonorLayer) -> DonorKv<'_> {
        DonorKv {
            k: &self.k,
            v: &self.v,
            kv_heads: d.kv_heads,
            head_dim: d.head_dim,
        }
    }
}

/// A drafting session.
pub(crate) struct AssistantSession {
    shared: Arc<Shared>,
    /// The sliding donor's mirror, then the full donor's.
    mirrors: [Mirror; 2],
    last_hidden: Vec<f32>,
    len: usize,
    /// The request's sampling parameters, with a seed of the session's own.
    sampler: Sampler,
    /// The calibration of the request's sampling regime, if the assistant has one.
    regime: Option<Regime>,
}

fn invalid<T>(msg: String) -> Result<T, ProposeError> {
    Err(ProposeError::Invalid(msg))
}

impl AssistantSession {
    pub(crate) fn new(shared: Arc<Shared>, sampler: Sampler, regime: Option<Regime>) -> Self {
        Self {
            shared,
            mirrors: [Mirror::default(), Mirror::default()],
            last_hidden: Vec::new(),
            len: 0,
            sampler,
            regime,
        }
    }

    fn check(&self, req: &ProposeRequest) -> Result<(), ProposeError> {
        let sh = &self.shared;
        if req.position != self.len || self.len == 0 {
            return invalid(format!(
                "proposal at position {} after {} committed positions",
                req.position, self.len
            ));
        }
        if req.gamma == 0 || req.gamma > sh.max_gamma {
            return invalid(format!(
                "γ must be in 1..={}, got {}",
                sh.max_gamma, req.gamma
            ));
        }
        if req.anchor as usize >= sh.embedding.vocab_size() {
            return invalid(format!("anchor {} is outside the vocabulary", req.anchor));
        }
        Ok(())
    }
}

impl ProposerSession for AssistantSession {
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError> {
        let width = self.shared.spec.row_width();
        if rows.width != width {
            return invalid(format!("rows are {} wide, expected {width}", rows.width));
        }
        if rows.start != self.len {
            return invalid(format!(
                "rows start at position {}, {} positions received",
                rows.start, self.len
            ));
        }
        let layout = &self.shared.layout;
        for row in rows.data.chunks_exact(width) {
            for (mirror, (k, v)) in self.mirrors.iter_mut().zip(&layout.donors) {
                mirror.k.extend_from_slice(&row[k.clone()]);
                mirror.v.extend_from_slice(&row[v.clone()]);
            }
            self.last_hidden = row[layout.hidden.clone()].to_vec();
        }
        self.len += rows.rows();
        Ok(())
    }

    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        self.check(req)?;
        let sh = &self.shared;
        let [sliding, full] = sh.donors;
        let row = DraftRow {
            token: req.anchor,
            hidden: &self.last_hidden,
            position: req.position,
            donors: Donors {
                sliding: self.mirrors[0].view(sliding),
                full: self.mirrors[1].view(full),
            },
        };
        let mut chosen: Vec<Choice> = Vec::with_capacity(req.gamma);
        let sampler = &mut self.sampler;
        sh.model
            .draft_with(&sh.embedding, &[row], req.gamma, |_, logits| {
                let choice = choose(sampler, logits);
                let token = choice.token;
                chosen.push(choice);
                token
            })
            .map_err(|e| ProposeError::Unavailable(format!("assistant: {e}")))?;
        let mut block = DraftBlock {
            tokens: chosen.iter().map(|c| c.token).collect(),
            confidences: chosen.iter().map(|c| c.confidence).collect(),
            dists: chosen.into_iter().map(|c| c.dist).collect(),
            source: DraftSource::Model,
            calibrated: false,
        };
        if let Some(r) = &self.regime {
            block.calibrated = r.apply(block.source, &mut block.confidences);
        }
        Ok(block)
    }
}

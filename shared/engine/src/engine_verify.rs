//! A round's verdict (the engine's [`Generation`], continued): the forward of a round's
//! block, with the draw a plain sampled round's step makes for it where the target draws
//! in its shared steps, and the verdict on the draft from what the forward returned —
//! the step's draw, bounded rows (a plain round's draw, or token-wise verification through
//! [`BoundedRows`]), greedy ids, the target's top rows, or whole logits rows with the
//! request's controls — by the request's rule.

use std::cell::RefCell;

use candle_core::Tensor;
use tandem_core::{
    accept_greedy, accept_sampled_rows, argmax, distribution, distribution_of, draw_bounded,
    min_p_mask, token_logprob, BoundedLogits, BoundedRows, DraftBlock, ExpectedKept, LogitControls,
    SnapshotSpec, Verdict, Verification,
};
use tandem_gemma::{argmax_rows, BoundedRow, GemmaError, LogitsMode, TopRow};

use super::Generation;
use crate::error::{EngineError, Result};
use crate::fetch::{accept_fetching, fetches, plain_draw};
use crate::models::TargetStep;
use crate::request::GenerationRequest;

impl Generation<'_> {
    /// A round's forward of `block` at `n`; a plain round whose target draws in its shared
    /// steps gets its token drawn there ([`plain_draw`]), as its rule would draw it.
    pub(super) fn forward_round(
        &mut self,
        block: &[u32],
        n: usize,
        mode: LogitsMode,
        full: bool,
    ) -> Result<TargetStep> {
        let first = self.history.generated();
        let draw = (block.len() == 1 && self.cache.draws_in_steps())
            .then(|| {
                plain_draw(
                    self.req.verification,
                    &self.controls,
                    &mut self.sampler,
                    first,
                    full,
                )
            })
            .flatten();
        let Some(draw) = draw else {
            return self.forward(block, n, mode);
        };
        let none = SnapshotSpec::default();
        let spec = self.drafting.as_ref().map_or(&none, |d| d.spec());
        let out = self.cache.forward_drawn(block, n, draw, spec)?;
        match out.drawn {
            Some(_) => Ok(out),
            None => Err(EngineError::Model(GemmaError::Request(
                "the target drew no token for a plain sampled round".into(),
            ))),
        }
    }

    /// Accepts a prefix of `draft` against the target logits of `out` and chooses the next
    /// token, with the request's sampling and logit controls applied identically to plain
    /// decoding (each position's controls count the drafts before it as output); sampled
    /// block verification also says what each rule keeps of the block in expectation. The
    /// log-probabilities of the tokens it keeps, when asked for, wait for [`Self::emit`].
    pub(super) fn verify(
        &mut self,
        out: &TargetStep,
        draft: &DraftBlock,
    ) -> Result<(Verdict, Option<ExpectedKept>)> {
        if let Some(next) = out.drawn {
            return Ok((Verdict { accepted: 0, next }, None));
        }
        let rows = draft.tokens.len() + 1;
        if !out.bounded.is_empty() {
            if draft.tokens.is_empty() {
                let next = self.draw_bounded(&out.bounded[out.bounded.len() - 1])?;
                return Ok((Verdict { accepted: 0, next }, None));
            }
            return Ok((self.verify_bounded(&out.bounded, rows, draft)?, None));
        }
        let sampling = self.req.sampling;
        if let Some(top) = &out.top {
            let top = top.get(..rows).ok_or_else(|| {
                EngineError::InvalidRequest(format!("forward returned {} top rows", top.len()))
            })?;
            if sampling.is_greedy() {
                let ids: Vec<u32> = top.iter().map(TopRow::first_max).collect();
                return Ok((accept_greedy(&draft.tokens, &ids), None));
            }
            let min_p = self.controls.min_p;
            return Ok(self.req.verification.accept(
                &draft.tokens,
                &draft.dists,
                |i| {
                    let mut values = top[i].values.clone();
                    min_p_mask(&mut values, min_p, sampling.temperature);
                    distribution_of(&top[i].ids, &values, &sampling)
                },
                &mut self.sampler,
                self.history.generated(),
            ));
        }
        let logits = out
            .logits
            .as_ref()
            .ok_or_else(|| EngineError::InvalidRequest("forward returned no logits".into()))?;
        let controlled = self.controls.is_active(sampling.temperature);
        if sampling.is_greedy() && !controlled && self.req.logprobs.is_none() {
            let ids = greedy_tokens(logits, rows)?;
            return Ok((accept_greedy(&draft.tokens, &ids), None));
        }
        let uncontrolled = !controlled && self.req.logprobs.is_none();
        if !sampling.is_greedy() && uncontrolled && fetches(self.req.verification) {
            let first = self.history.generated();
            let v = self.req.verification;
            return accept_fetching(v, logits, draft, &mut self.sampler, first);
        }
        let raw = logits_rows(logits, rows)?;
        let mut controlled_rows = Vec::new();
        if controlled {
            controlled_rows = raw.clone();
            for (i, row) in controlled_rows.iter_mut().enumerate() {
                let drafted = &draft.tokens[..i];
                self.controls
                    .apply(row, &self.history, drafted, sampling.temperature);
            }
        }
        let rows = match controlled {
            true => &controlled_rows,
            false => &raw,
        };
        let (verdict, expected) = match sampling.is_greedy() {
            true => {
                let ids: Vec<u32> = rows.iter().map(|r| argmax(r)).collect();
                (accept_greedy(&draft.tokens, &ids), None)
            }
            false => self.req.verification.accept(
                &draft.tokens,
                &draft.dists,
                |i| distribution(&rows[i], &sampling),
                &mut self.sampler,
                self.history.generated(),
            ),
        };
        if let Some(top) = self.req.logprobs {
            let kept = verdict.emitted(&draft.tokens);
            self.logprobs.fresh = (kept.iter().zip(&raw))
                .map(|(t, row)| token_logprob(row, *t, top))
                .collect();
        }
        Ok((verdict, expected))
    }
}

impl Generation<'_> {
    /// Whether a round (or the prefill) asks its target for bounds on its rows' logits
    /// instead of the logits ([`LogitsMode::Bounded`] for a plain round's last row,
    /// [`LogitsMode::BoundedAll`] for a drafted round's): [`bounds_rows`], and the round
    /// needs no full row (`full`).
    pub(super) fn bounds(&self, full: bool) -> bool {
        !full && bounds_rows(self.req, &self.controls)
    }

    /// A plain round's token from its row's bounds ([`draw_bounded`], uniforms from the
    /// generation's sampler); from the whole row where the bounds give none.
    fn draw_bounded(&mut self, row: &BoundedRow) -> Result<u32> {
        let params = *self.sampler.params();
        let mut failed = None;
        let sampler = &mut self.sampler;
        let exact = |id| {
            row.logit(id).unwrap_or_else(|e| {
                failed.get_or_insert(e);
                f32::NAN
            })
        };
        let drawn = draw_bounded(&row.upper, params.temperature, exact, || sampler.uniform());
        if let Some(e) = failed {
            return Err(EngineError::Model(e));
        }
        match drawn {
            Some(id) => Ok(id),
            None => {
                self.formed_whole(1);
                let dist = distribution(&row.logits()?, &params);
                Ok(dist.draw(self.sampler.uniform()))
            }
        }
    }
}

impl Generation<'_> {
    /// Token-wise verification of `draft` against the first `rows` of `bounded` (the
    /// request samples at a temperature alone: [`bounds_rows`]).
    fn verify_bounded(
        &mut self,
        bounded: &[BoundedRow],
        rows: usize,
        draft: &DraftBlock,
    ) -> Result<Verdict> {
        let bounded = bounded.get(..rows).ok_or_else(|| {
            EngineError::InvalidRequest(format!("forward returned {} bounded rows", bounded.len()))
        })?;
        let failed = RefCell::new(None);
        let checked: Vec<Checked<'_>> = (bounded.iter())
            .map(|row| Checked {
                row,
                failed: &failed,
            })
            .collect();
        let params = *self.sampler.params();
        let mut target = BoundedRows::new(&checked, params);
        let verdict =
            accept_sampled_rows(&draft.tokens, &draft.dists, &mut target, &mut self.sampler);
        self.formed_whole(target.work().1);
        match failed.into_inner() {
            Some(e) => Err(EngineError::Model(e)),
            None => Ok(verdict),
        }
    }

    /// Counts `rows` bounded rows formed whole ([`SpecStats::whole_rows`](crate::SpecStats)).
    fn formed_whole(&mut self, rows: usize) {
        if rows > 0 {
            self.stats.whole_rows += rows as u64;
            tracing::debug!(
                rows,
                "bounds left a sampled row's question open: formed whole"
            );
        }
    }
}

/// A bounded row that keeps the first error of its exact logits (the rule reads numbers,
/// not results: a failed logit reads as NaN, a failed row as none).
struct Checked<'a> {
    row: &'a BoundedRow,
    failed: &'a RefCell<Option<GemmaError>>,
}

impl Checked<'_> {
    fn keep<T>(&self, r: std::result::Result<T, GemmaError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.failed.borrow_mut().get_or_insert(e);
                None
            }
        }
    }
}

impl BoundedLogits for Checked<'_> {
    fn upper(&self) -> &[f32] {
        &self.row.upper
    }

    fn logits_of(&self, ids: &[u32]) -> Vec<f32> {
        self.keep(self.row.logits_of(ids))
            .unwrap_or_else(|| vec![f32::NAN; ids.len()])
    }

    fn logits(&self) -> Option<Vec<f32>> {
        self.keep(self.row.logits())
    }
}

/// Whether `req`'s rounds draw from and verify against bounded rows: sampled at a
/// temperature alone, token-wise (seeded rounds draw by the inverse distribution), with no
/// controls and no log-probabilities.
fn bounds_rows(req: &GenerationRequest, controls: &LogitControls) -> bool {
    let params = &req.sampling;
    req.verification == Verification::Token
        && req.logprobs.is_none()
        && !controls.is_active(params.temperature)
        && params.temperature_alone()
}

/// The first `rows` rows of a `[m, vocab]` logits tensor.
fn first_rows(logits: &Tensor, rows: usize) -> Result<Tensor> {
    let have = logits.dim(0)?;
    if have < rows {
        return Err(EngineError::InvalidRequest(format!(
            "forward returned {have} logits rows, {rows} needed"
        )));
    }
    Ok(logits.narrow(0, 0, rows)?)
}

/// The first `rows` rows of a `[m, vocab]` logits tensor, on the host.
fn logits_rows(logits: &Tensor, rows: usize) -> Result<Vec<Vec<f32>>> {
    Ok(first_rows(logits, rows)?.to_vec2::<f32>()?)
}

/// The argmax of each of the first `rows` logits rows: [`argmax`] (ties to the lowest id)
/// for host logits; on the logits' device otherwise ([`argmax_rows`]), so that only the
/// ids travel.
fn greedy_tokens(logits: &Tensor, rows: usize) -> Result<Vec<u32>> {
    if logits.device().is_cpu() {
        return Ok(logits_rows(logits, rows)?
            .iter()
            .map(|r| argmax(r))
            .collect());
    }
    Ok(argmax_rows(&first_rows(logits, rows)?)?)
}

//! A round's verdict (the engine's [`Generation`], continued): the forward of a round's
//! block, with the draw a plain sampled round's step makes for it where the target draws
//! in its shared steps, and the verdict on the draft from what the forward returned —
//! the step's draw, a plain round's bounded row, greedy ids, the target's top rows, or
//! whole logits rows with the request's controls — by the request's rule.

use candle_core::Tensor;
use tandem_core::{
    accept_greedy, argmax, distribution, distribution_of, draw_bounded, min_p_mask, token_logprob,
    DraftBlock, ExpectedKept, LogitControls, SnapshotSpec, Verdict, Verification,
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
        if let Some(row) = &out.bounded {
            if !draft.tokens.is_empty() {
                return Err(EngineError::Model(GemmaError::Request(
                    "a bounded row cannot verify a draft".into(),
                )));
            }
            let next = self.draw_bounded(row)?;
            return Ok((Verdict { accepted: 0, next }, None));
        }
        let rows = draft.tokens.len() + 1;
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
    /// Whether a plain round (or the prefill) asks its target for bounds on its last row's
    /// logits instead of the logits ([`LogitsMode::Bounded`]): [`bounds_plain_rows`], and
    /// the round needs no full row (`full`).
    pub(super) fn bounds_plain(&self, full: bool) -> bool {
        !full && bounds_plain_rows(self.req, &self.controls)
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
                let dist = distribution(&row.logits()?, &params);
                Ok(dist.draw(self.sampler.uniform()))
            }
        }
    }
}

/// Whether `req`'s plain rounds draw from bounded rows: sampled at a temperature alone,
/// token-wise (seeded rounds draw by the inverse distribution, as their drafted rounds do),
/// with no controls and no log-probabilities.
pub(super) fn bounds_plain_rows(req: &GenerationRequest, controls: &LogitControls) -> bool {
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

//! A position's logits known through upper bounds ([`crate::LogitsMode::Bounded`]): what
//! drawing its token at a temperature needs of the head. The CPU model in `exact`
//! precision bounds all 262,144 logits from the screen's 8-bit products
//! ([`tandem_kernels::ArgmaxScreen::upper_rows`]) instead of forming them in f32, and
//! forms exactly only the ones a draw asks for ([`BoundedRow::logit`]).

use std::sync::Arc;

use tandem_kernels::UpperRow;

use super::linear::Linear;
use crate::error::{GemmaError, Result};

/// One position's logits as bounds, with what computes any one of them exactly.
#[derive(Debug, Clone)]
pub struct BoundedRow {
    /// Per id, a value never below its logit (bit for bit the logit where `exact`).
    pub upper: Vec<f32>,
    /// Whether `upper` holds the logits themselves.
    pub exact: bool,
    head: Arc<Linear>,
    hidden: Vec<f32>,
}

impl BoundedRow {
    /// `row`'s bounds of the head `head` at the final-norm output `hidden`.
    pub(crate) fn new(row: UpperRow, head: Arc<Linear>, hidden: Vec<f32>) -> Self {
        BoundedRow {
            upper: row.upper,
            exact: row.exact,
            head,
            hidden,
        }
    }

    /// The logit of `id`, bit for bit as the whole head's product gives it.
    pub fn logit(&self, id: u32) -> Result<f32> {
        Ok(self.logits_of(&[id])?[0])
    }

    /// The logits of `ids`, in order, each bit for bit as the whole head's product gives it.
    pub fn logits_of(&self, ids: &[u32]) -> Result<Vec<f32>> {
        if self.exact {
            return (ids.iter())
                .map(|&id| self.upper.get(id as usize).copied())
                .collect::<Option<Vec<f32>>>()
                .ok_or_else(|| GemmaError::Request(format!("no logits for ids {ids:?}")));
        }
        let w = self
            .head
            .lanes()
            .ok_or_else(|| GemmaError::Request("a bounded row's head has no lane layout".into()))?;
        let ids: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
        Ok(w.outputs(&self.hidden, &ids)?)
    }

    /// Every logit, as the whole head's product gives them (for a draw the bounds cannot
    /// make).
    pub fn logits(&self) -> Result<Vec<f32>> {
        match self.exact {
            true => Ok(self.upper.clone()),
            false => self.head.matmul(&self.hidden, 1),
        }
    }
}

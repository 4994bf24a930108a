//! [`Linear`]: a weight matrix of the CPU model, in the layout its precision computes
//! with. In `exact` precision a quantized matrix is repacked for the lane kernels
//! (`tandem_kernels::LaneMatrix`: one FMA chain per output, the same bits on every
//! CPU); `int8` and unquantized weights keep their ggml layout.

use tandem_kernels::{LaneMatrix, QMatrix, QType};

use super::model::Precision;
use crate::error::Result;

/// A weight matrix in ggml or lane layout.
#[derive(Debug, Clone)]
pub(crate) enum Linear {
    Ggml(QMatrix),
    Lanes(LaneMatrix),
}

impl Linear {
    /// `w` in the layout `precision` computes with.
    pub(crate) fn new(w: QMatrix, precision: Precision) -> Result<Self> {
        Ok(match (precision, w.qtype().block_size()) {
            (Precision::Exact, 2..) => Linear::Lanes(LaneMatrix::pack(&w)?),
            _ => Linear::Ggml(w),
        })
    }

    /// The lane-layout matrix, if this is one.
    pub(crate) fn lanes(&self) -> Option<&LaneMatrix> {
        match self {
            Linear::Lanes(w) => Some(w),
            Linear::Ggml(_) => None,
        }
    }

    /// The storage type.
    pub(crate) fn qtype(&self) -> QType {
        match self {
            Linear::Ggml(w) => w.qtype(),
            Linear::Lanes(w) => w.qtype(),
        }
    }

    /// Output rows.
    pub(crate) fn n(&self) -> usize {
        match self {
            Linear::Ggml(w) => w.n(),
            Linear::Lanes(w) => w.n(),
        }
    }

    /// Inputs per row.
    pub(crate) fn k(&self) -> usize {
        match self {
            Linear::Ggml(w) => w.k(),
            Linear::Lanes(w) => w.k(),
        }
    }

    /// `x · Wᵀ` for `m` rows: exact for a lane matrix and an unquantized one, with
    /// 8-bit activations for a quantized ggml one (`int8`).
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; m * self.n()];
        match self {
            Linear::Ggml(w) => w.matmul(x, m, &mut out)?,
            Linear::Lanes(w) => w.matmul(x, m, &mut out)?,
        }
        Ok(out)
    }

    /// Row `row`, dequantized.
    pub(crate) fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<()> {
        match self {
            Linear::Ggml(w) => w.dequantize_row(row, out)?,
            Linear::Lanes(w) => w.dequantize_row(row, out)?,
        }
        Ok(())
    }

    /// The whole matrix, dequantized, `n × k` row-major.
    pub(crate) fn dequantize(&self) -> Vec<f32> {
        match self {
            Linear::Ggml(w) => w.dequantize(),
            Linear::Lanes(w) => w.dequantize(),
        }
    }

    /// The given rows, in that order, in the same layout.
    pub(crate) fn select_rows(&self, rows: &[usize]) -> Result<Linear> {
        Ok(match self {
            Linear::Ggml(w) => Linear::Ggml(w.select_rows(rows)?),
            Linear::Lanes(w) => Linear::Lanes(w.select_rows(rows)?),
        })
    }
}

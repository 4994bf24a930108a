//! A sampled round's target rows served where the logits are (a GPU) instead of copied to
//! the host: at temperature alone (no top-k, no top-p) the token-wise and seeded rules need
//! of a row only a drafted token's probability and a draw, from the row or from the
//! residual after a rejection. Each row is reduced on its device to the weights
//! `e^{(x − max)/T}` in chunks of [`CHUNK`] and the chunks' sums; the host walks the 256
//! sums of a 262,144-token row to the chunk a draw lands in and copies that chunk alone
//! (4 KB against the row's megabyte). A draw is the one [`SparseDist::draw`] makes of the
//! host's distribution with the same uniform (cumulative probability in id order), up to
//! float rounding: the two differ only where the uniform lies within rounding of a boundary
//! between two tokens, so the output is distributed exactly as the target's either way.
//!
//! A plain round's single draw can also be made in the batched step that ran it
//! ([`draw_last_rows`]): the step's sampled rows reduced together and copied twice for all
//! of them, instead of each generation reducing its row and copying from its own thread,
//! where every copy waits behind the step the stepper has queued since.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use tandem_core::{SparseDist, TargetRows};

/// Tokens per chunk of a reduced row.
pub(crate) const CHUNK: usize = 1024;

/// Residual mass below which a residual counts as empty and the row itself is drawn from
/// (as the host's residual does at exactly zero): f32 probabilities rounded on two sides
/// leave up to about 1e-7 of a residual that is truly empty, and a rejection whose
/// residual is smaller than this happens less than once in a million rounds.
const EMPTY_RESIDUAL: f64 = 1e-6;

/// A plain sampled round's draw, made where its row is: the token the uniform `u` lands on
/// in the row's distribution at `temperature` alone, as [`DeviceRows`] draws it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// The row's temperature (> 0).
    pub temperature: f32,
    /// The uniform in `[0, 1)` the draw walks to.
    pub u: f64,
}

/// The rows of a `[rows, vocab]` f32 logits tensor at one temperature, each reduced when a
/// rule first reaches it. Errors of the device are kept ([`DeviceRows::finish`]); until
/// then the rule sees token 0 and probability 0.
pub(crate) struct DeviceRows<'a> {
    logits: &'a Tensor,
    scale: f64,
    current: Option<Row>,
    failed: Option<candle_core::Error>,
}

/// One reduced row.
struct Row {
    index: usize,
    vocab: usize,
    /// `[chunks, CHUNK]`, zero past the vocabulary.
    weights: Tensor,
    /// Each chunk's sum of weights.
    sums: Vec<f64>,
    total: f64,
}

impl<'a> DeviceRows<'a> {
    /// The rows of `logits` sampled at `temperature` (> 0).
    pub(crate) fn new(logits: &'a Tensor, temperature: f32) -> Self {
        Self {
            logits,
            scale: scale(temperature),
            current: None,
            failed: None,
        }
    }

    /// The first device error a rule met, if any.
    pub(crate) fn finish(self) -> candle_core::Result<()> {
        self.failed.map_or(Ok(()), Err)
    }

    fn row(&mut self, index: usize) -> candle_core::Result<&Row> {
        if self.current.as_ref().map(|r| r.index) != Some(index) {
            self.current = Some(reduce(self.logits, index, self.scale)?);
        }
        Ok(self.current.as_ref().expect("just reduced"))
    }

    fn try_prob(&mut self, row: usize, id: u32) -> candle_core::Result<f64> {
        let r = self.row(row)?;
        if id as usize >= r.vocab {
            return Ok(0.0);
        }
        let (chunk, at) = (id as usize / CHUNK, id as usize % CHUNK);
        let w = r.weights.get(chunk)?.get(at)?.to_scalar::<f32>()?;
        Ok(w as f64 / r.total)
    }

    fn try_draw(&mut self, row: usize, u: f64) -> candle_core::Result<u32> {
        let r = self.row(row)?;
        let target = u * r.total;
        r.land(chunk_at(&r.sums, target), target, |_, w| w)
    }

    fn try_draw_residual(
        &mut self,
        row: usize,
        q: &SparseDist,
        u: f64,
    ) -> candle_core::Result<u32> {
        let r = self.row(row)?;
        let listed: Vec<(u32, f64)> = (q.ids.iter().zip(&q.probs))
            .filter(|(id, _)| (**id as usize) < r.vocab)
            .map(|(id, p)| (*id, *p as f64))
            .collect();
        if listed.is_empty() {
            return self.try_draw(row, u);
        }
        let ids: Vec<u32> = listed.iter().map(|(id, _)| *id).collect();
        let wanted = Tensor::from_vec(ids, listed.len(), r.weights.device())?;
        let p_at = r
            .weights
            .flatten_all()?
            .index_select(&wanted, 0)?
            .to_vec1::<f32>()?;
        // Each chunk's residual mass: its share of p less min(p, q) over q's ids in it.
        let total = r.total;
        let mut masses: Vec<f64> = r.sums.iter().map(|s| s / total).collect();
        for ((id, q), w) in listed.iter().zip(&p_at) {
            masses[*id as usize / CHUNK] -= (*w as f64 / total).min(*q);
        }
        masses.iter_mut().for_each(|m| *m = m.max(0.0));
        let residual: f64 = masses.iter().sum();
        if residual <= EMPTY_RESIDUAL {
            return self.try_draw(row, u);
        }
        let target = u * residual;
        let at = chunk_at(&masses, target);
        let q_in: HashMap<u32, f64> = listed
            .into_iter()
            .filter(|(id, _)| *id as usize / CHUNK == at.0)
            .collect();
        r.land(at, target, |id, w| {
            (w / total - q_in.get(&id).copied().unwrap_or(0.0)).max(0.0)
        })
    }

    /// `value`, or `fallback` after keeping the first error.
    fn kept<T>(&mut self, value: candle_core::Result<T>, fallback: T) -> T {
        value.unwrap_or_else(|e| {
            self.failed.get_or_insert(e);
            fallback
        })
    }
}

impl TargetRows for DeviceRows<'_> {
    fn prob(&mut self, row: usize, id: u32) -> f64 {
        let p = self.try_prob(row, id);
        self.kept(p, 0.0)
    }

    fn draw(&mut self, row: usize, u: f64) -> u32 {
        let t = self.try_draw(row, u);
        self.kept(t, 0)
    }

    fn draw_residual(&mut self, row: usize, q: &SparseDist, u: f64) -> u32 {
        let t = self.try_draw_residual(row, q, u);
        self.kept(t, 0)
    }
}

/// Whether a sampled round with these logits and parameters is served by [`DeviceRows`]:
/// logits off the host, temperature alone.
pub(crate) fn reduces_on_device(logits: &Tensor, params: &tandem_core::SamplingParams) -> bool {
    !matches!(logits.device(), Device::Cpu) && params.temperature_alone()
}

impl Row {
    /// The token a walk to `target` lands on within `chunk` (from [`chunk_at`]: its index
    /// and the mass before it), each of the chunk's tokens weighing `mass(id, weight)`.
    fn land(
        &self,
        (chunk, before): (usize, f64),
        target: f64,
        mass: impl Fn(u32, f64) -> f64,
    ) -> candle_core::Result<u32> {
        let within = self.weights.get(chunk)?.to_vec1::<f32>()?;
        Ok(land(chunk, &within, before, target, mass))
    }
}

/// The token a walk to `target` lands on within chunk `chunk` of weights `within`, `before`
/// the mass of the chunks before it, each token weighing `mass(id, weight)`.
fn land(
    chunk: usize,
    within: &[f32],
    before: f64,
    target: f64,
    mass: impl Fn(u32, f64) -> f64,
) -> u32 {
    let first = (chunk * CHUNK) as u32;
    let masses = (within.iter().zip(first..)).map(|(w, id)| mass(id, *w as f64));
    first + walk_from(before, masses, target) as u32
}

/// The tokens `draws` land on, each in the last row of its `[rows, vocab]` f32 logits (all
/// on one device): the rows reduced together, then one copy of all their chunk sums and
/// one of the chunks the draws land in. Each is the token [`DeviceRows`] draws from that
/// row with the same uniform.
pub(crate) fn draw_last_rows(draws: &[(&Tensor, Draw)]) -> candle_core::Result<Vec<u32>> {
    if draws.is_empty() {
        return Ok(Vec::new());
    }
    let rows = (draws.iter())
        .map(|(logits, _)| logits.narrow(0, logits.dim(0)? - 1, 1))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let scales: Vec<f64> = draws.iter().map(|(_, d)| scale(d.temperature)).collect();
    let reduced = Reduced::new(&Tensor::cat(&rows, 0)?, &scales)?;
    let landings: Vec<((usize, f64), f64)> = (draws.iter().zip(&reduced.sums))
        .map(|((_, d), sums)| {
            let target = d.u * sums.iter().sum::<f64>();
            (chunk_at(sums, target), target)
        })
        .collect();
    let within = reduced.chunks(landings.iter().map(|((chunk, _), _)| *chunk))?;
    Ok((landings.iter().zip(&within))
        .map(|(((chunk, before), target), w)| land(*chunk, w, *before, *target, |_, w| w))
        .collect())
}

/// `1/T`, as a row is reduced at.
fn scale(temperature: f32) -> f64 {
    1.0 / temperature as f64
}

/// Rows of logits reduced at their scales (`1/T`): the weights `e^{(x − max)·scale}` in
/// chunks of [`CHUNK`] (zero past the vocabulary) and each chunk's sum, copied.
struct Reduced {
    /// `[rows, chunks, CHUNK]`.
    weights: Tensor,
    /// Per row, each chunk's sum.
    sums: Vec<Vec<f64>>,
}

impl Reduced {
    /// `[rows, vocab]` f32 logits `x`, row `i` at `scales[i]`.
    fn new(x: &Tensor, scales: &[f64]) -> candle_core::Result<Self> {
        let (rows, vocab) = x.dims2()?;
        let shifted = x.broadcast_sub(&x.max_keepdim(1)?)?;
        // One temperature (a generation's row, most steps) scales without a tensor of
        // scales to upload; either way each weight is `x·scale` in f32.
        let scaled = match scales {
            [one, rest @ ..] if rest.iter().all(|s| s == one) => shifted.affine(*one, 0.0)?,
            _ => {
                let scales: Vec<f32> = scales.iter().map(|s| *s as f32).collect();
                shifted.broadcast_mul(&Tensor::from_vec(scales, (rows, 1), x.device())?)?
            }
        };
        let w = scaled.exp()?;
        let chunks = vocab.div_ceil(CHUNK);
        let weights = w
            .pad_with_zeros(1, 0, chunks * CHUNK - vocab)?
            .reshape((rows, chunks, CHUNK))?;
        let sums = (weights.sum(2)?.to_vec2::<f32>()?.into_iter())
            .map(|row| row.into_iter().map(f64::from).collect())
            .collect();
        Ok(Self { weights, sums })
    }

    /// Chunk `at[i]` of each row `i`, copied.
    fn chunks(&self, at: impl Iterator<Item = usize>) -> candle_core::Result<Vec<Vec<f32>>> {
        let (rows, chunks, _) = self.weights.dims3()?;
        let ids: Vec<u32> = at
            .enumerate()
            .map(|(row, chunk)| (row * chunks + chunk) as u32)
            .collect();
        let ids = Tensor::from_vec(ids, rows, self.weights.device())?;
        (self.weights.reshape((rows * chunks, CHUNK))?)
            .index_select(&ids, 0)?
            .to_vec2::<f32>()
    }
}

/// The chunk a walk to `target` over the chunks' masses falls in, and the mass before it.
fn chunk_at(chunks: &[f64], target: f64) -> (usize, f64) {
    let chunk = walk(chunks.iter().copied(), target);
    (chunk, chunks[..chunk].iter().sum())
}

/// Row `index` of `logits` reduced at `scale` = 1/T.
fn reduce(logits: &Tensor, index: usize, scale: f64) -> candle_core::Result<Row> {
    let Reduced { weights, mut sums } = Reduced::new(&logits.narrow(0, index, 1)?, &[scale])?;
    let sums = sums.pop().expect("one row");
    Ok(Row {
        index,
        vocab: logits.dim(1)?,
        weights: weights.get(0)?,
        total: sums.iter().sum(),
        sums,
    })
}

/// Where a walk over masses stops: the index whose cumulative mass first passes `target`,
/// or (when rounding leaves the target past the total) the last one with mass.
fn walk(masses: impl Iterator<Item = f64>, target: f64) -> usize {
    walk_from(0.0, masses, target)
}

/// [`walk`] with `start` already accumulated before the first mass.
fn walk_from(start: f64, masses: impl Iterator<Item = f64>, target: f64) -> usize {
    let (mut acc, mut last) = (start, 0);
    for (i, m) in masses.enumerate() {
        acc += m;
        if target < acc {
            return i;
        }
        if m > 0.0 {
            last = i;
        }
    }
    last
}

#[cfg(test)]
#[path = "device_rows_tests.rs"]
mod tests;

//! A sampled block's Markov pass on the device (DSpark, arXiv 2607.05147, Alg. 1): at a
//! temperature alone (no top-k, no top-p), each position's draft distribution without its
//! tail ([`tandem_core::SparseDist::without_tail`]) and its draw are made where the logits
//! are, and only the kept ids and their probabilities come back, in one buffer for the
//! block. Drawing each position on the host took a round trip a position with its 32,768
//! logits and a host softmax (1.8 ms a sampled block on an H100 against 0.4 ms greedy).
//!
//! A draw walks the distribution as [`tandem_core::SparseDist::draw`] does, with the
//! host's uniform, and takes a token only where it has mass, so the drawn token is always
//! one the returned distribution holds; the same uniform draws the host's token up to float
//! rounding at the boundary between two tokens. On a CUDA GPU a position is one launch of
//! [`tandem_gemma::draw_row`]; elsewhere (the tests, on candle's CPU backend) the running
//! sums of [`CHUNK`]-token chunks find the chunk and the running sums within it the token
//! (each a product with a triangular matrix of ones).

use candle_core::{DType, Device, Tensor};
use tandem_core::sampling::PROPOSAL_TAIL;
use tandem_gemma::{draw_row, DrawOut, Replayed};

use crate::error::Result;

/// Draft-vocabulary positions per chunk of a draw's walk.
pub(super) const CHUNK: usize = 256;

/// What the walk reads: fixed tensors, made once per drafter (a captured step reads them
/// at their addresses).
pub(super) struct SampleChain {
    /// Draft vocabulary size.
    vd: usize,
    /// Chunks of the padded vocabulary.
    chunks: usize,
    /// `[chunks, chunks]` and `[CHUNK, CHUNK]` upper triangles of ones: a row times one is
    /// the row's running sums.
    tri_chunks: Tensor,
    tri_chunk: Tensor,
    /// `[1, chunks]` and `[1, CHUNK]` positions, as f32.
    at_chunks: Tensor,
    at_chunk: Tensor,
    /// The smallest probability a proposal keeps, and as `[1, 1]`; `[1, 1]` zero.
    floor: f32,
    floor_t: Tensor,
    zero: Tensor,
}

/// A block step's sampled pass: its inputs and outputs, and its replay.
pub(crate) struct SampledStep {
    pub(super) io: SampledIo,
    pub(super) replay: Replayed,
}

impl SampledStep {
    /// A pass over `gamma` positions of a draft vocabulary of `vd`.
    pub(super) fn new(gamma: usize, vd: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            io: SampledIo::new(gamma, vd, device)?,
            replay: Replayed::default(),
        })
    }
}

/// A sampled pass's inputs and outputs (fixed addresses, as a graph captures them).
pub(super) struct SampledIo {
    /// `[γ]` f32 uniforms, one a position.
    pub(super) uniforms: Tensor,
    /// `[1, 1]` f32: one over the temperature.
    pub(super) inv_t: Tensor,
    /// `[γ]` u32 drawn draft indices.
    pub(super) picks: Tensor,
    /// `[γ Vd]` u32 and f32: each position's kept draft indices (ascending) and their
    /// probabilities, position after position.
    pub(super) ids: Tensor,
    pub(super) probs: Tensor,
    /// `[γ + 1]` u32: where each position's entries start, and past the last (`ends[0]`
    /// stays 0).
    pub(super) ends: Tensor,
}

impl SampledIo {
    fn new(gamma: usize, vd: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            uniforms: Tensor::zeros(gamma, DType::F32, device)?,
            inv_t: Tensor::ones((1, 1), DType::F32, device)?,
            picks: Tensor::zeros(gamma, DType::U32, device)?,
            ids: Tensor::zeros(gamma * vd, DType::U32, device)?,
            probs: Tensor::zeros(gamma * vd, DType::F32, device)?,
            ends: Tensor::zeros(gamma + 1, DType::U32, device)?,
        })
    }
}

impl SampleChain {
    /// The walk over a draft vocabulary of `vd` on `device`.
    pub(super) fn new(vd: usize, device: &Device) -> Result<Self> {
        let chunks = vd.div_ceil(CHUNK);
        let tri = |n: usize| -> Result<Tensor> {
            let ones: Vec<f32> = (0..n * n)
                .map(|i| f32::from(u8::from(i / n <= i % n)))
                .collect();
            Ok(Tensor::from_vec(ones, (n, n), device)?)
        };
        let at = |n: usize| -> Result<Tensor> {
            Ok(Tensor::arange(0u32, n as u32, device)?
                .to_dtype(DType::F32)?
                .reshape((1, n))?)
        };
        let scalar = |x: f32| Tensor::from_vec(vec![x], (1, 1), device);
        let floor = PROPOSAL_TAIL / vd.max(1) as f32;
        Ok(Self {
            vd,
            chunks,
            tri_chunks: tri(chunks)?,
            tri_chunk: tri(CHUNK)?,
            at_chunks: at(chunks)?,
            at_chunk: at(CHUNK)?,
            floor,
            floor_t: scalar(floor)?,
            zero: scalar(0.0)?,
        })
    }

    /// Position `k` of a sampled pass: the proposal of `logits` (`[Vd]`), its kept ids and
    /// probabilities after position `k - 1`'s in `pass`, and its draw with uniform `k` into
    /// `pass.picks[k]`. One launch of [`draw_row`] on a CUDA GPU; elsewhere the composition
    /// of candle's ops below, kept on the host.
    pub(super) fn position(&self, logits: &Tensor, pass: &SampledIo, k: usize) -> Result<()> {
        let u = pass.uniforms.narrow(0, k, 1)?;
        let pick = pass.picks.narrow(0, k, 1)?;
        if logits.device().is_cuda() {
            let out = DrawOut {
                ids: &pass.ids,
                probs: &pass.probs,
                ends: &pass.ends,
                at: k,
                pick: &pick,
            };
            return Ok(draw_row(
                &logits.contiguous()?,
                (&pass.inv_t, &u),
                self.floor,
                out,
            )?);
        }
        let q = self.proposal(&logits.unsqueeze(0)?, &pass.inv_t)?;
        pick.slice_set(&self.draw(&q, &u.unsqueeze(0)?)?, 0, 0)?;
        let q = q.flatten_all()?.to_vec1::<f32>()?;
        let (ids, probs): (Vec<u32>, Vec<f32>) = (0u32..).zip(q).filter(|(_, p)| *p > 0.0).unzip();
        let start = pass.ends.get(k)?.to_scalar::<u32>()? as usize;
        let end = start + ids.len();
        let dev = logits.device();
        pass.ids.slice_set(&Tensor::new(ids, dev)?, 0, start)?;
        pass.probs.slice_set(&Tensor::new(probs, dev)?, 0, start)?;
        pass.ends
            .slice_set(&Tensor::new(&[end as u32], dev)?, 0, k + 1)?;
        Ok(())
    }

    /// The proposal of `logits` (`[1, Vd]`) at one over the temperature `inv_t`
    /// (`[1, 1]`): the softmax without the ids below the tail's floor, renormalised.
    fn proposal(&self, logits: &Tensor, inv_t: &Tensor) -> Result<Tensor> {
        let z = logits.broadcast_mul(inv_t)?;
        let w = z.broadcast_sub(&z.max_keepdim(1)?)?.exp()?;
        let p = w.broadcast_div(&w.sum_keepdim(1)?)?;
        let kept = (p.broadcast_ge(&self.floor_t)?.to_dtype(DType::F32)? * p)?;
        Ok(kept.broadcast_div(&kept.sum_keepdim(1)?)?)
    }

    /// The draft index (`[1]` u32) the uniform `u` (`[1, 1]`) draws from `q` (`[1, Vd]`).
    fn draw(&self, q: &Tensor, u: &Tensor) -> Result<Tensor> {
        let padded = q
            .pad_with_zeros(1, 0, self.chunks * CHUNK - self.vd)?
            .reshape((self.chunks, CHUNK))?;
        let sums = padded.sum_keepdim(1)?.t()?.contiguous()?;
        let running = sums.matmul(&self.tri_chunks)?;
        let chunk = self.first_past(&running, &sums, u, &self.at_chunks)?;
        let index = chunk.flatten_all()?.to_dtype(DType::U32)?;
        let before = (running.index_select(&index, 1)? - sums.index_select(&index, 1)?)?;
        let row = padded.index_select(&index, 0)?;
        let within = row.matmul(&self.tri_chunk)?;
        let at = self.first_past(&within, &row, &(u - before)?, &self.at_chunk)?;
        let pick = (chunk.affine(CHUNK as f64, 0.0)? + at)?;
        Ok(pick.flatten_all()?.to_dtype(DType::U32)?)
    }

    /// `[1, 1]`: the first of the positions `at` whose `running` sum passes `target` among
    /// those with `mass`, or the last with mass where none does (`SparseDist::draw`'s
    /// rule). The first such position is never past the last with mass, and a position
    /// that does not qualify is pushed past every position, so the smaller of the two is
    /// the answer either way.
    fn first_past(
        &self,
        running: &Tensor,
        mass: &Tensor,
        target: &Tensor,
        at: &Tensor,
    ) -> Result<Tensor> {
        let n = at.dim(1)? as f64;
        let held = mass.broadcast_gt(&self.zero)?.to_dtype(DType::F32)?;
        let past = (running.broadcast_gt(target)?.to_dtype(DType::F32)? * &held)?;
        let first = (at + past.affine(-n, n)?)?.min_keepdim(1)?;
        let last = (at.affine(1.0, 1.0)? * held)?
            .max_keepdim(1)?
            .affine(1.0, -1.0)?;
        Ok(first.minimum(&last)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::{distribution, SamplingParams};

    /// On the CPU backend the walk draws what the host's draw does with the same uniform,
    /// over a vocabulary of several chunks (one part-filled), and the proposal is the
    /// host's distribution without its tail.
    #[test]
    fn the_walk_draws_the_hosts_tokens() -> Result<()> {
        let vd = 3 * CHUNK + 17;
        let logits: Vec<f32> = (0..vd)
            .map(|i| ((i * 7919 % 1013) as f32 / 97.0).sin() * 6.0)
            .collect();
        let params = SamplingParams {
            temperature: 0.7,
            ..SamplingParams::default()
        };
        let host = distribution(&logits, &params).without_tail(vd);
        let chain = SampleChain::new(vd, &Device::Cpu)?;
        let inv_t = Tensor::from_vec(vec![1.0 / 0.7f32], (1, 1), &Device::Cpu)?;
        let q = chain.proposal(&Tensor::from_vec(logits, (1, vd), &Device::Cpu)?, &inv_t)?;
        let dense = q.flatten_all()?.to_vec1::<f32>()?;
        let ids: Vec<u32> = (0..vd as u32)
            .filter(|i| dense[*i as usize] > 0.0)
            .collect();
        assert_eq!(ids, host.ids);
        for (id, p) in host.ids.iter().zip(&host.probs) {
            assert!((dense[*id as usize] - p).abs() < 1e-6);
        }
        for k in 0..200 {
            let u = (k as f64 + 0.5) / 200.0;
            let drawn = chain.draw(&q, &Tensor::from_vec(vec![u as f32], (1, 1), &Device::Cpu)?)?;
            assert_eq!(drawn.to_vec1::<u32>()?, vec![host.draw(u)], "u = {u}");
        }
        let last = chain.draw(&q, &Tensor::from_vec(vec![1.0f32], (1, 1), &Device::Cpu)?)?;
        assert_eq!(last.to_vec1::<u32>()?, vec![*host.ids.last().expect("ids")]);
        Ok(())
    }
}

//! Warming an engine up before traffic. A target on a GPU captures each block shape of a
//! sequence as a CUDA graph the first time it runs, and a device drafter its steps: on an
//! H100 the first drafted round of a process took 106 ms and its verify 52 ms, against 0.7
//! and 1.4 ms after, and new shapes met later cost 8 to 18 ms once each. [`Engine::warm_up`]
//! pays those before the first request: a user's first tokens do not wait for captures,
//! and adaptive generations do not learn from them. A batched device target also captures
//! its shared steps for every batch size then.

use std::time::{Duration, Instant};

use tandem_core::SnapshotSpec;
use tandem_gemma::LogitsMode;

use crate::engine::Engine;
use crate::error::Result;

/// Positions of a warm-up sequence (its blocks run at the first positions).
const WARM_UP_POSITIONS: usize = 64;

impl Engine {
    /// Where the target captures steps on first use, runs one sequence through a decode
    /// step without a snapshot and, for `drafting` (a proposer's snapshot spec and largest
    /// γ), through blocks of 1 to γ + 1 tokens with that snapshot. Returns how long it took,
    /// or `None` where the target needs no warm-up.
    pub fn warm_up(&self, drafting: Option<(&SnapshotSpec, usize)>) -> Result<Option<Duration>> {
        if !self.model().captures_steps() {
            return Ok(None);
        }
        let started = Instant::now();
        let plain = (&SnapshotSpec::default(), 0);
        for (spec, gamma) in std::iter::once(plain).chain(drafting) {
            let mut seq = self.model().start(WARM_UP_POSITIONS);
            for rows in 1..=gamma + 1 {
                seq.forward(&vec![0; rows], 0, LogitsMode::Top(1), spec)?;
                seq.truncate(0)?;
            }
            drop(seq);
            let shapes = self.model().warm_batches(spec, gamma + 1)?;
            tracing::debug!(shapes, gamma, "batched steps warmed up");
        }
        Ok(Some(started.elapsed()))
    }
}

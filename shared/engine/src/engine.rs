//! The generation loop (Leviathan et al. 2023; Chen et al. 2023; the round of
//! docs/architecture.md). Plain decoding is the same loop with empty drafts: every round runs the
//! anchor (the last token the target chose, not yet run) plus the drafted block through one
//! target forward, keeps the accepted prefix and one token chosen by the target, rolls the KV
//! cache back past the rejected tail and hands the proposer the snapshot rows of exactly the
//! newly committed positions. Request handling (sampling, stopping, streaming) is shared, so
//! greedy speculative output is token-for-token the plain output.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use tandem_core::{
    cut::cut_length, Chunk, DraftBlock, FinishReason, GammaPolicy, GammaPolicyConfig, History,
    LogitControls, Observed, Output, Proposer, Sampler, SamplingParams, SnapshotSpec, TokenLogprob,
};
use tandem_gemma::LogitsMode;
use tandem_tokenizer::{GemmaTokenizer, StreamDecoder};

use crate::drafting::{Adaptive, Drafting};
use crate::error::{EngineError, Result};
use crate::memory::PolicyMemory;
use crate::models::{Target, TargetFacts, TargetSequence, TargetStep};
use crate::plan::Plan;
use crate::request::GenerationRequest;
use crate::schedule::{DraftScheduler, Seat};
use crate::stats::{RoundStats, SpecStats, Timing};

#[path = "engine_verify.rs"]
mod verify;

/// What the caller's sink receives after the first token and after every round.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// New tokens and text.
    pub chunk: Chunk,
    /// The round that produced them (`None` for the first token and a closing chunk).
    pub round: Option<RoundStats>,
    /// One per token of the chunk when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
}

/// The end of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Why it ended.
    pub finish: FinishReason,
    /// Every generated token.
    pub tokens: Vec<u32>,
    /// The generated text (cut at a stop string).
    pub text: String,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Speculation figures.
    pub spec: SpecStats,
    /// Wall-clock figures.
    pub timing: Timing,
}

/// Receives each [`Update`]; `Break` cancels the generation.
pub type Sink<'s> = dyn FnMut(&Update) -> ControlFlow<()> + 's;

/// A target model with its tokenizer, shared by all generations.
#[derive(Clone)]
pub struct Engine {
    model: Arc<dyn Target>,
    tokenizer: Arc<GemmaTokenizer>,
    memory: Arc<PolicyMemory>,
    context_limit: Option<usize>,
    scheduler: Option<Arc<DraftScheduler>>,
}

impl Engine {
    /// An engine over a loaded target (Gemma 3 or Gemma 4) and its tokenizer. Its clones
    /// share what adaptive generations learn about drafting and, where the target batches
    /// generations, the draft scheduler of the batch.
    pub fn new(model: Arc<dyn Target>, tokenizer: Arc<GemmaTokenizer>) -> Self {
        let scheduler = model.step_costs().map(|c| Arc::new(DraftScheduler::new(c)));
        if let Some(s) = &scheduler {
            model.observe_steps(s.clone());
        }
        Self {
            model,
            tokenizer,
            memory: Arc::default(),
            context_limit: None,
            scheduler,
        }
    }

    /// The engine with requests limited to `limit` positions (prompt and new tokens),
    /// below the target's own context when smaller: an operator's cap on what one request
    /// may hold.
    pub fn with_context_limit(mut self, limit: usize) -> Self {
        self.context_limit = Some(limit);
        self
    }

    /// The target's sizes as this engine plans with them (its context within the limit).
    pub fn facts(&self) -> TargetFacts {
        let mut facts = self.model.facts();
        if let Some(limit) = self.context_limit {
            facts.max_context = facts.max_context.min(limit);
        }
        facts
    }

    /// The target.
    pub fn model(&self) -> &Arc<dyn Target> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<GemmaTokenizer> {
        &self.tokenizer
    }

    /// Checks `req` against the target and plans it for a proposer drafting at most
    /// `max_gamma` tokens a round (0: plain decoding).
    pub fn plan(&self, req: GenerationRequest, max_gamma: usize) -> Result<Plan> {
        Plan::new(req, &self.facts(), max_gamma)
    }

    /// Plans `req` for `proposer` and runs it ([`Self::plan`], then [`Self::run`]).
    pub fn generate(
        &self,
        req: &GenerationRequest,
        proposer: Option<&dyn Proposer>,
        sink: &mut Sink<'_>,
    ) -> Result<Outcome> {
        let plan = self.plan(req.clone(), proposer.map_or(0, Proposer::max_gamma))?;
        self.run(&plan, proposer, sink)
    }

    /// Runs one planned generation, speculatively when `proposer` is given and the plan
    /// drafts.
    pub fn run(
        &self,
        plan: &Plan,
        proposer: Option<&dyn Proposer>,
        sink: &mut Sink<'_>,
    ) -> Result<Outcome> {
        let mut run = Generation::start(self, plan, proposer)?;
        run.run(sink)?;
        if let Some(policy) = &run.policy {
            self.memory.record(&plan.request().sampling, policy);
        }
        Ok(run.outcome())
    }

    /// The draft-length policy an adaptive generation sampled with `sampling` and drafting
    /// at most `max_gamma` tokens starts from: what earlier generations of this engine (and
    /// its clones) sampled the same way learnt, or the priors.
    pub fn starting_policy(
        &self,
        sampling: &SamplingParams,
        max_gamma: usize,
    ) -> Result<GammaPolicy> {
        self.memory
            .policy(GammaPolicyConfig::new(max_gamma), sampling)
            .map_err(EngineError::InvalidRequest)
    }
}

/// The state of one running generation.
struct Generation<'e> {
    req: &'e GenerationRequest,
    cache: Box<dyn TargetSequence + 'e>,
    vocab: usize,
    sampler: Sampler,
    controls: LogitControls,
    history: History,
    logprobs: Logprobs,
    output: Output,
    stream: StreamDecoder<'e>,
    drafting: Option<Drafting>,
    gamma: usize,
    policy: Option<GammaPolicy>,
    /// Its place in the batch, where the target batches generations.
    seat: Option<Seat<'e>>,
    stats: SpecStats,
    timing: Timing,
    started: Instant,
}

impl<'e> Generation<'e> {
    fn start(engine: &'e Engine, plan: &'e Plan, proposer: Option<&dyn Proposer>) -> Result<Self> {
        let started = Instant::now();
        let (req, gamma) = (plan.request(), plan.gamma());
        let mut stats = SpecStats::default();
        let seat = engine.scheduler.as_deref().map(DraftScheduler::seat);
        let policy = match req.adaptive_gamma && proposer.is_some() && gamma > 0 {
            true => Some(engine.starting_policy(&req.sampling, gamma)?),
            false => None,
        };
        let controls = req.controls(engine.tokenizer.stop_ids());
        let shed = seat
            .as_ref()
            .zip(policy.as_ref())
            .is_some_and(|(s, p)| s.sheds(p));
        stats.shed = u64::from(shed);
        let drafting = match proposer {
            Some(p) if gamma > 0 && !shed => Drafting::open(
                p,
                engine.model.as_ref(),
                &req.sampling,
                req.lookup,
                &mut stats,
            ),
            _ => None,
        };
        let policy = policy.filter(|_| drafting.is_some());
        let facts = engine.facts();
        Ok(Self {
            req,
            cache: engine.model.start(plan.cache_positions()),
            vocab: facts.vocab_size,
            sampler: Sampler::new(req.sampling)?,
            controls,
            history: History::new(&req.prompt),
            logprobs: Logprobs::default(),
            output: Output::new(req.stop_config(engine.tokenizer.stop_ids())),
            stream: engine.tokenizer.stream(),
            drafting,
            gamma,
            policy,
            seat,
            stats,
            timing: Timing::default(),
            started,
        })
    }

    fn run(&mut self, sink: &mut Sink<'_>) -> Result<()> {
        let mut anchor = self.prefill()?;
        self.timing.ttft_s = self.started.elapsed().as_secs_f64();
        let decode_start = Instant::now();
        self.emit(&[anchor], None, sink)?;
        while self.output.finished().is_none() {
            if self.cache.len() >= self.cache.max_len() {
                self.close(FinishReason::Length, sink)?;
                break;
            }
            let (emitted, round) = self.round(anchor)?;
            anchor = *emitted.last().unwrap_or(&anchor);
            self.emit(&emitted, Some(round), sink)?;
        }
        self.timing.decode_s = decode_start.elapsed().as_secs_f64();
        Ok(())
    }

    /// This round's γ before the room left caps it: the batch scheduler's for an adaptive
    /// generation that shares steps with others, its own policy's for one alone, the
    /// request's otherwise (declared to the scheduler with the tokens its rounds emit).
    fn choose_gamma(&self) -> usize {
        let Some(policy) = &self.policy else {
            if let Some(seat) = &self.seat {
                let gamma = if self.drafting.is_some() {
                    self.gamma
                } else {
                    0
                };
                let expected = self.stats.mean_acceptance_length().unwrap_or(1.0);
                seat.fixed(gamma, expected);
            }
            return self.gamma;
        };
        let Some(seat) = &self.seat else {
            return policy.choose();
        };
        match seat.schedule(seat.drafts(policy)) {
            Some((0, sessions)) if policy.probe_due(sessions) => {
                usize::from(seat.probe_pays(policy))
            }
            Some((gamma, _)) => gamma,
            None => policy.choose(),
        }
    }

    /// The proposer's block after `anchor` at `n`, as long as the policy or the batch's
    /// scheduler chooses within `room` (none for a plain round).
    fn propose(
        &mut self,
        anchor: u32,
        n: usize,
        room: usize,
    ) -> std::result::Result<DraftBlock, tandem_core::ProposeError> {
        let gamma = self.choose_gamma().min(room);
        match (&mut self.drafting, gamma) {
            (Some(d), 1..) => {
                // Steps shared with other generations wait for a draft expected within
                // their wait for late forwards, and go on without this one otherwise.
                let expected = (self.policy.as_ref().zip(self.seat.as_ref()))
                    .map(|(policy, seat)| seat.draft_seconds(policy));
                self.cache.step_aside(expected);
                d.propose(anchor, n, gamma, self.vocab)
            }
            _ => Ok(DraftBlock::default()),
        }
    }

    /// Runs `tokens` at `pos`, with the snapshot rows the proposer (if any) consumes.
    fn forward(&mut self, tokens: &[u32], pos: usize, logits: LogitsMode) -> Result<TargetStep> {
        let none = SnapshotSpec::default();
        let spec = self.drafting.as_ref().map_or(&none, |d| d.spec());
        self.cache.forward(tokens, pos, logits, spec)
    }

    /// Runs the prompt and chooses the first token.
    fn prefill(&mut self) -> Result<u32> {
        let t0 = Instant::now();
        let full = self.req.logprobs.is_some() || self.controls.needs_all_logits(0);
        let mode = match self.bounds(full) {
            true => LogitsMode::Bounded,
            false => LogitsMode::Last,
        };
        let out = self.forward(&self.req.prompt, 0, mode)?;
        self.timing.prefill_s = t0.elapsed().as_secs_f64();
        let req = self.req;
        self.send_rows(&out, 0, &req.prompt)?;
        // The prompt's rows go now, outside every round's timing: in the first round's
        // drafting time they would make a long prompt look like an expensive drafter. In
        // a shared batch they wait for the first draft the scheduler allows: under load
        // it may allow none, and a drafter on the target's cores would take its share
        // of them to read a context never drafted from.
        if self.seat.is_none() {
            if let Some(Err(e)) = self.drafting.as_mut().map(Drafting::flush) {
                self.drop_drafting(&e);
            }
        }
        let (verdict, _) = self.verify(&out, &DraftBlock::default())?;
        Ok(verdict.next)
    }

    /// One round after `anchor`; returns the emitted tokens and the round's figures.
    fn round(&mut self, anchor: u32) -> Result<(Vec<u32>, RoundStats)> {
        let n = self.cache.len();
        let room = (self.cache.max_len() - n - 1).min(self.output.remaining() - 1);
        let t0 = Instant::now();
        let cap = self.gamma.min(room);
        // An adaptive generation sizes its lookup with the batch's drafts or its own costs.
        let adaptive = self.policy.as_ref().map(|p| Adaptive {
            seat: self.seat.as_ref(),
            verify_slope: p.verify_slope(),
            row_s: p.row_seconds(),
        });
        let looked_up = (self.drafting.as_mut()).and_then(|d| d.look_up(anchor, cap, adaptive));
        let engine_lookup = looked_up.is_some();
        let mut draft = match looked_up {
            Some(block) => Ok(block),
            None => self.propose(anchor, n, room),
        }
        .unwrap_or_else(|e| {
            self.drop_drafting(&e);
            DraftBlock::default()
        });
        let draft_s = t0.elapsed().as_secs_f64();
        let cut = match engine_lookup {
            true => Vec::new(),
            false => self.cut(&mut draft),
        };
        let mut block = vec![anchor];
        block.extend_from_slice(&draft.tokens);
        let t1 = Instant::now();
        let sampling = &self.req.sampling;
        let full =
            self.req.logprobs.is_some() || self.controls.needs_all_logits(self.history.generated());
        let mode = match (full, sampling.is_greedy(), sampling.top_k) {
            _ if draft.tokens.is_empty() && self.bounds(full) => LogitsMode::Bounded,
            _ if self.bounds(full) => LogitsMode::BoundedAll,
            (true, ..) => LogitsMode::All,
            (false, true, _) => LogitsMode::Top(1),
            (false, false, Some(k)) => LogitsMode::Top(k),
            (false, false, None) => LogitsMode::All,
        };
        let out = self.forward_round(&block, n, mode, full)?;
        let t_verdict = Instant::now();
        let (verdict, expected) = self.verify(&out, &draft)?;
        if let Some(p) = self.policy.as_mut() {
            p.verify_work(t_verdict.elapsed().as_secs_f64(), block.len());
        }
        self.cache.truncate(n + verdict.accepted + 1)?;
        let verify_s = t1.elapsed().as_secs_f64();
        if let Some(d) = self.drafting.as_mut().filter(|_| engine_lookup) {
            d.looked_up(draft.tokens.len(), verdict.accepted);
        }
        let t2 = Instant::now();
        self.send_rows(&out, n, &block[..verdict.accepted + 1])?;
        let round = RoundStats {
            drafted: draft.tokens.len(),
            cut: cut.len(),
            confidences: draft.confidences.clone(),
            calibrated: draft.calibrated,
            source: draft.source,
            expected: expected.filter(|_| !draft.tokens.is_empty()),
            accepted: verdict.accepted,
            draft_s: draft_s + t2.elapsed().as_secs_f64(),
            verify_s,
        };
        self.stats.record(&round);
        tracing::trace!(
            position = n,
            drafted = round.drafted,
            cut = round.cut,
            accepted = round.accepted,
            lookup = engine_lookup,
            draft_s = round.draft_s,
            verify_s = round.verify_s,
            "round"
        );
        // The policy models the proposer's drafts: rounds it did not draft are not its own.
        if let Some(p) = self.policy.as_mut().filter(|_| !engine_lookup) {
            p.observe(&Observed {
                verified: round.drafted,
                accepted: round.accepted,
                cut: &cut,
                draft_s: round.draft_s,
                verify_s: round.verify_s,
            });
        }
        Ok((verdict.emitted(&draft.tokens), round))
    }

    /// Cuts `draft` where its calibrated confidences stop paying for the verify rows they
    /// cost ([`cut_length`], with the costs the generation's adaptive policy measured);
    /// only adaptive generations that allow it cut, and only calibrated blocks. Returns
    /// the confidences of the tokens cut.
    fn cut(&self, draft: &mut DraftBlock) -> Vec<f32> {
        let allowed = self.req.confidence_cuts && draft.calibrated;
        let Some(policy) = self.policy.as_ref().filter(|_| allowed) else {
            return Vec::new();
        };
        let fixed = 1.0 + policy.draft_cost();
        let keep = cut_length(&draft.confidences, fixed, policy.verify_slope());
        draft.cut(keep)
    }

    /// Queues for the proposer the snapshot rows of the newly committed `tokens` at `pos..`
    /// (sent before its next draft).
    fn send_rows(&mut self, out: &TargetStep, pos: usize, tokens: &[u32]) -> Result<()> {
        match &mut self.drafting {
            Some(d) => d.extend(&out.snapshot, pos, tokens),
            None => Ok(()),
        }
    }

    fn drop_drafting(&mut self, e: &tandem_core::ProposeError) {
        tracing::warn!("speculation off for this generation: {e}");
        self.stats.proposer_failures += 1;
        self.drafting = None;
    }

    /// Streams `tokens` through the stop conditions to the sink.
    fn emit(
        &mut self,
        tokens: &[u32],
        round: Option<RoundStats>,
        sink: &mut Sink<'_>,
    ) -> Result<()> {
        let mut fresh = std::mem::take(&mut self.logprobs.fresh).into_iter();
        for t in tokens {
            self.history.push(*t);
            self.logprobs.chunk.extend(fresh.next());
            let text = self.stream.push(*t)?;
            if self.output.push(*t, text.as_deref()).is_some() {
                let tail = self.stream.finish()?;
                self.output.finish(FinishReason::Length, tail.as_deref());
                break;
            }
        }
        self.deliver(round, sink);
        Ok(())
    }

    /// Ends the generation with `reason` and sends the last chunk.
    fn close(&mut self, reason: FinishReason, sink: &mut Sink<'_>) -> Result<()> {
        let tail = self.stream.finish()?;
        self.output.finish(reason, tail.as_deref());
        self.deliver(None, sink);
        Ok(())
    }

    fn deliver(&mut self, round: Option<RoundStats>, sink: &mut Sink<'_>) {
        let update = Update {
            chunk: self.output.take_chunk(),
            round,
            logprobs: std::mem::take(&mut self.logprobs.chunk),
        };
        if sink(&update).is_break() {
            self.output.finish(FinishReason::Cancelled, None);
        }
    }

    fn outcome(self) -> Outcome {
        Outcome {
            finish: self.output.finished().unwrap_or(FinishReason::Error),
            tokens: self.output.tokens().to_vec(),
            text: self.output.text().to_string(),
            prompt_tokens: self.req.prompt.len(),
            spec: self.stats,
            timing: self.timing,
        }
    }
}

/// Log-probabilities on their way to the client: those of the tokens the last verification
/// kept, then those of the tokens emitted since the last chunk.
#[derive(Default)]
struct Logprobs {
    fresh: Vec<TokenLogprob>,
    chunk: Vec<TokenLogprob>,
}

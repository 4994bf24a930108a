//! `tandem generate`: one generation streamed to stdout, plain or speculative (in process,
//! with a DSpark drafter), through the engine's shared request handling.

use crate::controls::ControlArgs;
use std::io::Write;
use std::ops::ControlFlow;

use anyhow::Result;
use clap::Args;
use tandem_core::{FinishReason, Proposer, SamplingParams, Verification};
use tandem_engine::{Engine, GenerationRequest, Outcome, Update};

use crate::client::{self, RemoteRequest};
use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;

/// Flags of `tandem generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Prompt text (a <bos> is prepended).
    #[arg(long)]
    prompt: String,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the k most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when this text appears (repeatable); the text ends before it.
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Decode speculatively in process with a DSpark drafter, then decode the same request
    /// plainly and print both speeds.
    #[arg(long)]
    speculative: bool,
    /// Tokens drafted per round (speculative only).
    #[arg(long, default_value_t = 8)]
    gamma: usize,
    /// Let each round choose its draft length up to --gamma (in process, speculative only).
    #[arg(long)]
    adaptive_gamma: bool,
    /// How sampled rounds verify drafts: `block` (the default in process) or `token`; with
    /// --server, unset leaves it to the server.
    #[arg(long)]
    verification: Option<Verification>,
    /// Verify whole blocks even where calibrated confidences say a tail does not pay
    /// (cuts apply only with an adaptive γ and a calibrated drafter).
    #[arg(long)]
    no_confidence_cuts: bool,
    /// Send the request to a verifier (e.g. http://127.0.0.1:50051) instead of running the
    /// model here; speculation then follows --speculative.
    #[arg(long)]
    server: Option<String>,
    #[command(flatten)]
    controls: ControlArgs,
    #[command(flatten)]
    access: client::ServerAccess,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

impl GenerateArgs {
    fn request(&self, engine: &Engine) -> Result<GenerationRequest> {
        if self.max_tokens == 0 {
            anyhow::bail!("--max-tokens must be at least 1");
        }
        let mut req = GenerationRequest {
            prompt: engine.tokenizer().encode(&self.prompt, true)?,
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
            },
            stop_strings: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            gamma: if self.speculative { self.gamma } else { 0 },
            adaptive_gamma: self.adaptive_gamma,
            verification: self.verification.unwrap_or_default(),
            confidence_cuts: !self.no_confidence_cuts,
            lookup: !self.drafter.no_lookup,
            ..GenerationRequest::default()
        };
        self.controls.apply(&mut req);
        if self.speculative && self.gamma == 0 {
            anyhow::bail!("--gamma must be at least 1");
        }
        req.validate()?;
        Ok(req)
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if let Some(url) = &args.server {
        return run_remote(url, &args);
    }
    let engine = args.models.load_engine()?;
    let req = args.request(&engine)?;
    if !args.speculative {
        let out = stream(&engine, &req, None)?;
        eprintln!("\n[{}]", summary(&out));
        return Ok(());
    }
    let proposer = args
        .drafter
        .load_any(&args.models, engine.model().head())?
        .proposer;
    if args.drafter.drafter == "random" {
        eprintln!("[drafter: randomly initialised; expect almost no accepted tokens]");
    }
    let spec = stream(&engine, &req, Some(proposer.as_ref()))?;
    let plain_req = GenerationRequest {
        gamma: 0,
        ..req.clone()
    };
    let plain = engine.generate(
        &plain_req,
        None,
        &mut |_: &Update| ControlFlow::Continue(()),
    )?;
    eprintln!("\n[{}]", summary(&spec));
    eprintln!("[{}]", compare(&spec, &plain, &plain_req));
    Ok(())
}

/// The speculative figures beside the plain ones.
fn compare(spec: &Outcome, plain: &Outcome, req: &GenerationRequest) -> String {
    let s = &spec.spec;
    let greedy = req.sampling.is_greedy();
    let total = (s.draft_s + s.verify_s).max(1e-9);
    let same = match (greedy, spec.tokens == plain.tokens) {
        (true, true) => "identical to plain (greedy)",
        (true, false) => "DIFFERENT from plain (greedy): please report this",
        (false, _) => "sampled: same distribution as plain, different draws",
    };
    format!(
        "speculative γ={}: mean acceptance length {:.2}, {:.1} tok/s (draft {:.0}% / verify {:.0}% of round time) | plain: {:.1} tok/s | speedup {:.2}x | output {same}",
        s.drafted_per_position.len(),
        s.mean_acceptance_length().unwrap_or(1.0),
        decode_tok_s(spec),
        100.0 * s.draft_s / total,
        100.0 * s.verify_s / total,
        decode_tok_s(plain),
        decode_tok_s(spec) / decode_tok_s(plain).max(1e-9),
    )
}

fn run_remote(url: &str, args: &GenerateArgs) -> Result<()> {
    if args.max_tokens == 0 {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    let req = RemoteRequest {
        prompt: args.prompt.clone(),
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        speculative: args.speculative,
        gamma: args.gamma,
        verification: args.verification,
        confidence_cuts: args.no_confidence_cuts.then_some(false),
        controls: args.controls.clone(),
    };
    let finished = client::generate(url, &args.access, &req)?;
    eprintln!("\n[{}]", client::summary(&finished));
    Ok(())
}

/// Runs `req`, writing its text to stdout as it comes.
fn stream(
    engine: &Engine,
    req: &GenerationRequest,
    proposer: Option<&dyn Proposer>,
) -> Result<Outcome> {
    let mut stdout = std::io::stdout().lock();
    let mut failed = None;
    let out = engine.generate(req, proposer, &mut |u: &Update| {
        let written = stdout
            .write_all(u.chunk.text.as_bytes())
            .and_then(|()| stdout.flush());
        match written {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok(out)
}

/// Decode speed: tokens after the first over the time after the first.
pub fn decode_tok_s(out: &Outcome) -> f64 {
    out.tokens.len().saturating_sub(1) as f64 / out.timing.decode_s.max(1e-9)
}

fn summary(out: &Outcome) -> String {
    let reason = match out.finish {
        FinishReason::Length => "length",
        other => other.as_str(),
    };
    format!(
        "prompt {} tokens, prefill {:.1} tok/s | generated {} tokens ({reason}), decode {:.1} tok/s",
        out.prompt_tokens,
        out.prompt_tokens as f64 / out.timing.prefill_s.max(1e-9),
        out.tokens.len(),
        decode_tok_s(out),
    )
}

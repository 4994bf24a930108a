//! `tandem bench rpc`: what the network costs speculation. The same greedy requests run
//! speculatively twice with the same drafter weights: in process, and through a verifier
//! and a drafter talking gRPC on loopback. The difference of their drafting time per round
//! is the verifier-drafter overhead (gRPC, snapshot encode/decode, scheduling), reported as a
//! share of the remote round time.

use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tandem_engine::{GenerationRequest, Update};
use tandem_proto::v1 as pb;

use crate::drafter::DrafterArgs;
use crate::models::ModelArgs;
use crate::serve;
use crate::{client, loopback};

/// Prompts of the measurement (prose, code, a letter, a question, a recipe; also `bench
/// http`'s).
pub(crate) const PROMPTS: [&str; 8] = [
    "The history of computing is a story of",
    "fn main() {\n    let mut total = 0;\n",
    "The three laws of thermodynamics are",
    "Dear team,\n\nThank you for",
    "import os\nimport sys\n\ndef main():\n",
    "The river flows through the valley and",
    "Q: What is a prime number?\nA:",
    "Step 1: Preheat the oven to",
];

/// Flags of `tandem bench rpc`.
#[derive(Args, Debug)]
pub struct RpcArgs {
    /// Tokens per request.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Tokens drafted per round.
    #[arg(long, default_value_t = 8)]
    gamma: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

/// Drafting and verifying time of one way of running.
#[derive(Serialize, Default)]
struct Side {
    rounds: u64,
    draft_ms_per_round: f64,
    verify_ms_per_round: f64,
}

#[derive(Serialize)]
struct RpcReport {
    requests: usize,
    max_tokens: usize,
    gamma: usize,
    in_process: Side,
    grpc: Side,
    overhead_ms_per_round: f64,
    overhead_share_of_round: f64,
}

impl Side {
    fn add(&mut self, rounds: u64, draft_s: f64, verify_s: f64) {
        self.rounds += rounds;
        self.draft_ms_per_round += draft_s * 1000.0;
        self.verify_ms_per_round += verify_s * 1000.0;
    }

    fn finish(mut self) -> Self {
        let n = self.rounds.max(1) as f64;
        self.draft_ms_per_round /= n;
        self.verify_ms_per_round /= n;
        self
    }
}

pub fn run(a: RpcArgs) -> Result<()> {
    if a.gamma == 0 || a.max_tokens < 2 {
        bail!("--gamma must be at least 1 and --max-tokens at least 2");
    }
    let report = serve::runtime()?.block_on(async {
        let lb = loopback::start(&a.drafter, &a.models, a.gamma, false).await?;
        let (engine, v_url) = (lb.engine().clone(), lb.url().to_string());
        let grpc = remote_side(&v_url, &a).await?;
        let local_drafter = a
            .drafter
            .load_any(&a.models, engine.model().head())?
            .proposer;
        let (max_tokens, gamma) = (a.max_tokens, a.gamma);
        let local = tokio::task::spawn_blocking(move || -> Result<Side> {
            let mut side = Side::default();
            for p in PROMPTS {
                let req = GenerationRequest {
                    prompt: engine.tokenizer().encode(p, true)?,
                    max_tokens,
                    ignore_eos: true,
                    gamma,
                    ..GenerationRequest::default()
                };
                let out =
                    engine.generate(&req, Some(local_drafter.as_ref()), &mut |_: &Update| {
                        ControlFlow::Continue(())
                    })?;
                side.add(out.spec.drafts, out.spec.draft_s, out.spec.verify_s);
            }
            Ok(side.finish())
        })
        .await??;
        let overhead = grpc.draft_ms_per_round - local.draft_ms_per_round;
        let round = grpc.draft_ms_per_round + grpc.verify_ms_per_round;
        anyhow::Ok(RpcReport {
            requests: PROMPTS.len(),
            max_tokens: a.max_tokens,
            gamma: a.gamma,
            overhead_ms_per_round: overhead,
            overhead_share_of_round: overhead / round.max(1e-9),
            in_process: local,
            grpc,
        })
    })?;
    print_report(&report);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn remote_side(url: &str, a: &RpcArgs) -> Result<Side> {
    let mut client = pb::generation_client::GenerationClient::connect(url.to_string()).await?;
    let mut side = Side::default();
    for p in PROMPTS {
        let req = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::Text(p.into())),
            max_tokens: Some(a.max_tokens as u32),
            ignore_eos: true,
            speculative: Some(true),
            max_gamma: Some(a.gamma as u32),
            ..Default::default()
        };
        let s = client::finished(&mut client, req)
            .await?
            .speculation
            .unwrap_or_default();
        side.add(s.drafts, s.draft_seconds, s.verify_seconds);
    }
    Ok(side.finish())
}

fn print_report(r: &RpcReport) {
    println!(
        "{} greedy requests x {} tokens, γ = {}",
        r.requests, r.max_tokens, r.gamma
    );
    println!(
        "{:<12} {:>8} {:>14} {:>15}",
        "", "rounds", "draft ms/round", "verify ms/round"
    );
    for (name, s) in [("in process", &r.in_process), ("gRPC", &r.grpc)] {
        println!(
            "{name:<12} {:>8} {:>14.2} {:>15.2}",
            s.rounds, s.draft_ms_per_round, s.verify_ms_per_round
        );
    }
    println!(
        "verifier-drafter overhead: {:.2} ms per round = {:.1}% of the round",
        r.overhead_ms_per_round,
        100.0 * r.overhead_share_of_round
    );
}

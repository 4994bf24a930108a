//! `tandem bench http`: what the OpenAI-compatible HTTP front end costs a generation. A
//! verifier (and, unless γ is 0, a drafter) serve on loopback in this process; the same
//! greedy requests run alternately through gRPC `Generate` (streamed) and HTTP
//! `/v1/completions` (streamed as server-sent events), each over one kept-alive
//! connection, every prompt × repetition a pair whose order alternates. The paired
//! difference of wall times (HTTP − gRPC, send to last byte) is the HTTP layer's cost
//! (JSON, SSE, axum), reported with its 95 % interval and as a share of the gRPC request.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::json;
use tandem_core::ab::{self, Interval};
use tandem_proto::v1 as pb;
use tandem_verifier::VerifierSettings;

use crate::bench::{median, write_json};
use crate::bench_rpc::PROMPTS;
use crate::drafter::DrafterArgs;
use crate::http_client::HttpClient;
use crate::models::ModelArgs;
use crate::{loopback, serve};

type Grpc = pb::generation_client::GenerationClient<tonic::transport::Channel>;

/// Flags of `tandem bench http`.
#[derive(Args, Debug)]
pub struct HttpArgs {
    /// New tokens per request (end-of-sequence ignored: every request makes exactly this many).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Times every prompt runs through each path.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Most tokens drafted per round; 0 serves without a drafter (plain decoding).
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

/// One request's times.
struct Timed {
    text: String,
    first_ms: f64,
    total_ms: f64,
}

/// One prompt × repetition through both paths.
#[derive(Serialize)]
struct Pair {
    prompt: usize,
    rep: usize,
    http_first: bool,
    grpc_ms: f64,
    http_ms: f64,
    grpc_first_token_ms: f64,
    http_first_token_ms: f64,
}

/// One path's requests.
#[derive(Serialize)]
struct PathSummary {
    mean_ms: f64,
    median_ms: f64,
    first_token_mean_ms: f64,
    ms_per_token: f64,
}

#[derive(Serialize)]
struct HttpReport {
    model: String,
    prompts: usize,
    reps: usize,
    max_tokens: usize,
    gamma: usize,
    grpc: PathSummary,
    http: PathSummary,
    /// HTTP − gRPC per pair, milliseconds.
    difference_ms: Interval,
    first_token_difference_ms: Interval,
    /// The mean difference over the mean gRPC request, in percent, with its interval.
    overhead_pct: f64,
    overhead_pct_low: f64,
    overhead_pct_high: f64,
    pairs: Vec<Pair>,
}

pub fn run(a: HttpArgs) -> Result<()> {
    if a.max_tokens == 0 || a.reps == 0 || PROMPTS.len() * a.reps < 2 {
        bail!("--max-tokens and --reps must be at least 1");
    }
    let report = serve::runtime()?.block_on(async {
        let settings = VerifierSettings {
            gamma: a.gamma.max(1),
            ..VerifierSettings::default()
        };
        let drafters = usize::from(a.gamma > 0);
        let lb = loopback::start_with(&a.drafter, &a.models, drafters, settings).await?;
        let mut grpc = Grpc::connect(lb.url().to_string()).await?;
        let mut http = HttpClient::connect(lb.http()).await?;
        let model = http.get_json("/v1/models").await?["data"][0]["id"]
            .as_str()
            .context("/v1/models lists no model")?
            .to_string();
        // Warm both paths (connections, caches) before timing.
        over_grpc(&mut grpc, &a, PROMPTS[0]).await?;
        over_http(&mut http, &a, &model, PROMPTS[0]).await?;
        let mut pairs = Vec::new();
        for rep in 0..a.reps {
            for (i, prompt) in PROMPTS.iter().enumerate() {
                let http_first = (rep + i) % 2 == 1;
                let (g, h) = if http_first {
                    let h = over_http(&mut http, &a, &model, prompt).await?;
                    (over_grpc(&mut grpc, &a, prompt).await?, h)
                } else {
                    let g = over_grpc(&mut grpc, &a, prompt).await?;
                    (g, over_http(&mut http, &a, &model, prompt).await?)
                };
                if g.text != h.text {
                    bail!(
                        "prompt {i}: greedy text differs: gRPC {:?}, HTTP {:?}",
                        g.text,
                        h.text
                    );
                }
                pairs.push(Pair {
                    prompt: i,
                    rep,
                    http_first,
                    grpc_ms: g.total_ms,
                    http_ms: h.total_ms,
                    grpc_first_token_ms: g.first_ms,
                    http_first_token_ms: h.first_ms,
                });
            }
        }
        report(model, &a, pairs)
    })?;
    print_report(&report);
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    Ok(())
}

/// The greedy request of `prompt` over gRPC, streamed.
async fn over_grpc(client: &mut Grpc, a: &HttpArgs, prompt: &str) -> Result<Timed> {
    let req = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Text(prompt.into())),
        max_tokens: Some(a.max_tokens as u32),
        ignore_eos: true,
        speculative: Some(a.gamma > 0),
        max_gamma: (a.gamma > 0).then_some(a.gamma as u32),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut stream = client.generate(req).await?.into_inner();
    let (mut text, mut first, mut finished) = (String::new(), None, None);
    while let Some(msg) = stream.message().await? {
        if first.is_none() && !msg.text.is_empty() {
            first = Some(ms(t0));
        }
        text.push_str(&msg.text);
        finished = msg.finished.or(finished);
    }
    let total_ms = ms(t0);
    let usage = finished
        .context("a gRPC stream without a finish message")?
        .usage
        .unwrap_or_default();
    check_tokens("gRPC", u64::from(usage.completion_tokens), a)?;
    Ok(Timed {
        text,
        first_ms: first.unwrap_or(total_ms),
        total_ms,
    })
}

/// The same request over HTTP `/v1/completions`, streamed as server-sent events.
async fn over_http(
    client: &mut HttpClient,
    a: &HttpArgs,
    model: &str,
    prompt: &str,
) -> Result<Timed> {
    let mut body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": a.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
        "speculative": a.gamma > 0,
    });
    if a.gamma > 0 {
        body["max_gamma"] = json!(a.gamma);
    }
    let t0 = Instant::now();
    let (mut text, mut first) = (String::new(), None);
    let streamed = client
        .stream_completion(&body, |t| {
            if first.is_none() && !t.is_empty() {
                first = Some(ms(t0));
            }
            text.push_str(t);
        })
        .await?;
    let total_ms = ms(t0);
    check_tokens("HTTP", streamed.completion_tokens, a)?;
    Ok(Timed {
        text,
        first_ms: first.unwrap_or(total_ms),
        total_ms,
    })
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

fn check_tokens(path: &str, got: u64, a: &HttpArgs) -> Result<()> {
    if got != a.max_tokens as u64 {
        bail!("{path}: {got} tokens generated, {} asked", a.max_tokens);
    }
    Ok(())
}

fn summary(total: Vec<f64>, first: &[f64], max_tokens: usize) -> PathSummary {
    let mean_ms = ab::mean(&total);
    PathSummary {
        mean_ms,
        median_ms: median(total),
        first_token_mean_ms: ab::mean(first),
        ms_per_token: mean_ms / max_tokens as f64,
    }
}

fn report(model: String, a: &HttpArgs, pairs: Vec<Pair>) -> Result<HttpReport> {
    let col = |f: fn(&Pair) -> f64| pairs.iter().map(f).collect::<Vec<_>>();
    let (g, h) = (col(|p| p.grpc_ms), col(|p| p.http_ms));
    let (gf, hf) = (
        col(|p| p.grpc_first_token_ms),
        col(|p| p.http_first_token_ms),
    );
    let difference_ms = ab::paired(&g, &h)?;
    let first_token_difference_ms = ab::paired(&gf, &hf)?;
    let base = ab::mean(&g);
    Ok(HttpReport {
        model,
        prompts: PROMPTS.len(),
        reps: a.reps,
        max_tokens: a.max_tokens,
        gamma: a.gamma,
        grpc: summary(g, &gf, a.max_tokens),
        http: summary(h, &hf, a.max_tokens),
        overhead_pct: 100.0 * difference_ms.mean / base,
        overhead_pct_low: 100.0 * difference_ms.low / base,
        overhead_pct_high: 100.0 * difference_ms.high / base,
        difference_ms,
        first_token_difference_ms,
        pairs,
    })
}

fn print_report(r: &HttpReport) {
    println!(
        "{} prompts x {} reps, {} greedy tokens each, γ = {} ({}), texts identical",
        r.prompts,
        r.reps,
        r.max_tokens,
        r.gamma,
        if r.gamma > 0 { "speculative" } else { "plain" }
    );
    println!(
        "{:<6} {:>9} {:>11} {:>15} {:>9}",
        "", "mean ms", "median ms", "first token ms", "ms/token"
    );
    for (name, s) in [("gRPC", &r.grpc), ("HTTP", &r.http)] {
        println!(
            "{name:<6} {:>9.1} {:>11.1} {:>15.1} {:>9.2}",
            s.mean_ms, s.median_ms, s.first_token_mean_ms, s.ms_per_token
        );
    }
    let d = &r.difference_ms;
    let f = &r.first_token_difference_ms;
    println!(
        "HTTP − gRPC per request: {:+.2} ms (95 % CI {:+.2} to {:+.2}) = {:+.2} % of a generation \
         ({:+.2} to {:+.2} %); first token {:+.2} ms ({:+.2} to {:+.2})",
        d.mean,
        d.low,
        d.high,
        r.overhead_pct,
        r.overhead_pct_low,
        r.overhead_pct_high,
        f.mean,
        f.low,
        f.high
    );
}

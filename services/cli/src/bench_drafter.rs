//! `tandem bench drafter`: how many sessions one drafter service sustains. At each
//! concurrency N, N gRPC sessions on loopback (real `Draft` streams, as verifiers open
//! them) each send a context of real target snapshot rows (in messages under the drafter's
//! limit, as a verifier chunks a long one) and take a first block, then,
//! all starting together, repeat rounds as a verifier does: send the rows of the positions
//! the last round committed, ask for a block of γ, wait for it.
//! Reported per concurrency: blocks per second of the whole drafter, the wait for a block
//! (what a verifier's round waits) at p50 and p99, and the drafter's sessions per drafting
//! step — with the blocks of sessions that ask at once drafted in one pass (`batched`) and
//! each alone (`alone`). Lookup is off: every block runs the model.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use pb::draft_request::Msg;
use serde::Serialize;
use tandem_core::{SamplingParams, SnapshotRows, SnapshotSpec};
use tandem_gemma::LogitsMode;
use tandem_proto::codec::{chunk_rows, message_limit, rows_to_pb, sampling_to_pb};
use tandem_proto::spec::{spec_from_info, spec_to_pb};
use tandem_proto::v1 as pb;
use tokio::sync::{mpsc, Barrier};
use tokio_stream::wrappers::ReceiverStream;

use crate::bench::{write_json, PASSAGE};
use crate::bench_load::percentile;
use crate::drafter::DrafterArgs;
use crate::loopback::start_drafter;
use crate::models::ModelArgs;
use crate::scrape::{scrape, total};

/// Positions a round commits (a verifier sends their rows before the next proposal).
const ROUND_ROWS: usize = 5;

/// How the drafter drafts the blocks of sessions that ask at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// In one pass.
    Batched,
    /// Each alone.
    Alone,
}

/// Flags of `tandem bench drafter`.
#[derive(Args, Debug)]
pub struct DrafterBenchArgs {
    /// Concurrent sessions to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    sessions: Vec<usize>,
    /// Blocks each session asks for.
    #[arg(long, default_value_t = 24)]
    rounds: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = 8)]
    gamma: usize,
    /// Context positions each session sends before its first block.
    #[arg(long, default_value_t = 256)]
    context: usize,
    /// Modes to measure.
    #[arg(long, value_delimiter = ',', default_value = "batched,alone")]
    modes: Vec<Mode>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    drafter: DrafterArgs,
    #[command(flatten)]
    models: ModelArgs,
}

#[derive(Serialize)]
struct Point {
    mode: Mode,
    sessions: usize,
    blocks_per_s: f64,
    block_wait_p50_ms: f64,
    block_wait_p99_ms: f64,
    /// Mean sessions per drafting step (the drafter's histogram; 1 when drafting alone).
    sessions_per_step: f64,
}

#[derive(Serialize)]
struct Report {
    backend: String,
    gamma: usize,
    context: usize,
    rounds: usize,
    points: Vec<Point>,
}

/// What every session sends: the taps of the bench passage and its tokens.
struct Workload {
    tokens: Vec<u32>,
    rows: Vec<f32>,
    spec: SnapshotSpec,
    target: pb::TargetIdentity,
    /// Most row bytes one message may carry under the drafter's message limit: a long
    /// context goes in several, as a verifier sends it.
    max_data_bytes: usize,
}

/// Room kept in a message for what is not row data (tokens, shape, framing).
const MESSAGE_MARGIN: usize = 64 << 10;

/// `tandem bench drafter`.
pub fn run(a: DrafterBenchArgs) -> Result<()> {
    if a.sessions.is_empty() || a.sessions.contains(&0) || a.rounds == 0 || a.gamma == 0 {
        bail!("--sessions, --rounds and --gamma must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut points = Vec::new();
    let mut workload: Option<Arc<Workload>> = None;
    for mode in &a.modes {
        let args = DrafterArgs {
            no_lookup: true,
            no_draft_batching: *mode == Mode::Alone,
            ..a.drafter.clone()
        };
        let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let drafter = rt.block_on(start_drafter(&args, &a.models, any, any))?;
        let url = drafter.url();
        let work = match &workload {
            Some(w) => Arc::clone(w),
            None => Arc::clone(workload.insert(rt.block_on(prepare(&a, &url))?)),
        };
        for &n in &a.sessions {
            let before = rt.block_on(scrape(drafter.metrics))?;
            let (secs, waits) = rt.block_on(round_trips(&url, &work, n, &a))?;
            let after = rt.block_on(scrape(drafter.metrics))?;
            let delta = |name: &str| total(&after, name) - total(&before, name);
            let steps = delta("tandem_drafter_batch_sessions_per_step_count");
            let point = Point {
                mode: *mode,
                sessions: n,
                blocks_per_s: waits.len() as f64 / secs,
                block_wait_p50_ms: percentile(&waits, 0.5),
                block_wait_p99_ms: percentile(&waits, 0.99),
                sessions_per_step: match steps > 0.0 {
                    true => delta("tandem_drafter_batch_sessions_per_step_sum") / steps,
                    false => 1.0,
                },
            };
            eprintln!(
                "bench drafter: {:?} × {n}: {:.1} blocks/s, wait p50 {:.1} ms",
                mode, point.blocks_per_s, point.block_wait_p50_ms
            );
            points.push(point);
        }
        rt.block_on(drafter.kill());
    }
    let report = Report {
        backend: a.models.backend(),
        gamma: a.gamma,
        context: a.context,
        rounds: a.rounds,
        points,
    };
    print_report(&report);
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    Ok(())
}

/// The running drafter's snapshot and target, and the real target's rows of the passage.
async fn prepare(a: &DrafterBenchArgs, url: &str) -> Result<Arc<Workload>> {
    let mut client = pb::drafter_client::DrafterClient::connect(url.to_string()).await?;
    let info = client.info(pb::InfoRequest {}).await?.into_inner();
    let spec = spec_from_info(&info).map_err(|e| anyhow!("{e}"))?;
    if a.gamma > info.max_gamma as usize {
        bail!("γ {} exceeds the drafter's {}", a.gamma, info.max_gamma);
    }
    let limit = message_limit(&info);
    let target = info.target.context("the drafter names no target")?;
    let (models, taps) = (a.models.clone(), spec.clone());
    let need = a.context + (a.rounds + 1) * ROUND_ROWS;
    let (tokens, rows) = tokio::task::spawn_blocking(move || -> Result<_> {
        let engine = models.load_engine()?;
        let mut tokens = engine
            .tokenizer()
            .encode(&PASSAGE.repeat(need / 40 + 2), true)?;
        tokens.truncate(need);
        let mut seq = engine.model().start(need);
        let step = seq.forward(&tokens, 0, LogitsMode::None, &taps)?;
        Ok((tokens, step.snapshot))
    })
    .await??;
    Ok(Arc::new(Workload {
        tokens,
        rows,
        spec,
        target,
        max_data_bytes: limit.saturating_sub(MESSAGE_MARGIN),
    }))
}

/// `n` sessions' rounds at once: the wall seconds and every block's wait in ms.
async fn round_trips(
    url: &str,
    work: &Arc<Workload>,
    n: usize,
    a: &DrafterBenchArgs,
) -> Result<(f64, Vec<f64>)> {
    let start = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let plan = Plan {
                url: url.to_string(),
                work: Arc::clone(work),
                seed: i as u64,
                rounds: a.rounds,
                gamma: a.gamma,
                context: a.context,
                start: Arc::clone(&start),
            };
            tokio::spawn(session(plan))
        })
        .collect();
    let (mut first, mut last, mut waits) = (None::<Instant>, None::<Instant>, Vec::new());
    for t in tasks {
        let run = t.await??;
        first = Some(first.map_or(run.start, |f| f.min(run.start)));
        last = Some(last.map_or(run.end, |l| l.max(run.end)));
        waits.extend(run.waits);
    }
    let secs = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => bail!("no session ran"),
    };
    Ok((secs, waits))
}

/// One session's part of a run.
struct Plan {
    url: String,
    work: Arc<Workload>,
    seed: u64,
    rounds: usize,
    gamma: usize,
    context: usize,
    /// Every session's timed rounds start together, once all have their context.
    start: Arc<Barrier>,
}

/// When a session's timed rounds started and ended, and each block's wait in ms.
struct SessionRun {
    start: Instant,
    end: Instant,
    waits: Vec<f64>,
}

/// One session: its context, an untimed first block, then its timed rounds.
async fn session(plan: Plan) -> Result<SessionRun> {
    let Plan {
        url,
        work,
        seed,
        rounds,
        gamma,
        context,
        start,
    } = plan;
    let mut client = pb::drafter_client::DrafterClient::connect(url).await?;
    let (tx, rx) = mpsc::channel(8);
    let send = |msg| pb::DraftRequest { msg: Some(msg) };
    let sampling = SamplingParams {
        seed,
        ..SamplingParams::default()
    };
    tx.send(send(Msg::Open(pb::Open {
        target: Some(work.target.clone()),
        sampling: Some(sampling_to_pb(&sampling)),
        snapshot: spec_to_pb(&work.spec),
    })))
    .await?;
    let mut stream = client.draft(ReceiverStream::new(rx)).await?.into_inner();
    stream
        .message()
        .await?
        .context("the drafter closed the session")?;
    let width = work.spec.row_width();
    let rows = |start: usize, end: usize| {
        let rows = SnapshotRows {
            start,
            width,
            data: work.rows[start * width..end * width].to_vec(),
            tokens: work.tokens[start..end].to_vec(),
        };
        rows_to_pb(&rows, pb::Dtype::F32)
    };
    let propose = |pos: usize| {
        send(Msg::Propose(pb::Propose {
            anchor: work.tokens[pos],
            position: pos as u64,
            gamma: gamma as u32,
        }))
    };
    for chunk in chunk_rows(&rows(0, context), work.max_data_bytes) {
        tx.send(send(Msg::Rows(chunk))).await?;
    }
    tx.send(propose(context)).await?;
    block(&mut stream).await?;
    start.wait().await;
    let t0 = Instant::now();
    let mut waits = Vec::with_capacity(rounds);
    let mut pos = context;
    for _ in 0..rounds {
        tx.send(send(Msg::Rows(rows(pos, pos + ROUND_ROWS))))
            .await?;
        pos += ROUND_ROWS;
        let t = Instant::now();
        tx.send(propose(pos)).await?;
        block(&mut stream).await?;
        waits.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(SessionRun {
        start: t0,
        end: Instant::now(),
        waits,
    })
}

/// Waits for the drafter's next block.
async fn block(stream: &mut tonic::Streaming<pb::DraftResponse>) -> Result<()> {
    match stream.message().await?.and_then(|r| r.msg) {
        Some(pb::draft_response::Msg::Block(_)) => Ok(()),
        other => bail!("the drafter answered {other:?} instead of a block"),
    }
}

fn print_report(r: &Report) {
    println!(
        "bench drafter: {}, γ = {}, context {}, {} blocks per session",
        r.backend, r.gamma, r.context, r.rounds
    );
    println!("mode      sessions  blocks/s  wait p50 ms  wait p99 ms  sessions/step");
    for p in &r.points {
        println!(
            "{:<8}  {:>8}  {:>8.1}  {:>11.1}  {:>11.1}  {:>13.2}",
            format!("{:?}", p.mode).to_lowercase(),
            p.sessions,
            p.blocks_per_s,
            p.block_wait_p50_ms,
            p.block_wait_p99_ms,
            p.sessions_per_step
        );
    }
}

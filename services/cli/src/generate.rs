//! `tandem generate`: plain autoregressive decoding of the target, streamed to stdout.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use tandem_core::{Sampler, SamplingParams};
use tandem_gemma::{ForwardOptions, Gemma3, KvCache, LogitsMode};
use tandem_tokenizer::GemmaTokenizer;

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
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    models: ModelArgs,
}

/// What one plain generation produced, with its timings.
pub struct PlainRun {
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Seconds spent on the prompt forward.
    pub prefill_s: f64,
    /// Seconds spent on the decode steps after the first token.
    pub decode_s: f64,
}

/// Greedy or sampled plain decoding; `on_token` sees each token as it is produced.
pub fn decode_plain(
    model: &Gemma3,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop_ids: &[u32],
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<PlainRun> {
    let mut cache: KvCache = model.new_cache(prompt.len() + max_tokens);
    let last = ForwardOptions {
        logits: LogitsMode::Last,
        taps: vec![],
    };
    let t0 = Instant::now();
    let out = model.forward(prompt, 0, &mut cache, &last)?;
    let mut logits = out
        .logits
        .context("no logits")?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut tokens = Vec::with_capacity(max_tokens);
    while tokens.len() < max_tokens {
        let next = sampler.sample(&logits);
        tokens.push(next);
        on_token(next)?;
        if stop_ids.contains(&next) || tokens.len() == max_tokens {
            break;
        }
        let out = model.forward(&[next], cache.len(), &mut cache, &last)?;
        logits = out
            .logits
            .context("no logits")?
            .flatten_all()?
            .to_vec1::<f32>()?;
    }
    Ok(PlainRun {
        tokens,
        prefill_s,
        decode_s: t1.elapsed().as_secs_f64(),
    })
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut sampler = Sampler::new(params)?;
    if args.max_tokens == 0 {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    let (model, tok) = args.models.load()?;
    let prompt = tok.encode(&args.prompt, true)?;
    let stop_ids: Vec<u32> = if args.ignore_eos {
        vec![]
    } else {
        tok.stop_ids().to_vec()
    };
    let run = stream_generation(
        &model,
        &tok,
        &prompt,
        args.max_tokens,
        &mut sampler,
        &stop_ids,
    )?;
    let n = run.tokens.len();
    eprintln!(
        "\n[prompt {} tokens, prefill {:.1} tok/s | generated {} tokens, decode {:.1} tok/s]",
        prompt.len(),
        prompt.len() as f64 / run.prefill_s,
        n,
        n.saturating_sub(1) as f64 / run.decode_s.max(1e-9),
    );
    Ok(())
}

fn stream_generation(
    model: &Gemma3,
    tok: &GemmaTokenizer,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop_ids: &[u32],
) -> Result<PlainRun> {
    let mut stream = tok.stream();
    let mut stdout = std::io::stdout().lock();
    let run = decode_plain(model, prompt, max_tokens, sampler, stop_ids, |t| {
        if let Some(text) = stream.push(t)? {
            stdout.write_all(text.as_bytes())?;
            stdout.flush()?;
        }
        Ok(())
    })?;
    if let Some(text) = stream.finish()? {
        stdout.write_all(text.as_bytes())?;
    }
    stdout.flush()?;
    Ok(run)
}

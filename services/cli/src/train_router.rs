//! `tandem train-router`: fits the [`TokenRouter`] of a routed drafter set on prompts cut
//! from each route's corpus (as `train-drafter` cuts them: files hashed into a held-out
//! split, at most 4 prompts a file), tunes the first route's bias on the held-out prompts
//! where there are two routes, sets the shortest prompt it routes and the most tokens it
//! reads (the prompt length), and writes the set's `router.json` with the held-out
//! accuracy. No model runs: only the tokenizer.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use tandem_core::{FitConfig, TokenRouter};
use tandem_dspark::{RouteSpec, RouterManifest, ROUTER_FILE};
use tandem_train::corpus::{self, CorpusConfig};

use crate::models::ModelArgs;

/// Flags of `tandem train-router`.
#[derive(Args, Debug)]
pub struct TrainRouterArgs {
    /// `NAME=DIR`: a route and its DSpark drafter folder, in route order (at least two).
    #[arg(long = "route", value_parser = pair, value_name = "NAME=DIR", required = true)]
    routes: Vec<(String, PathBuf)>,
    /// `NAME=PATH`: a file or folder of the route's text; repeatable per route.
    #[arg(long = "text", value_parser = pair, value_name = "NAME=PATH", required = true)]
    texts: Vec<(String, PathBuf)>,
    /// The route of a generation whose rows come without tokens.
    #[arg(long)]
    default: String,
    /// The set's folder (written: router.json; drafter paths are stored relative to it).
    #[arg(long)]
    out: PathBuf,
    /// Training prompts per route.
    #[arg(long, default_value_t = 6000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    prompts: usize,
    /// Held-out prompts per route.
    #[arg(long, default_value_t = 600)]
    held_out_prompts: usize,
    /// Tokens per prompt.
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Share of files, in percent, held out.
    #[arg(long, default_value_t = 10)]
    held_out_percent: u32,
    /// Fewest occurrences for an id to keep log-probabilities of its own.
    #[arg(long, default_value_t = FitConfig::default().min_count)]
    min_count: u64,
    /// Shortest prompts routed: the fewest tokens (among 1, 2, 4, …, --prompt-tokens)
    /// whose held-out prompts, cut to that length, are routed with at least this balanced
    /// accuracy; shorter prompts take the default route.
    #[arg(long, default_value_t = 0.9)]
    min_accuracy: f64,
    /// Seed of the corpus shuffles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    models: ModelArgs,
}

fn pair(s: &str) -> std::result::Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((n, p)) if !n.is_empty() && !p.is_empty() => Ok((n.to_string(), p.into())),
        _ => Err(format!("expected NAME=PATH, got {s:?}")),
    }
}

/// Runs the command.
pub fn run(a: TrainRouterArgs) -> Result<()> {
    let names: Vec<String> = a.routes.iter().map(|(n, _)| n.clone()).collect();
    validate(&a, &names)?;
    let tok = a.models.load_tokenizer()?;
    let cfg = CorpusConfig {
        prompt_tokens: a.prompt_tokens,
        bos: Some(tok.bos_id()),
        train_prompts: a.prompts,
        held_out_prompts: a.held_out_prompts,
        held_out_percent: a.held_out_percent,
        prompts_per_file: 4,
        weights: Vec::new(),
        seed: a.seed,
    };
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for name in &names {
        let paths: Vec<PathBuf> = (a.texts.iter())
            .filter(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .collect();
        let p = corpus::prompts(&paths, &cfg, |t| {
            tok.encode(t, false).map_err(|e| e.to_string())
        })
        .with_context(|| format!("the text of route {name}"))?;
        eprintln!(
            "[route {name}: {} training and {} held-out prompts of {} tokens]",
            p.train.len(),
            p.held_out.len(),
            a.prompt_tokens
        );
        train.push((name.clone(), p.train));
        held.push(p.held_out);
    }
    let fit = FitConfig {
        min_count: a.min_count,
        ..FitConfig::default()
    };
    let mut router = TokenRouter::fit(&train, fit)?;
    let untuned = router.balanced_accuracy(&held);
    let tuned = match names.len() {
        2 => Some(router.tune_first_bias(&held)?),
        _ => None,
    };
    let by_length = shortest_routed(&mut router, &held, a.prompt_tokens, a.min_accuracy);
    // Longer prompts are read as far as the router was fitted and checked.
    router.max_tokens = Some(a.prompt_tokens);
    let recalls: Vec<f64> = (held.iter().enumerate())
        .map(|(c, texts)| router.recall(texts, c))
        .collect();
    eprintln!(
        "[{} ids; held-out balanced accuracy {untuned:.4} untuned, {} tuned; by route \
         {recalls:?}; by length {by_length:?}; prompts of fewer than {} tokens take the \
         default, longer ones are read to their {}th]",
        router.ids.len(),
        tuned.map_or("not".into(), |t| format!("{t:.4}")),
        router.min_tokens,
        a.prompt_tokens
    );
    let routes = (a.routes.iter())
        .map(|(name, dir)| -> Result<RouteSpec> {
            Ok(RouteSpec {
                name: name.clone(),
                drafter: relative(dir, &a.out)?,
            })
        })
        .collect::<Result<_>>()?;
    let mut m = RouterManifest::new(routes, a.default.clone(), router);
    m.trained = json!({
        "texts": a.texts.iter().map(|(n, p)| format!("{n}={}", p.display())).collect::<Vec<_>>(),
        "prompts_per_route": a.prompts,
        "prompt_tokens": a.prompt_tokens,
        "held_out_percent": a.held_out_percent,
        "min_count": a.min_count,
        "seed": a.seed,
        "held_out_prompts": held.iter().map(Vec::len).collect::<Vec<_>>(),
        "held_out_balanced_accuracy": tuned.unwrap_or(untuned),
        "held_out_recall_by_route": recalls,
        "held_out_accuracy_by_length": by_length,
        "min_accuracy": a.min_accuracy,
    });
    m.write(&a.out)?;
    eprintln!("[wrote {}]", a.out.join(ROUTER_FILE).display());
    Ok(())
}

fn validate(a: &TrainRouterArgs, names: &[String]) -> Result<()> {
    if names.len() < 2 {
        bail!("--route: a router needs at least two routes");
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            bail!("--route {n} is given twice");
        }
        if !a.routes[i].1.join("dspark.json").is_file() {
            bail!(
                "--route {n}: {} is not a DSpark drafter folder",
                a.routes[i].1.display()
            );
        }
        if !a.texts.iter().any(|(t, _)| t == n) {
            bail!("--text: no text for route {n}");
        }
    }
    if let Some((t, _)) = a.texts.iter().find(|(t, _)| !names.contains(t)) {
        bail!("--text {t}=…: {t} is not a route");
    }
    if !names.contains(&a.default) {
        bail!("--default {} is not a route", a.default);
    }
    if !(0.0..=1.0).contains(&a.min_accuracy) {
        bail!("--min-accuracy must be in [0, 1], got {}", a.min_accuracy);
    }
    if a.prompts == 0 || a.held_out_prompts == 0 || a.prompt_tokens < 2 {
        bail!("--prompts and --held-out-prompts must be at least 1, --prompt-tokens at least 2");
    }
    Ok(())
}

/// Sets `router.min_tokens` to the shortest length (1, 2, 4, … up to `longest`) at which
/// the held-out prompts, cut to it, are routed with at least `min_accuracy`; returns the
/// accuracy at each length tried.
fn shortest_routed(
    router: &mut TokenRouter,
    held: &[Vec<Vec<u32>>],
    longest: usize,
    min_accuracy: f64,
) -> Vec<(usize, f64)> {
    let mut lengths: Vec<usize> = std::iter::successors(Some(1usize), |l| Some(l * 2))
        .take_while(|&l| l < longest)
        .collect();
    lengths.push(longest);
    let by_length: Vec<(usize, f64)> = (lengths.iter())
        .map(|&l| (l, router.accuracy_at(held, l)))
        .collect();
    router.min_tokens = (by_length.iter())
        .find(|(_, acc)| *acc >= min_accuracy)
        .map_or(longest, |(l, _)| *l);
    by_length
}

/// `dir` relative to `base` (both made absolute), for the manifest.
fn relative(dir: &Path, base: &Path) -> Result<PathBuf> {
    let abs = |p: &Path| -> Result<PathBuf> {
        let p = match p.is_absolute() {
            true => p.to_path_buf(),
            false => std::env::current_dir()?.join(p),
        };
        Ok(normalize(&p))
    };
    let (dir, base) = (abs(dir)?, abs(base)?);
    let common = (dir.components().zip(base.components()))
        .take_while(|(a, b)| a == b)
        .count();
    let ups = base.components().count() - common;
    let mut out: PathBuf = std::iter::repeat_n("..", ups).collect();
    out.extend(dir.components().skip(common));
    Ok(out)
}

/// `p` without `.` and with each `..` applied to what precedes it.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

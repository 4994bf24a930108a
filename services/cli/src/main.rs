//! `tandem`: run Gemma generations and benchmarks from the command line.

mod bench;
mod bench_ab;
mod bench_drafter;
mod bench_golden;
mod bench_http;
mod bench_load;
mod bench_load_report;
mod bench_products;
mod bench_rpc;
mod bench_soak;
mod bench_spec;
mod calibrate;
mod chart;
mod chart_load;
mod client;
mod controls;
mod drafter;
mod generate;
mod http_client;
mod loopback;
mod models;
mod prompt_sets;
mod reliability;
mod scrape;
mod serve;
mod soak_client;
mod train_drafter;
mod train_router;

use clap::{Parser, Subcommand};

/// Speculative decoding for Gemma.
#[derive(Parser)]
#[command(name = "tandem", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text with the target model, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Measure the target: prefill and decode speed, and the cost of block forwards.
    Bench(bench::BenchArgs),
    /// Run the drafter service.
    Drafter(serve::DrafterServeArgs),
    /// Run the verifier service (the client-facing API).
    Verifier(serve::VerifierServeArgs),
    /// Run a drafter and a verifier on this machine.
    Up(serve::UpArgs),
    /// Distil a DSpark drafter from the target on text from a corpus.
    TrainDrafter(train_drafter::TrainArgs),
    /// Fit the router of a set of DSpark drafters (which drafter drafts a generation,
    /// from its prompt's tokens) on text of each route.
    TrainRouter(train_router::TrainRouterArgs),
    /// Fit the calibration of a DSpark drafter's confidences on rounds of the target and
    /// save it beside the drafter.
    Calibrate(calibrate::CalibrateArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Drafter(args) => serve::drafter(args),
        Command::Verifier(args) => serve::verifier(args),
        Command::Up(args) => serve::up(args),
        Command::TrainDrafter(args) => train_drafter::run(args),
        Command::TrainRouter(args) => train_router::run(args),
        Command::Calibrate(args) => calibrate::run(args),
    };
    if let Err(e) = result {
        eprintln!("tandem: error: {e:#}");
        std::process::exit(1);
    }
}

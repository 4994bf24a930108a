//! `tandem`: run Gemma generations and benchmarks from the command line.

mod bench;
mod drafter;
mod generate;
mod models;

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
    };
    if let Err(e) = result {
        eprintln!("tandem: error: {e:#}");
        std::process::exit(1);
    }
}

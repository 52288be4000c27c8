//! The `switchyard` command: the router and its tools.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool reports on stdout and stderr"
)]

mod demo;
mod sim_engine;

use clap::{Parser, Subcommand};

/// Switchyard: bucket-first routing for fleets of SGLang and vLLM engines.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Route a simulated workload through the real selection core over simulated
    /// engines, then print a report.
    Demo(demo::DemoArgs),
    /// Run one simulated SGLang-compatible engine (HTTP, KV events, load feed, PD
    /// bootstrap, faults). Prints one JSON line with the bound ports once ready.
    SimEngine(Box<engine_sim::SimConfig>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::SimEngine(config) => sim_engine::run(*config),
    }
}

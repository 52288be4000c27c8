//! The `switchyard` command: the router and its tools.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool reports on stdout and stderr"
)]

mod demo;

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(args),
    }
}

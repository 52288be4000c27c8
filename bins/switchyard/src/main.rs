//! The `switchyard` command: the router and its tools.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool reports on stdout and stderr"
)]

mod demo;
mod drive;
mod indexer;
mod prompt;
mod replay;
mod serve;
mod sim_engine;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Parser, Subcommand};

/// mimalloc: the request path allocates and frees many small buffers, which glibc's
/// allocator serves measurably slower (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Switchyard: bucket-first routing for fleets of SGLang and vLLM engines.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the router.
    Serve(Box<serve::ServeArgs>),
    /// Run a prefix indexer shared by router replicas: it follows the KV events of
    /// the cache-aware models' engines (those of FILE, reloaded as a router reloads
    /// it, of Kubernetes discovery and of its `/workers`) and answers the routers'
    /// lookups.
    Indexer(indexer::IndexerArgs),
    /// Check a configuration file, or print the configuration's JSON Schema.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Start simulated engines and the router, run a chat workload through it, and
    /// print a report.
    Demo(demo::DemoArgs),
    /// Replay a trace through the real selection code against modelled engines, on a
    /// virtual clock, and print per policy: TTFT, throughput, cached share, load
    /// spread. The same inputs print the same bytes.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Replay(replay::ReplayArgs),
    /// Write a trace for `replay` of one of the workload shapes (conversations,
    /// bursts, agent sessions, long documents), at a share of a fleet's capacity.
    Workload(workload::WorkloadArgs),
    /// Send a trace's requests to a running router at their arrival times (streamed
    /// `/generate` of the trace's token ids) and print what `replay` prints.
    Drive(drive::DriveArgs),
    /// Print the token ids the router routes request bodies on (one JSON body per
    /// line on stdin, one line of ids or of the error per body on stdout).
    Prompt(prompt::PromptArgs),
    /// Run simulated SGLang-compatible engines (HTTP, KV events, load feed, PD
    /// bootstrap, faults): one, or `--engines N` in this process. Prints one JSON line
    /// with the bound ports once ready.
    SimEngine(Box<engine_sim::FleetConfig>),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate FILE without contacting engines; exits non-zero with every problem.
    Check {
        /// The YAML configuration file.
        file: PathBuf,
    },
    /// Print the configuration's JSON Schema.
    Schema,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return explain_dropped_flag(e),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Indexer(args) => indexer::run(&args),
        Command::Config(ConfigCommand::Check { file }) => serve::check(&file),
        Command::Config(ConfigCommand::Schema) => serve::schema(),
        Command::Demo(args) => demo::run(args),
        Command::Replay(args) => replay::run(&args),
        Command::Workload(args) => workload::run(&args),
        Command::Drive(args) => drive::run(&args),
        Command::Prompt(args) => prompt::run(&args),
        Command::SimEngine(config) => sim_engine::run(*config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Turns clap's "unexpected argument" for a flag of earlier routers into a message
/// naming what replaced it.
fn explain_dropped_flag(error: clap::Error) -> ExitCode {
    if error.kind() == ErrorKind::UnknownArgument
        && let Some(ContextValue::String(flag)) = error.get(ContextKind::InvalidArg)
    {
        let name = flag.split('=').next().unwrap_or(flag);
        if let Some(dropped) =
            router_policy::dropped_option(name).or_else(|| router_policy::dropped_policy_type(name))
        {
            eprintln!("error: {name} was removed: {}", dropped.replacement);
            return ExitCode::from(2);
        }
    }
    error.exit()
}

//! Project automation, run as `cargo xtask <task>`.
//!
//! - `ci`: everything CI checks (format, lints, Rust and Python tests, doc tests, the
//!   container image's build, tidy, licences), installing what the tests need.
//! - `tidy`: the architecture and hygiene rules of `ARCHITECTURE.md`.
//! - `image`: the Dockerfile's rules, then its build stage outside a container (the
//!   release binary, in `target/image`), as `ci` checks them.
//! - `python-env`: the venv and third-party test data some tests need (`.cache`, or
//!   `SWITCHYARD_CACHE`); the Rust tests that need them run it on first use.
//! - `bench`: the criterion benches of the routing hot paths.
//! - `bench-e2e`: the side-by-side load benchmark (wrk) against peer routers.
//! - `bench-scale`: one release router in front of 8 to 1,024 simulated engine ranks
//!   publishing KV events, under traffic: CPU per request, selection time, feed lag,
//!   RSS, `/metrics`, start and reload times, probe load per fleet size (not run in
//!   CI).
//! - `soak`: the release router for `--minutes N` (10) under `--connections C` (256)
//!   mixed JSON, streamed and cancelled chats while faults toggle on simulated
//!   engines and engines join and leave; fails on unexplained errors, in-flight
//!   requests left over, or memory growth (not run in CI; `--no-faults` for the load
//!   alone).
//! - `routing-quality`: TTFT per policy on a shared-prefix workload near saturation,
//!   replayed and live through simulated engines, against the targets, with
//!   `docs/routing-quality.svg` (not run in CI).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool reports on stdout and stderr"
)]

mod bench;
mod bench_e2e;
mod bench_scale;
mod ci;
mod image;
mod processes;
mod python;
mod routing_quality;
mod soak;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    let root = workspace_root();
    std::env::set_current_dir(&root).with_context(|| format!("entering {}", root.display()))?;
    match task.as_str() {
        "ci" => ci::run(&root),
        "tidy" => tidy::run(&root),
        "image" => image::check(&root)
            .and_then(|stage| image::build(&root, &stage))
            .map(|binary| println!("{}", binary.display())),
        "python-env" => python::prepare(&root).map(drop),
        "bench" => bench::run(&root, &rest),
        "bench-e2e" => bench_e2e::run(&root, &rest),
        "bench-scale" => bench_scale::run(&root, &rest),
        "soak" => soak::run(&root, &rest),
        "routing-quality" => routing_quality::run(&root, &rest),
        _ => bail!(
            "usage: cargo xtask <ci | tidy | image | python-env | bench [criterion args] | bench-e2e [options] | bench-scale [options] | soak [--minutes N] [--connections C] [--no-faults] | routing-quality [--requests N] [--live-requests N] [--no-live] [--matrix]>"
        ),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// Runs one step, printing its name and duration; fails if the command fails.
#[allow(
    clippy::disallowed_methods,
    reason = "a build tool reports wall-clock step durations"
)]
fn step(name: &str, command: &mut Command) -> anyhow::Result<()> {
    eprintln!("==> {name}");
    let started = Instant::now();
    let status = command
        .status()
        .with_context(|| format!("starting {name}"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    eprintln!("    {name} passed in {:.0?}", started.elapsed());
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cargo metadata` of the workspace's own packages, as JSON.
fn cargo_metadata() -> anyhow::Result<Vec<u8>> {
    let output = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output.stdout)
}

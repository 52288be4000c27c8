//! `cargo xtask routing-quality`: time to first token on a shared-prefix multi-turn
//! workload near saturation, per policy, replayed and live.
//!
//! The fleet is 8 simulated engines whose prefill is shared per engine (one at a time,
//! 20k tokens/s), with 32 slots, 100 output tokens/s per request and 64k tokens of
//! prefix cache each, smaller than the workload's working set. `switchyard workload`
//! writes the trace at 85% of the throughput round robin reaches on that fleet
//! overloaded; `switchyard replay` runs all of it through each policy; the first
//! `--live-requests` of it are then sent through the release binary to real
//! simulated-engine processes (`switchyard drive`), one fresh fleet per policy, and
//! replayed alone for comparison. The report checks the targets, and the
//! plot (`docs/routing-quality.svg`) shows each run's TTFT distribution. The sharper
//! signals' experiments (a host tier, lagging KV feeds) replay the same trace. With
//! `--matrix`, the policies are replayed on a matrix of workloads instead (`matrix`).

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::processes::{Target, json_field, release_switchyard, spawn_ready};
use crate::step;

mod matrix;
mod plot;
mod signals;

/// The policies compared, the baseline first.
const POLICIES: &[&str] = &["round_robin", "power_of_two", "cache_aware"];
const MODEL: &str = "rq";
const ENGINES: usize = 8;
/// The modelled and simulated engines' timing, shared by every command.
const TIMING_FLAGS: &[&str] = &[
    "--prefill-tokens-per-sec",
    "20000",
    "--serial-prefill",
    "--decode-tokens-per-sec",
    "100",
];
/// Their prefix cache.
const CACHE_FLAGS: &[&str] = &["--kv-capacity-tokens", "65536"];
const SLOTS: &str = "32";
/// Requests of the benchmark's trace.
const DEFAULT_REQUESTS: usize = 100_000;
/// Requests of each matrix cell's trace.
const MATRIX_REQUESTS: usize = 10_000;
/// The most requests of a matrix cell driven live.
const MATRIX_LIVE_REQUESTS: usize = 3_000;

struct Options {
    requests: Option<usize>,
    live_requests: usize,
    live: bool,
    matrix: bool,
}

fn options(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        requests: None,
        live_requests: 10_000,
        live: true,
        matrix: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> anyhow::Result<usize> {
            args.next()
                .with_context(|| format!("{name} needs a number"))?
                .parse()
                .with_context(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--requests" => options.requests = Some(number("--requests")?),
            "--live-requests" => options.live_requests = number("--live-requests")?,
            "--no-live" => options.live = false,
            "--matrix" => options.matrix = true,
            other => bail!(
                "unknown option {other}: cargo xtask routing-quality [--requests N] [--live-requests N] [--no-live] [--matrix]"
            ),
        }
    }
    anyhow::ensure!(
        options.live_requests <= options.requests.unwrap_or(DEFAULT_REQUESTS),
        "--live-requests must not exceed --requests"
    );
    Ok(options)
}

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = options(args)?;
    let (binary, dir) = release_switchyard("routing-quality")?;
    let tokenizer = root.join("testdata/tokenizer-bytes/tokenizer.json");
    if options.matrix {
        let plan = matrix::Plan {
            requests: options.requests.unwrap_or(MATRIX_REQUESTS),
            live_requests: if options.live {
                options.live_requests.min(MATRIX_LIVE_REQUESTS)
            } else {
                0
            },
            tokenizer: &tokenizer,
            markdown: &dir.join("matrix.md"),
            svg: &root.join("docs/routing-quality-matrix.svg"),
        };
        return matrix::run(&binary, &dir, &plan);
    }

    let fleet = dir.join("fleet.yaml");
    let urls: Vec<String> = (0..ENGINES)
        .map(|i| format!("http://127.0.0.1:{}", i + 1))
        .collect();
    std::fs::write(&fleet, router_config(&urls, None, None).to_string())?;
    let trace = dir.join("trace.jsonl");
    let requests = options.requests.unwrap_or(DEFAULT_REQUESTS).to_string();
    run_binary(
        "generate the workload at 85% of round robin's capacity",
        Command::new(&binary)
            .args(["workload", "--out"])
            .arg(&trace)
            .args(["--requests", &requests, "--config"])
            .arg(&fleet)
            .args(["--slots", SLOTS])
            .args(TIMING_FLAGS)
            .args(CACHE_FLAGS),
    )?;
    let replayed = dir.join("replay.json");
    replay(&binary, &trace, &fleet, &replayed)?;
    let mut runs = vec![("replay".to_owned(), read_summaries(&replayed)?)];
    signals::run(&binary, &dir, &trace)?;
    if options.live {
        let live_trace = dir.join("trace-live.jsonl");
        let text = std::fs::read_to_string(&trace)?;
        let head: String = text
            .lines()
            .take(options.live_requests)
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&live_trace, head)?;
        let replayed_head = dir.join("replay-live.json");
        replay(&binary, &live_trace, &fleet, &replayed_head)?;
        let mut live = Vec::new();
        for policy in POLICIES {
            live.extend(live_run(&binary, &tokenizer, &dir, &live_trace, policy)?);
        }
        runs.push((
            format!("replay, first {}", options.live_requests),
            read_summaries(&replayed_head)?,
        ));
        runs.push((format!("live, first {}", options.live_requests), live));
    }
    for (name, summaries) in &runs {
        println!("\n{name}");
        print_table(summaries);
        check_targets(summaries);
    }
    let svg = root.join("docs/routing-quality.svg");
    std::fs::write(&svg, plot::ttft_cdf(&runs))
        .with_context(|| format!("writing {}", svg.display()))?;
    eprintln!(
        "==> wrote {} and the runs' JSON in {}",
        svg.display(),
        dir.display()
    );
    Ok(())
}

fn run_binary(name: &str, command: &mut Command) -> anyhow::Result<()> {
    step(name, command.env("RUST_LOG", "warn"))
}

fn replay(binary: &Path, trace: &Path, fleet: &Path, json: &Path) -> anyhow::Result<()> {
    run_binary(
        &format!("replay {}", trace.display()),
        Command::new(binary)
            .args(["replay", "--trace"])
            .arg(trace)
            .arg("--config")
            .arg(fleet)
            .args(["--policies", &POLICIES.join(",")])
            .args(["--slots", SLOTS])
            .args(TIMING_FLAGS)
            .args(CACHE_FLAGS)
            .arg("--json")
            .arg(json)
            .stdout(Stdio::null()),
    )
}

fn read_summaries(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str(&text)? {
        Value::Array(summaries) => Ok(summaries),
        other => bail!("{} holds {other}, not a list", path.display()),
    }
}

/// The router's configuration: `urls` as plain engines of one model, every group
/// running `policy` (the default one when `None`).
fn router_config(urls: &[String], tokenizer: Option<&Path>, policy: Option<&str>) -> Value {
    let engines: Vec<Value> = urls
        .iter()
        .enumerate()
        .map(|(i, url)| serde_json::json!({"id": format!("e{i}"), "url": url, "role": "plain"}))
        .collect();
    let mut model = serde_json::json!({"id": MODEL, "block_size": 16, "engines": engines});
    if let Some(tokenizer) = tokenizer {
        model["tokenizer"] = tokenizer.display().to_string().into();
    }
    if let Some(policy) = policy {
        model["policies"] = serde_json::json!({"plain": {"type": policy}});
    }
    serde_json::json!({"listen": "127.0.0.1:0", "models": [model]})
}

/// A live run's fleet and drive: simulated engines started afresh, the router's
/// configuration, and how the trace is sent.
pub(super) struct Live<'a> {
    /// The run's name, for its files and its summary.
    pub(super) label: &'a str,
    /// Engines to start.
    pub(super) engines: usize,
    /// Their prefix cache, tokens.
    pub(super) cache_tokens: u64,
    /// Every group's policy type.
    pub(super) policy: &'a str,
    /// Changes to the router's configuration (`routed_pages`, the policy's settings).
    pub(super) patch: &'a dyn Fn(&mut Value),
    /// Clients of a closed loop; `None`: the trace's arrival times.
    pub(super) clients: Option<u64>,
}

/// The benchmark's live run of `policy`.
fn live_run(
    binary: &Path,
    tokenizer: &Path,
    dir: &Path,
    trace: &Path,
    policy: &str,
) -> anyhow::Result<Vec<Value>> {
    let live = Live {
        label: policy,
        engines: ENGINES,
        cache_tokens: 65_536,
        policy,
        patch: &|_| {},
        clients: None,
    };
    run_live(binary, tokenizer, dir, trace, &live)
}

/// Starts a fresh fleet of simulated engines and a router as `live` describes,
/// drives `trace` through it, and returns the summary.
pub(super) fn run_live(
    binary: &Path,
    tokenizer: &Path,
    dir: &Path,
    trace: &Path,
    live: &Live<'_>,
) -> anyhow::Result<Vec<Value>> {
    let label = live.label;
    let tag: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    eprintln!("==> live: {label}");
    let mut processes = Vec::new();
    let mut urls = Vec::new();
    let cache = live.cache_tokens.to_string();
    for i in 0..live.engines {
        let mut command = Command::new(binary);
        command
            .args([
                "sim-engine",
                "--port",
                "0",
                "--kv-port",
                "0",
                "--replay-port",
                "0",
            ])
            .args(["--load-port", "0", "--model", MODEL, "--tokenizer"])
            .arg(tokenizer)
            .args(["--max-running-requests", SLOTS, "--page-size", "16"])
            .args(TIMING_FLAGS)
            .args(["--kv-capacity-tokens", &cache])
            .env("RUST_LOG", "warn");
        let log = File::create(dir.join(format!("engine-{tag}-{i}.log")))?;
        let (child, ready) = spawn_ready(command, Stdio::from(log))
            .with_context(|| format!("starting engine {i}"))?;
        let url = format!("http://{}", json_field(&ready, &["ports", "http"])?);
        processes.push(Target {
            name: format!("e{i}"),
            url: url.clone(),
            process: Some(child),
        });
        urls.push(url);
    }
    let config = dir.join(format!("router-{tag}.yaml"));
    let mut router_yaml = router_config(&urls, Some(tokenizer), Some(live.policy));
    (live.patch)(&mut router_yaml);
    std::fs::write(&config, router_yaml.to_string())?;
    let mut serve = Command::new(binary);
    serve
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn");
    let log = File::create(dir.join(format!("router-{tag}.log")))?;
    let (child, ready) = spawn_ready(serve, Stdio::from(log)).context("starting the router")?;
    let router = Target {
        name: "router".into(),
        url: format!("http://{}", json_field(&ready, &["addr"])?),
        process: Some(child),
    };
    let json = dir.join(format!("live-{tag}.json"));
    let engine_ids: String = (0..live.engines)
        .map(|i| format!("e{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut drive = Command::new(binary);
    drive
        .args(["drive", "--trace"])
        .arg(trace)
        .args([
            "--url",
            &router.url,
            "--model",
            MODEL,
            "--label",
            label,
            "--engines",
            &engine_ids,
            "--json",
        ])
        .arg(&json);
    if let Some(clients) = live.clients {
        drive.args(["--closed-loop", &clients.to_string()]);
    }
    run_binary(
        &format!("drive {} through {label}", trace.display()),
        &mut drive,
    )?;
    drop(router);
    drop(processes);
    read_summaries(&json)
}

fn number(summary: &Value, field: &str) -> f64 {
    summary[field].as_f64().unwrap_or(f64::NAN)
}

fn print_table(summaries: &[Value]) {
    let width = summaries
        .iter()
        .filter_map(|s| s["policy"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0)
        .max(14);
    println!(
        "{:<width$} {:>9} {:>12} {:>12} {:>9} {:>9} {:>10} {:>13}",
        "policy",
        "rejected",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "req/s",
        "cached",
        "of_oracle",
        "load_max/min"
    );
    for s in summaries {
        println!(
            "{:<width$} {:>9} {:>12.1} {:>12.1} {:>9.1} {:>8.1}% {:>9.1}% {:>13.2}",
            s["policy"].as_str().unwrap_or("?"),
            s["rejected"],
            number(s, "ttft_p50_ms"),
            number(s, "ttft_p99_ms"),
            number(s, "requests_per_sec"),
            100.0 * number(s, "cached_share"),
            100.0 * number(s, "of_oracle"),
            number(s, "load_max_over_min"),
        );
    }
}

/// Prints each of the targets for cache_aware, met or missed.
fn check_targets(summaries: &[Value]) {
    let find = |name: &str| summaries.iter().find(|s| s["policy"] == name);
    let (Some(rr), Some(p2), Some(ca)) = (
        find("round_robin"),
        find("power_of_two"),
        find("cache_aware"),
    ) else {
        return;
    };
    let targets = [
        (
            "TTFT p50 <= 1/3 of round_robin's",
            number(ca, "ttft_p50_ms") / number(rr, "ttft_p50_ms"),
            1.0 / 3.0,
            false,
        ),
        (
            "TTFT p50 <= 1/2 of power_of_two's",
            number(ca, "ttft_p50_ms") / number(p2, "ttft_p50_ms"),
            0.5,
            false,
        ),
        (
            "TTFT p99 <= 0.7x power_of_two's",
            number(ca, "ttft_p99_ms") / number(p2, "ttft_p99_ms"),
            0.7,
            false,
        ),
        (
            "cached tokens >= 90% of the oracle",
            number(ca, "of_oracle"),
            0.9,
            true,
        ),
        (
            "engine load max/min <= 1.5",
            number(ca, "load_max_over_min"),
            1.5,
            false,
        ),
    ];
    for (name, value, bound, at_least) in targets {
        let met = if at_least {
            value >= bound
        } else {
            value <= bound
        };
        println!(
            "  cache_aware {name}: {value:.3} ({})",
            if met { "met" } else { "MISSED" }
        );
    }
}

//! `cargo xtask bench-e2e`: side-by-side load benchmark against one simulated engine
//! with delays off: direct, a minimal pass-through proxy (the floor), Switchyard, and
//! the prebuilt peer routers from PyPI, in alternating rounds, with wrk: small chats
//! and small completions, each JSON and streamed.
//!
//! Switchyard (and the baseline) tokenize every request with the model's real
//! tokenizer, Qwen3's `tokenizer.json` and chat template from the test cache, in a
//! bucket bounded by prompt length (what a deployment routing on token counts does:
//! without a bound or a policy reading prompts the router would not tokenize);
//! `--tokenizer PATH` names another, `--no-tokenizer` estimates prompt lengths from
//! body sizes instead. The peers are run as their documented round-robin setups,
//! which do not tokenize.
//!
//! Options: `--rounds N` (3), `--duration SECONDS` (5), `--concurrency 1,32,128`,
//! `--no-peers`, `--baseline PATH` (another switchyard binary, say the previous
//! commit's, measured beside this one in the same rounds), `--flow` (also this
//! binary with a flow section: a queue, which stays empty, and a priority header),
//! `--picker` (also Envoy alone, and Envoy with this binary as its endpoint picker:
//! `picker`), `--tokenizer PATH`, `--no-tokenizer`.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::processes::{Target, json_field, profile_dir, rss_kib, spawn_ready};
use crate::{cargo, step};

mod picker;

/// Peer routers and the versions benchmarked.
const PEERS: &[(&str, &str)] = &[
    ("smg", "1.13.0"),
    ("sglang-router", "0.3.2"),
    ("vllm-router", "0.1.17"),
];

struct Options {
    rounds: usize,
    duration: u64,
    concurrency: Vec<u32>,
    peers: bool,
    baseline: Option<PathBuf>,
    /// Also measure this binary with a `flow` section.
    flow: bool,
    /// Also measure Envoy alone and Envoy with this binary as its endpoint picker.
    picker: bool,
    /// `None`: no tokenizer; `Some(None)`: the Qwen3 one from the test cache.
    tokenizer: Option<Option<PathBuf>>,
}

/// The name the baseline binary is reported under.
const BASELINE: &str = "switchyard (baseline)";

/// The name this binary with a flow section is reported under.
const FLOW: &str = "switchyard (flow)";

/// The flow section of [`FLOW`]: a queue (empty while the engine has room: the bench
/// sets no caps) and a priority header read on every request.
const FLOW_SECTION: &str =
    "    flow: {queue: {max_wait_ms: 2000}, priority: {header: x-priority}}\n";

fn options(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        rounds: 3,
        duration: 5,
        concurrency: vec![1, 32, 128],
        peers: true,
        baseline: None,
        flow: false,
        picker: false,
        tokenizer: Some(None),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--rounds" => options.rounds = value()?.parse()?,
            "--duration" => options.duration = value()?.parse()?,
            "--concurrency" => {
                options.concurrency = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--no-peers" => options.peers = false,
            "--baseline" => options.baseline = Some(value()?.into()),
            "--flow" => options.flow = true,
            "--picker" => options.picker = true,
            "--tokenizer" => options.tokenizer = Some(Some(value()?.into())),
            "--no-tokenizer" => options.tokenizer = None,
            other => bail!("unknown option {other}"),
        }
    }
    Ok(options)
}

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    requests_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_request: Option<f64>,
    /// The part of it the process counted with the target's took (the picker's).
    with_cpu_us_per_request: Option<f64>,
    rss_mib: Option<f64>,
}

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = options(args)?;
    step(
        "build switchyard and the pass-through proxy (release)",
        cargo().args([
            "build",
            "--locked",
            "--release",
            "-p",
            "switchyard",
            "-p",
            "switchyard-benches",
            "--bin",
            "switchyard",
            "--bin",
            "passthrough",
        ]),
    )?;
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is needed (Debian: apt-get install wrk)");
    }
    let tokenizer = match &options.tokenizer {
        None => None,
        Some(Some(path)) => Some(path.clone()),
        Some(None) => {
            crate::python::prepare(root)?;
            Some(crate::python::cache_dir(root).join("qwen3/tokenizer.json"))
        }
    };
    match &tokenizer {
        Some(path) => eprintln!("switchyard tokenizes with {}", path.display()),
        None => eprintln!("switchyard estimates prompt lengths (no tokenizer)"),
    }
    let release = profile_dir("release")?;
    let mut engine_cmd = Command::new(release.join("switchyard"));
    engine_cmd.args([
        "sim-engine",
        "--port",
        "0",
        "--prefill-tokens-per-sec",
        "0",
        "--decode-tokens-per-sec",
        "0",
        "--max-running-requests",
        "1024",
    ]);
    let (engine, ready) = spawn_ready(engine_cmd, Stdio::null())?;
    let engine_url = format!("http://{}", json_field(&ready, &["ports", "http"])?);
    let _engine = Target {
        name: "engine".into(),
        url: engine_url.clone(),
        process: Some(engine),
    };
    let mut targets = vec![Target {
        name: "direct".into(),
        url: engine_url.clone(),
        process: None,
    }];
    let port = free_port()?;
    let mut passthrough = Command::new(release.join("passthrough"));
    passthrough.args([format!("127.0.0.1:{port}"), engine_url.clone()]);
    targets.push(start(passthrough, "pass-through", port)?);
    let config = match &tokenizer {
        Some(path) => Some(bounded_config(path, &engine_url, "")?),
        None => None,
    };
    let flow_config = match (&tokenizer, options.flow) {
        (Some(path), true) => Some(bounded_config(path, &engine_url, FLOW_SECTION)?),
        (None, true) => {
            bail!("--flow needs the tokenizer (the flow section is in the bounded configuration)")
        }
        (_, false) => None,
    };
    let serve_with = |binary: &Path, port: u16, config: &Option<PathBuf>| {
        let mut command = Command::new(binary);
        command
            .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
            .env("RUST_LOG", "warn");
        match config {
            Some(file) => command.arg("--config").arg(file),
            None => command
                .args(["--model", "sim-model", "--policy", "round_robin"])
                .args(["--worker-urls", &engine_url]),
        };
        command
    };
    let serve = |binary: &Path, port: u16| serve_with(binary, port, &config);
    let port = free_port()?;
    targets.push(start(
        serve(&release.join("switchyard"), port),
        "switchyard",
        port,
    )?);
    if flow_config.is_some() {
        let port = free_port()?;
        targets.push(start(
            serve_with(&release.join("switchyard"), port, &flow_config),
            FLOW,
            port,
        )?);
    }
    if let Some(baseline) = &options.baseline {
        let port = free_port()?;
        targets.push(start(serve(baseline, port), BASELINE, port)?);
    }
    // Processes whose CPU and memory count with a target's: the picker with Envoy.
    let mut also: BTreeMap<String, u32> = BTreeMap::new();
    let mut picker_files = Vec::new();
    let mut _picker = None;
    if options.picker {
        let config = config.as_ref().context(
            "--picker needs the tokenizer (the picker serves the bounded configuration)",
        )?;
        let engine = engine_url.trim_start_matches("http://");
        let (envoy, file) = picker::envoy(root, picker::ENVOY, free_port()?, engine, None)?;
        targets.push(envoy);
        picker_files.push(file);
        let picker_port = free_port()?;
        let picker_config = picker::picker_config(config, picker_port)?;
        let router_port = free_port()?;
        let serving = serve_with(
            &release.join("switchyard"),
            router_port,
            &Some(picker_config.clone()),
        );
        let server = start(serving, "the picker's router", router_port)?;
        picker_files.push(picker_config);
        let pid = server
            .process
            .as_ref()
            .map(Child::id)
            .context("the picker runs")?;
        also.insert(picker::PICKER.to_owned(), pid);
        _picker = Some(server);
        let port = free_port()?;
        let (envoy, file) = picker::envoy(root, picker::PICKER, port, engine, Some(picker_port))?;
        targets.push(envoy);
        picker_files.push(file);
    }
    if options.peers {
        for (peer, version) in PEERS {
            let python = peer_venv(root, peer, version)?;
            let (port, metrics) = (free_port()?, free_port()?);
            let mut command = match *peer {
                "smg" => {
                    let mut c = Command::new(python.with_file_name("smg"));
                    c.arg("launch");
                    c
                }
                "sglang-router" => {
                    let mut c = Command::new(&python);
                    c.args(["-m", "sglang_router.launch_router"]);
                    c
                }
                _ => Command::new(python.with_file_name("vllm-router")),
            };
            command
                .args([
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--policy",
                    "round_robin",
                ])
                .args([
                    "--prometheus-host",
                    "127.0.0.1",
                    "--prometheus-port",
                    &metrics.to_string(),
                ])
                .args([
                    "--log-level",
                    if *peer == "vllm-router" {
                        "warning"
                    } else {
                        "warn"
                    },
                ])
                .args(["--worker-urls", &engine_url]);
            targets.push(start(command, &format!("{peer} {version}"), port)?);
        }
    }
    let mut results: BTreeMap<(&str, u32, String), Vec<Sample>> = BTreeMap::new();
    for (kind, script, path) in LOADS {
        let script = root.join("benches/load").join(script);
        for &concurrency in &options.concurrency {
            for round in 0..options.rounds {
                let order: Vec<&Target> = targets
                    .iter()
                    .cycle()
                    .skip(round)
                    .take(targets.len())
                    .collect();
                for target in order {
                    eprintln!(
                        "==> {kind} c={concurrency} round {}/{}: {}",
                        round + 1,
                        options.rounds,
                        target.name
                    );
                    // A target that cannot serve a load (a peer without the endpoint)
                    // has no row for it; the others are still measured.
                    let with = also.get(&target.name).copied();
                    match measure(target, with, &script, path, concurrency, options.duration) {
                        Ok(sample) => results
                            .entry((kind, concurrency, target.name.clone()))
                            .or_default()
                            .push(sample),
                        Err(e) => eprintln!("{e:#}"),
                    }
                }
            }
        }
    }
    print_report(&targets, &results, &options);
    for file in config.iter().chain(&flow_config).chain(&picker_files) {
        std::fs::remove_file(file)?;
    }
    Ok(())
}

/// The loads measured: a name, the wrk script in `benches/load` and the path it is
/// sent to.
const LOADS: [(&str, &str, &str); 5] = [
    ("JSON", "chat.lua", "/v1/chat/completions"),
    ("JSON, 5 tools", "chat-tools.lua", "/v1/chat/completions"),
    ("SSE", "chat-sse.lua", "/v1/chat/completions"),
    ("completions JSON", "completion.lua", "/v1/completions"),
    ("completions SSE", "completion-sse.lua", "/v1/completions"),
];

fn start(command: Command, name: &str, port: u16) -> anyhow::Result<Target> {
    let mut command = command;
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let target = Target {
        name: name.into(),
        url: format!("http://127.0.0.1:{port}"),
        process: Some(child),
    };
    wait_ready(&target).with_context(|| format!("{name} never answered a chat request"))?;
    Ok(target)
}

/// Sends chats until one succeeds (routers check their workers before serving).
#[allow(
    clippy::disallowed_methods,
    reason = "a bench tool polls a starting process"
)]
fn wait_ready(target: &Target) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let body =
        r#"{"model":"sim-model","messages":[{"role":"user","content":"ready?"}],"max_tokens":1}"#;
    while Instant::now() < deadline {
        let ok = Command::new("curl")
            .args([
                "-sf",
                "-o",
                "/dev/null",
                "-H",
                "content-type: application/json",
                "-d",
                body,
            ])
            .arg(format!("{}/v1/chat/completions", target.url))
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("timed out")
}

/// One wrk run against `target`, its CPU and memory counted with `with`'s.
fn measure(
    target: &Target,
    with: Option<u32>,
    script: &Path,
    path: &str,
    concurrency: u32,
    duration: u64,
) -> anyhow::Result<Sample> {
    let pid = target.process.as_ref().map(Child::id);
    let cpu = |pid: u32| tree_cpu_ticks(pid) + with.map_or(0, tree_cpu_ticks);
    let cpu_before = pid.map(cpu);
    let with_before = with.map(tree_cpu_ticks);
    let output = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{concurrency}"),
            &format!("-d{duration}s"),
            "--latency",
            "-s",
        ])
        .arg(script)
        .arg(format!("{}{path}", target.url))
        .output()
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if text.contains("Non-2xx") || text.contains("Socket errors") {
        bail!("{} answered errors under load:\n{text}", target.name);
    }
    let requests: f64 = field_after(&text, "requests in").context("wrk request count")?;
    let per_request = |ticks: u64| ticks as f64 * 10_000.0 / requests;
    let cpu = pid
        .zip(cpu_before)
        .map(|(pid, before)| per_request(cpu(pid) - before));
    let with_cpu = with
        .zip(with_before)
        .map(|(pid, before)| per_request(tree_cpu_ticks(pid) - before));
    Ok(Sample {
        requests_per_sec: field_after(&text, "Requests/sec:").context("wrk throughput")?,
        p50_us: latency(&text, "50%").context("wrk p50")?,
        p99_us: latency(&text, "99%").context("wrk p99")?,
        cpu_us_per_request: cpu,
        with_cpu_us_per_request: with_cpu,
        rss_mib: pid.map(|p| (tree_rss_kib(p) + with.map_or(0, tree_rss_kib)) as f64 / 1024.0),
    })
}

/// `123 requests in` gives 123; `Requests/sec: 5.0` gives 5.0.
pub(crate) fn field_after(text: &str, marker: &str) -> Option<f64> {
    text.lines().find(|l| l.contains(marker)).and_then(|line| {
        if marker.ends_with(':') {
            line.split(marker).nth(1)?.trim().parse().ok()
        } else {
            line.split(marker).next()?.trim().parse().ok()
        }
    })
}

/// A latency percentile line (`50%  237.00us`) in microseconds.
fn latency(text: &str, percentile: &str) -> Option<f64> {
    let value = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(percentile))?
        .trim();
    let (number, unit) = value.split_at(value.find(|c: char| c.is_ascii_alphabetic())?);
    let number: f64 = number.parse().ok()?;
    Some(match unit {
        "us" => number,
        "ms" => number * 1_000.0,
        "s" => number * 1_000_000.0,
        _ => return None,
    })
}

/// Pids of `pid` and every descendant.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return tree;
    };
    let parents: Vec<(u32, u32)> = entries
        .filter_map(|e| {
            let child: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            let parent = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((child, parent))
        })
        .collect();
    let mut i = 0;
    while i < tree.len() {
        let current = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == current)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    tree
}

/// User plus system CPU time of a process tree, in clock ticks (1/100 s).
fn tree_cpu_ticks(pid: u32) -> u64 {
    process_tree(pid)
        .into_iter()
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

/// Resident memory of a process tree in KiB.
fn tree_rss_kib(pid: u32) -> u64 {
    process_tree(pid).into_iter().filter_map(rss_kib).sum()
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn print_report(
    targets: &[Target],
    results: &BTreeMap<(&str, u32, String), Vec<Sample>>,
    options: &Options,
) {
    println!(
        "\nMedians of {} alternating rounds of {} s per cell; wrk -t1; one simulated engine with delays off; switchyard {}.\n",
        options.rounds,
        options.duration,
        match &options.tokenizer {
            None => "without a tokenizer".to_owned(),
            Some(None) => "with the Qwen3 tokenizer".to_owned(),
            Some(Some(path)) => format!("with the tokenizer {}", path.display()),
        }
    );
    for (kind, _, _) in LOADS {
        for &c in &options.concurrency {
            let stat = |name: &str, f: fn(&Sample) -> Option<f64>| {
                results
                    .get(&(kind, c, name.to_owned()))
                    .map(|s| median(s.iter().filter_map(f)))
            };
            let direct_p50 = stat("direct", |s| Some(s.p50_us)).unwrap_or(f64::NAN);
            let best_peer = targets
                .iter()
                .filter(|t| {
                    ![
                        "direct",
                        "pass-through",
                        "switchyard",
                        BASELINE,
                        FLOW,
                        picker::ENVOY,
                        picker::PICKER,
                    ]
                    .contains(&t.name.as_str())
                })
                .filter_map(|t| stat(&t.name, |s| Some(s.requests_per_sec)))
                .fold(f64::NAN, f64::max);
            println!("{kind}, concurrency {c}\n");
            println!(
                "| target | req/s | p50 | p99 | added p50 | CPU/request | RSS | req/s vs best peer |"
            );
            println!("|---|---|---|---|---|---|---|---|");
            for target in targets {
                let name = target.name.as_str();
                let (Some(rps), Some(p50), Some(p99)) = (
                    stat(name, |s| Some(s.requests_per_sec)),
                    stat(name, |s| Some(s.p50_us)),
                    stat(name, |s| Some(s.p99_us)),
                ) else {
                    continue;
                };
                let cpu = stat(name, |s| s.cpu_us_per_request)
                    .filter(|v| v.is_finite())
                    .map_or("-".into(), |v| format!("{v:.0} us"));
                // The picker's part of Envoy's and its CPU.
                let cpu = match stat(name, |s| s.with_cpu_us_per_request).filter(|v| v.is_finite())
                {
                    Some(with) => format!("{cpu} ({with:.0} us the picker)"),
                    None => cpu,
                };
                let rss = stat(name, |s| s.rss_mib)
                    .filter(|v| v.is_finite())
                    .map_or("-".into(), |v| format!("{v:.1} MiB"));
                let added = if name == "direct" {
                    "-".into()
                } else {
                    format!("{:.0} us", p50 - direct_p50)
                };
                let ratio = if best_peer.is_finite() {
                    format!("{:.2}x", rps / best_peer)
                } else {
                    "-".into()
                };
                println!(
                    "| {name} | {rps:.0} | {p50:.0} us | {p99:.0} us | {added} | {cpu} | {rss} | {ratio} |"
                );
            }
            println!();
        }
    }
}

/// A configuration file for the router with `tokenizer`: one round-robin bucket
/// bounded by prompt length, so every prompt is tokenized.
fn bounded_config(tokenizer: &Path, engine_url: &str, extra: &str) -> anyhow::Result<PathBuf> {
    let file = std::env::temp_dir().join(format!(
        "switchyard-bench-{}{}.yaml",
        std::process::id(),
        if extra.is_empty() { "" } else { "-flow" }
    ));
    let config = format!(
        "models:\n  - id: sim-model\n    tokenizer: {}\n    engines: [{{id: E1, url: '{engine_url}', role: plain}}]\n    buckets:\n      - id: bounded\n        limits: {{max: 1048576}}\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n{extra}",
        serde_json::to_string(&tokenizer.display().to_string())?
    );
    std::fs::write(&file, config)?;
    Ok(file)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The interpreter of a venv holding one peer router (each peer installs clashing
/// console scripts, so each gets its own venv).
fn peer_venv(root: &Path, peer: &str, version: &str) -> anyhow::Result<PathBuf> {
    let dir = root
        .join(".cache/bench")
        .join(format!("venv-{peer}-{version}"));
    let python = dir.join("bin/python");
    if !python.exists() {
        step(
            &format!("create a venv for {peer}"),
            Command::new("python3").args(["-m", "venv"]).arg(&dir),
        )?;
        step(
            &format!("install {peer}=={version}"),
            crate::python::pip_install(&python, &root.join(".cache"))
                .arg(format!("{peer}=={version}")),
        )?;
    }
    Ok(python)
}

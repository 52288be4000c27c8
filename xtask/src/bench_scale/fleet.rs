//! The processes of one fleet size: the simulated engines (one `sim-engine`
//! process), the router in front of them, its configuration file, and the wrk script
//! of the workload.

#![allow(
    clippy::disallowed_methods,
    reason = "a bench tool times process starts and polls them"
)]

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::Options;
use super::scrape::Scrape;
use crate::processes::{Target, json_field, spawn_ready};

/// The model the engines serve.
pub(crate) const MODEL: &str = "sim-model";

/// Longest wait for every engine to be registered and healthy.
const START_LIMIT: Duration = Duration::from_secs(300);

/// The simulated engines of one fleet size.
pub(crate) struct Engines {
    /// Stopped (by pid) when dropped.
    process: Target,
    /// Each engine's HTTP `host:port`.
    pub(crate) addrs: Vec<String>,
    /// How long the process took to print its ready line.
    pub(crate) started_in: Duration,
}

/// Starts `ranks / ranks_per_engine` engines in one process, each rank caching its
/// share of the fleet's synthetic pages a second.
pub(crate) fn start_engines(
    binary: &Path,
    dir: &Path,
    options: &Options,
    ranks: u32,
) -> anyhow::Result<Engines> {
    let per_engine = options.ranks_per_engine;
    if !ranks.is_multiple_of(per_engine) {
        bail!("{ranks} ranks are not a whole number of {per_engine}-rank engines");
    }
    let engines = ranks / per_engine;
    let rate = options.kv_blocks_per_sec / f64::from(ranks);
    let mut command = Command::new(binary);
    command
        .args([
            "sim-engine",
            "--engines",
            &engines.to_string(),
            "--port",
            "0",
        ])
        .args(["--dp-size", &per_engine.to_string()])
        .args(["--model", MODEL, "--tokenizer"])
        .arg(&options.tokenizer)
        .args([
            "--prefill-tokens-per-sec",
            "0",
            "--decode-tokens-per-sec",
            "0",
        ])
        .args(["--max-running-requests", "1024", "--output-tokens", "8"])
        .args(["--kv-capacity-tokens", &(options.kv_pages * 16).to_string()])
        .args(["--synthetic-kv-blocks-per-sec", &rate.to_string()])
        .env("RUST_LOG", "warn");
    // One rank an engine binds any free port; more need consecutive bases.
    if per_engine == 1 {
        command.args(["--kv-port", "0", "--load-port", "0"]);
    } else {
        let block = free_block(2 * ranks)?;
        command.args(["--kv-port", &block.to_string()]);
        command.args(["--load-port", &(block + ranks as u16).to_string()]);
    }
    let log = File::create(dir.join(format!("engines-{ranks}.log")))?;
    let started = Instant::now();
    let (child, ready) = spawn_ready(command, Stdio::from(log)).context("starting the engines")?;
    let started_in = started.elapsed();
    let process = Target {
        name: format!("{engines} engines"),
        url: String::new(),
        process: Some(child),
    };
    let addrs = ready["engines"]
        .as_array()
        .context("no engines in the ready line")?
        .iter()
        .map(|ports| json_field(ports, &["http"]))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Engines {
        process,
        addrs,
        started_in,
    })
}

/// The first of `n` consecutive free local ports.
fn free_block(n: u32) -> anyhow::Result<u16> {
    for _ in 0..50 {
        let first = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let Some(last) = first.checked_add(n as u16) else {
            continue;
        };
        let held: Result<Vec<_>, _> = (first..last)
            .map(|port| TcpListener::bind(("127.0.0.1", port)))
            .collect();
        if held.is_ok() {
            return Ok(first);
        }
    }
    bail!("no {n} consecutive free ports")
}

/// Writes the router's configuration: every engine, `cache_aware` with the model's
/// tokenizer.
pub(crate) fn write_config(
    file: &Path,
    engines: &Engines,
    options: &Options,
) -> anyhow::Result<()> {
    let configured: Vec<serde_json::Value> = engines
        .addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            serde_json::json!({"id": format!("E{i:04}"), "url": format!("http://{addr}"), "role": "plain"})
        })
        .collect();
    let config = serde_json::json!({
        "listen": "127.0.0.1:0",
        "models": [{
            "id": MODEL,
            "tokenizer": options.tokenizer,
            "block_size": 16,
            "engines": configured,
            "policies": {"plain": {"type": "cache_aware"}},
        }],
    });
    std::fs::write(file, config.to_string()).with_context(|| format!("writing {}", file.display()))
}

/// The router: its process and address, and how long it took from its start until
/// every engine was registered and healthy.
pub(crate) struct Router {
    /// Stopped (by pid) when dropped.
    process: Target,
    pub(crate) addr: String,
    pub(crate) ready_in: Duration,
}

impl Router {
    pub(crate) fn pid(&self) -> u32 {
        pid(&self.process)
    }
}

impl Engines {
    pub(crate) fn pid(&self) -> u32 {
        pid(&self.process)
    }
}

fn pid(target: &Target) -> u32 {
    target.process.as_ref().map_or(0, std::process::Child::id)
}

/// Starts the router on `config` and waits until every one of `engines` engines is
/// registered and healthy (`switchyard_engine_healthy` 1 for each).
pub(crate) async fn start_router(
    binary: &Path,
    config: &Path,
    dir: &Path,
    engines: usize,
) -> anyhow::Result<Router> {
    let mut serve = Command::new(binary);
    serve
        .args(["serve", "--config-settle-ms", "10", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn");
    let log = File::create(dir.join(format!("router-{engines}.log")))?;
    let started = Instant::now();
    let (child, ready) = spawn_ready(serve, Stdio::from(log)).context("starting the router")?;
    let addr = json_field(&ready, &["addr"])?;
    let process = Target {
        name: "router".into(),
        url: addr.clone(),
        process: Some(child),
    };
    loop {
        if let Ok(scrape) = Scrape::take(&addr).await {
            let healthy = scrape
                .samples("switchyard_engine_healthy", &[])
                .filter(|(_, v)| *v == 1.0)
                .count();
            if healthy == engines {
                break;
            }
        }
        if started.elapsed() > START_LIMIT {
            bail!("not every engine was healthy within {START_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Router {
        process,
        addr,
        ready_in: started.elapsed(),
    })
}

/// Writes the wrk script of the workload: chats of one of `groups` shared prefixes
/// of about 1 KiB (170 words) and a unique question, 8 output tokens.
pub(crate) fn write_script(dir: &Path, groups: u32) -> anyhow::Result<PathBuf> {
    let file = dir.join("scale.lua");
    let script = format!(
        r#"-- wrk script of cargo xtask bench-scale: shared prefixes, unique questions.
math.randomseed(42)
local groups = {{}}
for g = 1, {groups} do
  local words = {{}}
  for w = 1, 170 do words[w] = "w" .. ((g * 7919 + w * 104729) % 100000) end
  groups[g] = table.concat(words, " ")
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local g = math.random(1, {groups})
  local body = '{{"model":"{MODEL}","max_tokens":8,"messages":[{{"role":"user","content":"' .. groups[g] .. ' question ' .. math.random(1, 1000000000) .. '"}}]}}'
  return wrk.format(nil, nil, nil, body)
end
"#
    );
    std::fs::write(&file, script)?;
    Ok(file)
}

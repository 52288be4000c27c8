//! `cargo xtask soak --minutes N --connections C`: the release router under mixed
//! traffic for N minutes while faults come and go, then checks that it served only
//! what the faults explain, released every engine slot and did not grow.
//!
//! Six simulated engines (`switchyard sim-engine` with KV-event, replay and load
//! feeds) serve one model through `cache_aware` routing with the byte tokenizer. E0 to
//! E3 are configured; E4 and E5 are added and removed in turn through the admin API
//! every 20 s. E1 to E4 cycle through faults every 15 s (`schedule.rs`); E0 and E5
//! never get one. C client connections (`load.rs`) send JSON chats (40 %), SSE
//! streams (40 %) and streams they abandon after one to three events (20 %).
//!
//! What each fault may produce, and so what passes:
//! - 500s (`error_rate`): 502 `upstream_error` (the router never relays an engine's
//!   5xx; a 500 is always its own `internal_error`, so a 500 fails the run);
//! - hangs (`hang_before_first_byte`): 504 `upstream_timeout` after the configured
//!   first-byte timeout;
//! - mid-stream disconnects: a 200 stream cut before `[DONE]`, only on a faulty
//!   engine (a cut on a clean engine or of a JSON answer fails); when the engine cuts
//!   right after its head, the router may close the client's connection before its
//!   200 head is flushed, so a stream closed before any status counts as this fault
//!   too (a JSON request closed so fails);
//! - health flaps, breakers and engines leaving: 503 when no engine is routable;
//! - KV publisher restarts and event gaps: nothing a client sees.
//!
//! Any other status, a connection the client could not open or that broke before a
//! status, or a request unanswered after 30 s fails. After the load stops and the
//! faults are cleared, every engine's `switchyard_engine_in_flight` must drain to 0,
//! the router's RSS (VmRSS) must stay within 1.1 times its RSS at minute 2, and the
//! router must be alive with no panic in its log. Each minute prints the router's
//! RSS, prefix-index size, thread count, in-flight total and status counts. Logs and
//! the configuration are left in `<target>/soak`. `--no-faults` runs the same load
//! without faults or engine changes (to tell a fault's effect from the load's).

mod hostile;
pub(crate) mod http;
mod load;
mod report;
mod schedule;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::{Instant, sleep, sleep_until};

use crate::processes::{
    Target, json_field, release_switchyard, rss_kib, spawn_ready, status_field,
};
use load::{Load, Tally};
use report::{Report, by_status, verdict};
use schedule::{Engine, Fleet};

/// Engines of the soak, all plain: `(id, faulty, floating)`.
const ENGINES: &[(&str, bool, bool)] = &[
    ("E0", false, false),
    ("E1", true, false),
    ("E2", true, false),
    ("E3", true, false),
    ("E4", true, true),
    ("E5", false, true),
];

/// The most the router's RSS may grow over its RSS at minute 2.
const RSS_GROWTH: f64 = 1.1;

/// How long in-flight requests get to drain once the load stopped.
const DRAIN: Duration = Duration::from_secs(30);

struct Options {
    minutes: u32,
    connections: u64,
    /// Whether faults toggle and engines join and leave.
    faults: bool,
    /// Hostile clients beside the load.
    hostile: u64,
}

fn options(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        minutes: 10,
        connections: 256,
        faults: true,
        hostile: 1,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--minutes" => options.minutes = value()?.parse()?,
            "--connections" => options.connections = value()?.parse()?,
            "--no-faults" => options.faults = false,
            "--hostile" => options.hostile = value()?.parse()?,
            other => bail!("unknown option {other}"),
        }
    }
    if options.minutes == 0 || options.connections == 0 {
        bail!("--minutes and --connections must be at least 1");
    }
    Ok(options)
}

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = options(args)?;
    let (binary, dir) = release_switchyard("soak")?;
    let tokenizer = root.join("testdata/tokenizer-bytes/tokenizer.json");
    let mut processes = Vec::new();
    let mut engines = Vec::new();
    for (seed, &(id, faulty, floating)) in ENGINES.iter().enumerate() {
        let (target, addr) = start_engine(&binary, &tokenizer, &dir, id, seed)?;
        processes.push(target);
        engines.push(Engine {
            id: id.into(),
            addr,
            faulty,
            floating,
        });
    }
    let token = admin_token();
    let config = dir.join("router.yaml");
    std::fs::write(
        &config,
        router_config(&engines, &tokenizer, &token).to_string(),
    )?;
    let mut serve = Command::new(&binary);
    serve
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn");
    let log = dir.join("router.log");
    let (child, ready) =
        spawn_ready(serve, Stdio::from(File::create(&log)?)).context("starting the router")?;
    let router_pid = child.id();
    let router = Target {
        name: "router".into(),
        url: json_field(&ready, &["addr"])?,
        process: Some(child),
    };
    eprintln!(
        "==> soak: {} min, {} connections, router {} (pid {router_pid}), logs in {}",
        options.minutes,
        options.connections,
        router.url,
        dir.display()
    );
    let fleet = Arc::new(Fleet {
        router: router.url.clone(),
        token,
        engines,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        tokio::select! {
            report = soak(&options, &fleet, router_pid) => report,
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        }
    })?;
    drop(runtime);
    let panicked = [log.clone()]
        .into_iter()
        .chain(ENGINES.iter().map(|(id, ..)| engine_log(&dir, id)))
        .filter(|path| std::fs::read_to_string(path).is_ok_and(|text| text.contains("panicked")))
        .collect::<Vec<PathBuf>>();
    drop(router);
    drop(processes);
    verdict(&report, &panicked)
}

/// A fresh admin token: two 64-bit keys std draws from the OS for its hash maps.
fn admin_token() -> String {
    let key = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    format!("soak-{:016x}{:016x}", key(), key())
}

fn engine_log(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("engine-{id}.log"))
}

/// Starts one simulated engine; returns it and its HTTP `host:port`.
fn start_engine(
    binary: &Path,
    tokenizer: &Path,
    dir: &Path,
    id: &str,
    seed: usize,
) -> anyhow::Result<(Target, String)> {
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
        .args(["--load-port", "0", "--model", load::MODEL, "--tokenizer"])
        .arg(tokenizer)
        .args([
            "--prefill-tokens-per-sec",
            "200000",
            "--decode-tokens-per-sec",
            "2000",
        ])
        .args(["--max-running-requests", "256", "--seed", &seed.to_string()])
        .args(["--error-on", hostile::POISON])
        .env("RUST_LOG", "warn");
    let (child, ready) = spawn_ready(command, Stdio::from(File::create(engine_log(dir, id))?))
        .with_context(|| format!("starting engine {id}"))?;
    let addr = json_field(&ready, &["ports", "http"])?;
    Ok((
        Target {
            name: id.into(),
            url: format!("http://{addr}"),
            process: Some(child),
        },
        addr,
    ))
}

/// The router's configuration: the non-floating engines, cache-aware routing, and
/// timeouts and health settings short enough that hangs and flaps resolve within a
/// fault phase.
fn router_config(engines: &[Engine], tokenizer: &Path, token: &str) -> serde_json::Value {
    let configured: Vec<serde_json::Value> = engines
        .iter()
        .filter(|e| !e.floating)
        .map(|e| serde_json::json!({"id": e.id, "url": format!("http://{}", e.addr), "role": "plain"}))
        .collect();
    serde_json::json!({
        "listen": "127.0.0.1:0",
        "models": [{
            "id": load::MODEL,
            "tokenizer": tokenizer,
            "block_size": 16,
            "engines": configured,
            "policies": {"plain": {"type": "cache_aware", "min_matched_tokens": 256}},
        }],
        "timeouts": {"connect_ms": 1000, "first_byte_ms": 3000, "idle_ms": 5000},
        "health": {
            "interval_ms": 500, "timeout_ms": 1000, "failure_threshold": 2,
            "success_threshold": 2, "breaker_failures": 5, "breaker_cooldown_ms": 2000,
        },
        "admin": {"token": token},
        "shutdown_grace_ms": 5000,
    })
}

async fn soak(options: &Options, fleet: &Arc<Fleet>, router_pid: u32) -> anyhow::Result<Report> {
    wait_ready(&fleet.router).await?;
    let load = Arc::new(Load {
        router: fleet.router.clone(),
        clean: fleet
            .engines
            .iter()
            .filter(|e| !e.faulty)
            .map(|e| e.id.clone())
            .collect(),
        stop: false.into(),
        tally: Tally::default(),
    });
    let tally = Arc::new(Tally::default());
    let schedule = options
        .faults
        .then(|| tokio::spawn(schedule::run(Arc::clone(fleet), Arc::clone(&tally))));
    let mut clients = load::start(&load, options.connections);
    let mut hostile = hostile::start(&load, options.hostile);
    let ejected = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let watch = tokio::spawn(watch_breakers(
        fleet.router.clone(),
        load.clean.clone(),
        Arc::clone(&ejected),
    ));
    let started = Instant::now();
    let mut rss = Vec::new();
    for minute in 1..=options.minutes {
        sleep_until(started + Duration::from_secs(60) * minute).await;
        let Some(kib) = rss_kib(router_pid) else {
            bail!("the router (pid {router_pid}) exited during minute {minute}");
        };
        rss.push(kib);
        let in_flight: i64 = in_flight(&fleet.router).await.values().sum();
        let index: f64 = samples(&fleet.router, "switchyard_prefix_index_bytes{")
            .await
            .iter()
            .map(|(_, bytes)| bytes)
            .sum();
        let threads = status_field(router_pid, "Threads:").unwrap_or_default();
        println!(
            "minute {minute:>3}: RSS {:>6.1} MiB (prefix index {:>5.1} MiB, {threads} threads), in flight {in_flight:>4}, {}",
            kib as f64 / 1024.0,
            index / f64::from(1 << 20),
            by_status(&load.tally.snapshot())
        );
    }
    if let Some(schedule) = schedule {
        schedule.abort();
        schedule::clear_faults(fleet, &tally).await;
    }
    load.stop.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(40);
    while tokio::time::timeout_at(deadline, clients.join_next())
        .await
        .is_ok_and(|next| next.is_some())
    {}
    while tokio::time::timeout_at(deadline, hostile.join_next())
        .await
        .is_ok_and(|next| next.is_some())
    {}
    let stuck_clients = clients.len() + hostile.len();
    clients.abort_all();
    hostile.abort_all();
    watch.abort();
    let drain_started = Instant::now();
    let mut drained_in = None;
    let mut counts = in_flight(&fleet.router).await;
    while drain_started.elapsed() < DRAIN {
        if !counts.is_empty() && counts.values().all(|&n| n == 0) {
            drained_in = Some(drain_started.elapsed());
            break;
        }
        sleep(Duration::from_millis(200)).await;
        counts = in_flight(&fleet.router).await;
    }
    let mut outcomes = load.tally.snapshot();
    outcomes.extend(tally.snapshot());
    Ok(Report {
        minutes: options.minutes,
        rss,
        final_rss: rss_kib(router_pid),
        outcomes,
        stuck_clients,
        in_flight: counts,
        drained_in,
        ejected_clean: std::mem::take(
            &mut ejected
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ),
    })
}

/// Reads every engine's breaker twice a second, noting each clean engine (one no
/// fault is injected into) ever seen held out by its breaker.
async fn watch_breakers(
    router: String,
    clean: BTreeSet<String>,
    ejected: Arc<std::sync::Mutex<BTreeSet<String>>>,
) {
    loop {
        for (labels, open) in samples(&router, "switchyard_engine_breaker_open{engine=\"").await {
            let engine = labels.trim_end_matches("\"}");
            if open > 0.0 && clean.contains(engine) {
                ejected
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(engine.to_owned());
            }
        }
        sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the router's `/ready` answers 200.
async fn wait_ready(router: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if http::call(router, "GET", "/ready", &[], b"")
            .await
            .is_ok_and(|(status, _)| status == 200)
        {
            return Ok(());
        }
        sleep(Duration::from_millis(100)).await;
    }
    bail!("the router never became ready")
}

/// `switchyard_engine_in_flight` of every engine on the router's `/metrics`.
async fn in_flight(router: &str) -> BTreeMap<String, i64> {
    samples(router, "switchyard_engine_in_flight{engine=\"")
        .await
        .into_iter()
        .filter_map(|(labels, value)| Some((labels.strip_suffix("\"}")?.to_owned(), value as i64)))
        .collect()
}

/// The samples on the router's `/metrics` whose line starts with `prefix`: the rest
/// of the name and labels, and the value.
async fn samples(router: &str, prefix: &str) -> Vec<(String, f64)> {
    let Ok((200, body)) = http::call(router, "GET", "/metrics", &[], b"").await else {
        return Vec::new();
    };
    String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|line| {
            let (labels, value) = line.strip_prefix(prefix)?.rsplit_once(' ')?;
            Some((labels.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

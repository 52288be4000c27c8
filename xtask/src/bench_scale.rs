//! `cargo xtask bench-scale`: one release router in front of fleets of simulated
//! engine ranks (8, 64, 256 and 1,024 by default), each rank publishing synthetic KV
//! events (the fleet's `--kv-blocks-per-sec` shared out) and its load reports, with
//! chat traffic through the router; prints per fleet size what grows with the fleet.
//!
//! Every fleet is one `switchyard sim-engine --engines N` process (delays off, the
//! byte tokenizer of `testdata/tokenizer-bytes`, caches of `--kv-pages` pages a
//! rank), and the router a `cache_aware` model over every engine with the same
//! tokenizer. wrk (one thread, `--concurrency` connections) sends chats of one of
//! `--groups` shared prefixes of about 1 KiB and a unique question, 8 output tokens,
//! for 3 s of warm-up, then `--duration` seconds measured. Over the measured window:
//! the router's CPU per request (`/proc/PID/stat`) and its throughput, the engines'
//! process CPU, `switchyard_selection_seconds` quantiles, KV-event batches applied a
//! second and every engine's `switchyard_engine_kv_feed_age_seconds` sampled at each
//! scrape, `/metrics` size and scrape time (`--scrapes` scrapes spread over the
//! window), health probes per engine a second (the engines' own counts). Before the
//! traffic, `--idle` seconds without it (scraped at the same pace) give the router's
//! idle CPU: the fleet's own cost (feeds, probes, scrapes), reported in cores and
//! taken off the CPU per request for its figure net of idle. Then: RSS
//! (VmRSS) and `switchyard_prefix_index_bytes`, the time from the router's start
//! until every engine was healthy, and a SIGHUP reload of the same file until
//! `switchyard_config_reloads_total{outcome="applied"}` counts it (the file settles
//! for 10 ms first).
//!
//! Options: `--ranks 8,64,256,1024`, `--ranks-per-engine 1`, `--kv-blocks-per-sec
//! 20000`, `--duration 20`, `--concurrency 32`, `--groups 256`, `--kv-pages 4096`,
//! `--scrapes 10`, `--idle 10` (0: no idle window), `--binary PATH` (this switchyard binary, not built),
//! `--tokenizer PATH`. Every process it starts is stopped by pid, also on error.

#![allow(
    clippy::disallowed_methods,
    reason = "a bench tool measures wall-clock windows"
)]

mod fleet;
mod scrape;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::bench_e2e::field_after;
use crate::processes::{release_switchyard, rss_kib, target_dir};
use fleet::{Engines, Router, start_engines, start_router, write_config, write_script};
use scrape::{Scrape, health_probes, percentile, quantile};

/// The bench's settings.
pub(crate) struct Options {
    ranks: Vec<u32>,
    ranks_per_engine: u32,
    kv_blocks_per_sec: f64,
    duration: u64,
    concurrency: u32,
    groups: u32,
    kv_pages: u64,
    scrapes: u32,
    idle: u64,
    binary: Option<PathBuf>,
    tokenizer: PathBuf,
}

fn options(root: &Path, args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        ranks: vec![8, 64, 256, 1024],
        ranks_per_engine: 1,
        kv_blocks_per_sec: 20_000.0,
        duration: 20,
        concurrency: 32,
        groups: 256,
        kv_pages: 4096,
        scrapes: 10,
        idle: 10,
        binary: None,
        tokenizer: root.join("testdata/tokenizer-bytes/tokenizer.json"),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--ranks" => {
                options.ranks = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--ranks-per-engine" => options.ranks_per_engine = value()?.parse()?,
            "--kv-blocks-per-sec" => options.kv_blocks_per_sec = value()?.parse()?,
            "--duration" => options.duration = value()?.parse()?,
            "--concurrency" => options.concurrency = value()?.parse()?,
            "--groups" => options.groups = value()?.parse()?,
            "--kv-pages" => options.kv_pages = value()?.parse()?,
            "--scrapes" => options.scrapes = value()?.parse()?,
            "--idle" => options.idle = value()?.parse()?,
            "--binary" => options.binary = Some(value()?.into()),
            "--tokenizer" => options.tokenizer = value()?.into(),
            other => bail!("unknown option {other}"),
        }
    }
    if options.ranks.contains(&0)
        || !(1..=64).contains(&options.ranks_per_engine)
        || options.duration == 0
        || options.concurrency == 0
        || options.groups == 0
        || options.scrapes == 0
    {
        bail!(
            "--ranks, --ranks-per-engine (1 to 64), --duration, --concurrency, --groups and --scrapes must be at least 1"
        );
    }
    Ok(options)
}

/// What one fleet size measured.
struct Figures {
    ranks: u32,
    engines: usize,
    requests_per_sec: f64,
    errors: u64,
    cpu_us_per_request: f64,
    /// The router's CPU with no traffic, in cores (`None` without an idle window).
    idle_cores: Option<f64>,
    /// `cpu_us_per_request` less the idle CPU over the same window.
    net_us_per_request: Option<f64>,
    engines_cpu_cores: f64,
    selection_p50: Option<f64>,
    selection_p99: Option<f64>,
    applied_per_sec: f64,
    feed_age_p50: f64,
    feed_age_p99: f64,
    feed_age_max: f64,
    rss_mib: f64,
    index_mib: f64,
    metrics_kib: f64,
    scrape_median: Duration,
    scrape_max: Duration,
    engines_started_in: Duration,
    ready_in: Duration,
    reload_in: Duration,
    probes_per_engine_per_sec: f64,
}

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = options(root, args)?;
    let (binary, dir) = match &options.binary {
        None => release_switchyard("bench-scale")?,
        Some(binary) => {
            let dir = target_dir()?.join("bench-scale");
            std::fs::create_dir_all(&dir)?;
            (binary.clone(), dir)
        }
    };
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is needed (Debian: apt-get install wrk)");
    }
    let script = write_script(&dir, options.groups)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut all = Vec::new();
    for &ranks in &options.ranks {
        eprintln!("==> {ranks} ranks");
        let figures = runtime
            .block_on(measure(&binary, &dir, &script, &options, ranks))
            .with_context(|| format!("at {ranks} ranks"))?;
        print_row(&figures, all.first());
        all.push(figures);
    }
    print_report(&options, &all);
    Ok(())
}

/// Starts a fleet of `ranks` ranks and its router, drives the workload, measures, and
/// stops both (on error too: they are stopped when dropped).
async fn measure(
    binary: &Path,
    dir: &Path,
    script: &Path,
    options: &Options,
    ranks: u32,
) -> anyhow::Result<Figures> {
    let engines: Engines = start_engines(binary, dir, options, ranks)?;
    let config = dir.join(format!("router-{ranks}.json"));
    write_config(&config, &engines, options)?;
    let router: Router = start_router(binary, &config, dir, engines.addrs.len()).await?;
    let engines_pid = engines.pid();
    let url = format!("http://{}/v1/chat/completions", router.addr);
    wrk(script, &url, options.concurrency, 3)?.wait()?;
    let every = Duration::from_secs(options.duration) / (options.scrapes + 1);
    let idle_cores = idle_cpu(&router, options.idle, every).await?;

    let probes_before = (health_probes(&engines.addrs).await?, Instant::now());
    let before = Scrape::take(&router.addr).await?;
    let cpu_before = (cpu_ticks(router.pid())?, cpu_ticks(engines_pid)?);
    let started = Instant::now();
    let load = wrk(script, &url, options.concurrency, options.duration)?;
    let mut scrapes = Vec::new();
    let mut ages = Vec::new();
    while scrapes.len() < options.scrapes as usize {
        tokio::time::sleep(every).await;
        let scrape = Scrape::take(&router.addr).await?;
        ages.extend(
            scrape
                .samples("switchyard_engine_kv_feed_age_seconds", &[])
                .map(|(_, v)| v),
        );
        scrapes.push((scrape.text.len(), scrape.took));
    }
    let output = load.wait_with_output()?;
    let window = started.elapsed().as_secs_f64();
    let cpu_after = (cpu_ticks(router.pid())?, cpu_ticks(engines_pid)?);
    let after = Scrape::take(&router.addr).await?;
    let probes_after = (health_probes(&engines.addrs).await?, Instant::now());

    let text = String::from_utf8_lossy(&output.stdout);
    let requests: f64 = field_after(&text, "requests in").context("wrk request count")?;
    let errors = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let counter = |s: &Scrape, name: &str, labels: &[&str]| s.sum(name, labels);
    let selection = |q| {
        quantile(
            &before.buckets("switchyard_selection_seconds", &[]),
            &after.buckets("switchyard_selection_seconds", &[]),
            q,
        )
    };
    let applied = counter(
        &after,
        "switchyard_kv_feed_events_total",
        &["event=\"applied\""],
    ) - counter(
        &before,
        "switchyard_kv_feed_events_total",
        &["event=\"applied\""],
    );
    let reload_in = reload(&router, &config).await?;
    let mut took: Vec<f64> = scrapes.iter().map(|(_, t)| t.as_secs_f64()).collect();
    took.sort_by(f64::total_cmp);
    let cpu_us_per_request = (cpu_after.0 - cpu_before.0) as f64 * 10_000.0 / requests;
    let figures = Figures {
        ranks,
        engines: engines.addrs.len(),
        requests_per_sec: field_after(&text, "Requests/sec:").context("wrk throughput")?,
        errors,
        cpu_us_per_request,
        idle_cores,
        net_us_per_request: idle_cores
            .map(|cores| cpu_us_per_request - cores * window * 1e6 / requests),
        engines_cpu_cores: (cpu_after.1 - cpu_before.1) as f64 / 100.0 / window,
        selection_p50: selection(0.5),
        selection_p99: selection(0.99),
        applied_per_sec: applied / window,
        feed_age_p50: percentile(&ages, 0.5),
        feed_age_p99: percentile(&ages, 0.99),
        feed_age_max: percentile(&ages, 1.0),
        rss_mib: rss_kib(router.pid()).unwrap_or(0) as f64 / 1024.0,
        index_mib: after.sum("switchyard_prefix_index_bytes", &[]) / (1024.0 * 1024.0),
        metrics_kib: scrapes.iter().map(|(n, _)| *n).max().unwrap_or(0) as f64 / 1024.0,
        scrape_median: Duration::from_secs_f64(percentile(&took, 0.5)),
        scrape_max: Duration::from_secs_f64(percentile(&took, 1.0)),
        engines_started_in: engines.started_in,
        ready_in: router.ready_in,
        reload_in,
        probes_per_engine_per_sec: (probes_after.0 - probes_before.0) as f64
            / engines.addrs.len() as f64
            / probes_after.1.duration_since(probes_before.1).as_secs_f64(),
    };
    drop(router);
    drop(engines);
    Ok(figures)
}

/// The router's CPU in cores over `seconds` without traffic, scraped every `every` as
/// during the measured window; `None` for 0 seconds.
async fn idle_cpu(router: &Router, seconds: u64, every: Duration) -> anyhow::Result<Option<f64>> {
    if seconds == 0 {
        return Ok(None);
    }
    let window = Duration::from_secs(seconds);
    let before = cpu_ticks(router.pid())?;
    let started = Instant::now();
    while started.elapsed() + every <= window {
        tokio::time::sleep(every).await;
        Scrape::take(&router.addr).await?;
    }
    tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
    let ticks = cpu_ticks(router.pid())? - before;
    Ok(Some(ticks as f64 / 100.0 / started.elapsed().as_secs_f64()))
}

/// Starts wrk against `url` for `seconds`.
fn wrk(
    script: &Path,
    url: &str,
    concurrency: u32,
    seconds: u64,
) -> anyhow::Result<std::process::Child> {
    Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{concurrency}"),
            &format!("-d{seconds}s"),
            "-s",
        ])
        .arg(script)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting wrk")
}

/// User plus system CPU time of one process, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        Ok(fields.get(i).context("short /proc stat")?.parse()?)
    };
    Ok(field(11)? + field(12)?)
}

/// Rewrites the router's file unchanged, sends SIGHUP, and waits until the reload is
/// counted applied; returns how long that took.
async fn reload(router: &Router, config: &Path) -> anyhow::Result<Duration> {
    let applied = |s: &Scrape| s.sum("switchyard_config_reloads_total", &["outcome=\"applied\""]);
    let before = applied(&Scrape::take(&router.addr).await?);
    std::fs::write(config, std::fs::read(config)?)?;
    let started = Instant::now();
    let status = Command::new("kill")
        .args(["-HUP", &router.pid().to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -HUP {} failed", router.pid());
    }
    loop {
        let scrape = Scrape::take(&router.addr).await?;
        if applied(&scrape) > before {
            return Ok(started.elapsed());
        }
        let failed = scrape.sum("switchyard_config_reloads_total", &[]) - applied(&scrape);
        if failed > 0.0 {
            bail!("the reload was not applied (see the router's log)");
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the reload was not applied within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn us(seconds: Option<f64>) -> String {
    seconds.map_or("-".into(), |s| format!("<= {:.0} us", s * 1e6))
}

/// One fleet size's figures as they come, on stderr.
fn print_row(f: &Figures, first: Option<&Figures>) {
    let ratio = first.map_or(1.0, |b| f.cpu_us_per_request / b.cpu_us_per_request);
    eprintln!(
        "    {} ranks: {:.0} req/s, {:.0} us CPU/request ({ratio:.2}x; net of idle {}), selection p50 {} p99 {}, {:.0} batches/s applied, feed age p99 {:.1} ms, RSS {:.0} MiB, /metrics {:.0} KiB in {}, ready in {}, reload {}, {:.2} probes/engine/s",
        f.ranks,
        f.requests_per_sec,
        f.cpu_us_per_request,
        net(f),
        us(f.selection_p50),
        us(f.selection_p99),
        f.applied_per_sec,
        f.feed_age_p99 * 1e3,
        f.rss_mib,
        f.metrics_kib,
        ms(f.scrape_median),
        ms(f.ready_in),
        ms(f.reload_in),
        f.probes_per_engine_per_sec
    );
}

/// The CPU per request net of idle, with the idle cores, or `-`.
fn net(f: &Figures) -> String {
    match (f.net_us_per_request, f.idle_cores) {
        (Some(net), Some(idle)) => format!("{net:.0} us, idle {idle:.2} cores"),
        _ => "-".into(),
    }
}

fn print_report(options: &Options, all: &[Figures]) {
    println!(
        "\nOne router, {} s measured per fleet (3 s warm-up), wrk -t1 -c{}, {} prefix groups; {} rank(s) an engine; {:.0} synthetic stored blocks/s across each fleet; caches of {} pages a rank.\n",
        options.duration,
        options.concurrency,
        options.groups,
        options.ranks_per_engine,
        options.kv_blocks_per_sec,
        options.kv_pages
    );
    println!(
        "| ranks (engines) | req/s | errors | router CPU/request | vs first | net of idle (idle cores) | net vs first | engines' CPU | selection p50 / p99 | KV batches applied/s | feed age p50 / p99 / max | RSS | index | /metrics | scrape median / max | engines up | router ready | reload | probes/engine/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let first = all.first().map_or(f64::NAN, |f| f.cpu_us_per_request);
    let first_net = all
        .first()
        .and_then(|f| f.net_us_per_request)
        .unwrap_or(f64::NAN);
    for f in all {
        let net_ratio = f
            .net_us_per_request
            .map_or("-".into(), |n| format!("{:.2}x", n / first_net));
        println!(
            "| {} ({}) | {:.0} | {} | {:.0} us | {:.2}x | {} | {net_ratio} | {:.2} cores | {} / {} | {:.0} | {:.1} / {:.1} / {:.1} ms | {:.0} MiB | {:.1} MiB | {:.0} KiB | {} / {} | {} | {} | {} | {:.2} |",
            f.ranks,
            f.engines,
            f.requests_per_sec,
            f.errors,
            f.cpu_us_per_request,
            f.cpu_us_per_request / first,
            net(f),
            f.engines_cpu_cores,
            us(f.selection_p50),
            us(f.selection_p99),
            f.applied_per_sec,
            f.feed_age_p50 * 1e3,
            f.feed_age_p99 * 1e3,
            f.feed_age_max * 1e3,
            f.rss_mib,
            f.index_mib,
            f.metrics_kib,
            ms(f.scrape_median),
            ms(f.scrape_max),
            ms(f.engines_started_in),
            ms(f.ready_in),
            ms(f.reload_in),
            f.probes_per_engine_per_sec
        );
    }
}

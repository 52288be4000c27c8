//! `cargo xtask routing-quality --matrix`: the policies on a matrix of workloads,
//! replayed. Every cell varies the base workload (shared-prefix conversations with
//! Zipf popularity, open loop at 85% of round robin's capacity, 8 engines, 65,536
//! tokens of cache each) in one way: the load, a closed loop, the cache size, the
//! engine count, the popularity, or the shape (bursts on new prefixes, agent sessions,
//! long documents with short questions). Each cell replays round robin, power of two
//! and `cache_aware` as configured by default, then `cache_aware` with engines that
//! publish no KV events (its estimate from routing), with pending pages, and with
//! pending pages and no load bound; the report checks the issue's targets per cell,
//! writes the tables as Markdown (with the share of a new prefix's siblings sent
//! where the first went) and plots each policy's TTFT p99 against power of two's.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context as _;
use serde_json::Value;

use super::{Live, TIMING_FLAGS, number, read_summaries, router_config, run_binary, run_live};

/// One workload of the matrix.
struct Cell {
    name: &'static str,
    engines: usize,
    /// Arrival rate as a share of round robin's capacity (open loop), or the rate the
    /// trace is written at (closed loop).
    load: f64,
    cache_tokens: u64,
    /// Clients of a closed loop; `None`: open loop.
    clients: Option<u64>,
    /// `switchyard workload` options besides the fleet's.
    workload: &'static [&'static str],
    /// Also driven live through the release binary (the first requests of its trace).
    live: bool,
}

const BASE: Cell = Cell {
    name: "base: conversations, Zipf, 8 engines, 85%, 64k cache",
    engines: 8,
    load: 0.85,
    cache_tokens: 65_536,
    clients: None,
    workload: &[],
    live: false,
};

/// The cells, each the base changed in one way (the issue's closed loop in two).
const CELLS: &[Cell] = &[
    BASE,
    Cell {
        name: "load 50%",
        load: 0.5,
        ..BASE
    },
    Cell {
        name: "load 100%",
        load: 1.0,
        ..BASE
    },
    Cell {
        name: "load 120%",
        load: 1.2,
        ..BASE
    },
    Cell {
        name: "closed loop: 384 clients (1.5x the slots)",
        clients: Some(384),
        load: 1.0,
        ..BASE
    },
    Cell {
        name: "closed loop: 4 engines, 256 clients, uniform, 32k caches",
        engines: 4,
        load: 1.0,
        cache_tokens: 32_768,
        clients: Some(256),
        workload: &["--popularity", "uniform"],
        live: true,
    },
    Cell {
        name: "cache 2k (below the hottest prefix)",
        cache_tokens: 2_048,
        ..BASE
    },
    Cell {
        name: "cache 1M (above the working set)",
        cache_tokens: 1_048_576,
        ..BASE
    },
    Cell {
        name: "4 engines",
        engines: 4,
        ..BASE
    },
    Cell {
        name: "32 engines",
        engines: 32,
        ..BASE
    },
    Cell {
        name: "uniform popularity",
        workload: &["--popularity", "uniform"],
        ..BASE
    },
    Cell {
        name: "bursts on new prefixes",
        workload: &["--shape", "bursts"],
        live: true,
        ..BASE
    },
    Cell {
        name: "agent sessions",
        workload: &["--shape", "agents"],
        ..BASE
    },
    Cell {
        name: "long documents, short questions",
        workload: &["--shape", "documents"],
        ..BASE
    },
];

/// Slots per engine.
const SLOTS: &str = "32";
/// How long pending pages count in the pending rows.
const PENDING_MS: u64 = 2_000;
/// The pending rows: `cache_aware` as by default, and without its load bound.
const PENDING: &str = "cache_aware, pending 2 s";
const PENDING_UNBOUNDED: &str = "cache_aware, pending 2 s, no load bound";

/// A cell's rows, each a summary labelled with the row's name.
struct Measured {
    cell: &'static Cell,
    rows: Vec<Value>,
    /// The rows of its live run, if it had one.
    live: Vec<Value>,
}

/// What the matrix runs.
pub(super) struct Plan<'a> {
    /// Requests of each cell's trace.
    pub(super) requests: usize,
    /// Requests of a live cell driven live; 0 = none.
    pub(super) live_requests: usize,
    /// The tokenizer of the live fleets.
    pub(super) tokenizer: &'a Path,
    /// Where the Markdown tables go.
    pub(super) markdown: &'a Path,
    /// Where the plot goes.
    pub(super) svg: &'a Path,
}

/// Replays every cell (and drives the live ones) as `plan` says and writes the
/// report.
pub(super) fn run(binary: &Path, dir: &Path, plan: &Plan<'_>) -> anyhow::Result<()> {
    let (requests, markdown, svg) = (plan.requests, plan.markdown, plan.svg);
    let dir = dir.join("matrix");
    std::fs::create_dir_all(&dir)?;
    let mut measured = Vec::new();
    for (i, cell) in CELLS.iter().enumerate() {
        eprintln!("==> matrix {}/{}: {}", i + 1, CELLS.len(), cell.name);
        let cell_dir = dir.join(format!("cell-{i}"));
        let rows = replay_cell(binary, &cell_dir, cell, requests)?;
        let live = if cell.live && plan.live_requests > 0 {
            live_cell(binary, plan, &cell_dir, cell)?
        } else {
            Vec::new()
        };
        measured.push(Measured { cell, rows, live });
    }
    let mut text = String::new();
    for m in &measured {
        writeln!(text, "\n**{}**\n", m.cell.name)?;
        text.push_str(&table(&m.rows));
        for line in targets(m) {
            writeln!(text, "- {line}")?;
        }
        if !m.live.is_empty() {
            writeln!(text, "\nLive, the first {} requests:\n", plan.live_requests)?;
            text.push_str(&table(&m.live));
        }
    }
    print!("{text}");
    std::fs::write(markdown, &text).with_context(|| format!("writing {}", markdown.display()))?;
    std::fs::write(svg, plot(&measured)).with_context(|| format!("writing {}", svg.display()))?;
    eprintln!("==> wrote {} and {}", markdown.display(), svg.display());
    Ok(())
}

fn engine_flags(cell: &Cell) -> Vec<String> {
    let mut flags: Vec<String> = TIMING_FLAGS.iter().map(|f| (*f).to_owned()).collect();
    flags.extend([
        "--slots".to_owned(),
        SLOTS.to_owned(),
        "--kv-capacity-tokens".to_owned(),
        cell.cache_tokens.to_string(),
    ]);
    flags
}

fn replay_cell(
    binary: &Path,
    dir: &Path,
    cell: &Cell,
    requests: usize,
) -> anyhow::Result<Vec<Value>> {
    std::fs::create_dir_all(dir)?;
    let urls: Vec<String> = (0..cell.engines)
        .map(|i| format!("http://127.0.0.1:{}", i + 1))
        .collect();
    let fleet = dir.join("fleet.yaml");
    std::fs::write(&fleet, router_config(&urls, None, None).to_string())?;
    let mut config = router_config(&urls, None, Some("cache_aware"));
    pending(&mut config);
    let pending_fleet = dir.join("fleet-pending.yaml");
    std::fs::write(&pending_fleet, config.to_string())?;
    unbounded(&mut config);
    let unbounded_fleet = dir.join("fleet-pending-unbounded.yaml");
    std::fs::write(&unbounded_fleet, config.to_string())?;

    let flags = engine_flags(cell);
    let trace = dir.join("trace.jsonl");
    run_binary(
        &format!("generate {}", cell.name),
        Command::new(binary)
            .args(["workload", "--out"])
            .arg(&trace)
            .args(["--requests", &requests.to_string(), "--config"])
            .arg(&fleet)
            .args(["--load", &cell.load.to_string()])
            .args(cell.workload)
            .args(&flags)
            .stdout(Stdio::null()),
    )?;
    // The last row keeps its configuration's policy (no load bound): no `--policies`.
    let runs: [(&str, &Path, Option<&str>, &[&str]); 4] = [
        (
            "",
            &fleet,
            Some("round_robin,power_of_two,cache_aware"),
            &[],
        ),
        (
            "cache_aware, no KV events",
            &fleet,
            Some("cache_aware"),
            &["--no-kv-events"],
        ),
        (PENDING, &pending_fleet, Some("cache_aware"), &[]),
        (PENDING_UNBOUNDED, &unbounded_fleet, None, &[]),
    ];
    let mut rows = Vec::new();
    for (n, (label, config, policies, extra)) in runs.into_iter().enumerate() {
        let json = dir.join(format!("replay-{n}.json"));
        let mut command = Command::new(binary);
        command
            .args(["replay", "--trace"])
            .arg(&trace)
            .arg("--config")
            .arg(config)
            .args(policies.map(|p| ["--policies", p]).into_iter().flatten())
            .args(&flags)
            .args(extra)
            .arg("--json")
            .arg(&json)
            .stdout(Stdio::null());
        if let Some(clients) = cell.clients {
            command.args(["--closed-loop", &clients.to_string()]);
        }
        let what = policies.unwrap_or("the configured policy");
        run_binary(
            &format!("replay {}: {what} {label}", cell.name),
            &mut command,
        )?;
        for mut summary in read_summaries(&json)? {
            if !label.is_empty() {
                summary["policy"] = label.into();
            }
            rows.push(summary);
        }
    }
    Ok(rows)
}

/// A change to a live router's configuration.
type Patch = dyn Fn(&mut Value);

/// Pending pages, as in the pending rows.
fn pending(config: &mut Value) {
    config["models"][0]["routed_pages"] = serde_json::json!({"pending_ms": PENDING_MS});
}

/// Pending pages and no load bound.
fn unbounded(config: &mut Value) {
    pending(config);
    config["models"][0]["policies"]["plain"]["load_bound"] = Value::Null;
}

/// Drives the first `plan.live_requests` of the cell's trace through the release
/// router to fresh simulated engines: the three policies, then `cache_aware` with
/// pending pages, bounded and not.
fn live_cell(
    binary: &Path,
    plan: &Plan<'_>,
    dir: &Path,
    cell: &Cell,
) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(dir.join("trace.jsonl"))?;
    let head: String = text
        .lines()
        .take(plan.live_requests)
        .map(|l| format!("{l}\n"))
        .collect();
    let trace = dir.join("trace-live.jsonl");
    std::fs::write(&trace, head)?;
    let runs: [(&str, &str, &Patch); 5] = [
        ("round_robin", "round_robin", &|_| {}),
        ("power_of_two", "power_of_two", &|_| {}),
        ("cache_aware", "cache_aware", &|_| {}),
        (PENDING, "cache_aware", &pending),
        (PENDING_UNBOUNDED, "cache_aware", &unbounded),
    ];
    let mut rows = Vec::new();
    for (label, policy, patch) in runs {
        let live = Live {
            label,
            engines: cell.engines,
            cache_tokens: cell.cache_tokens,
            policy,
            patch,
            clients: cell.clients,
        };
        rows.extend(run_live(binary, plan.tokenizer, dir, &trace, &live)?);
    }
    Ok(rows)
}

/// A cell's rows as a Markdown table.
fn table(rows: &[Value]) -> String {
    let mut text = String::from(
        "| policy | TTFT p50 ms | TTFT p99 ms | req/s | cached | of oracle | load max/min | siblings together |\n|---|---|---|---|---|---|---|---|\n",
    );
    for s in rows {
        let siblings = s["siblings_on_first_engine"]
            .as_f64()
            .map_or("-".to_owned(), |share| format!("{:.0}%", 100.0 * share));
        let _ = writeln!(
            text,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1}% | {:.1}% | {:.2} | {siblings} |",
            s["policy"].as_str().unwrap_or("?"),
            number(s, "ttft_p50_ms"),
            number(s, "ttft_p99_ms"),
            number(s, "requests_per_sec"),
            100.0 * number(s, "cached_share"),
            100.0 * number(s, "of_oracle"),
            number(s, "load_max_over_min"),
        );
    }
    text
}

fn row<'a>(rows: &'a [Value], policy: &str) -> Option<&'a Value> {
    rows.iter().find(|s| s["policy"] == policy)
}

/// The issue's targets for the cell, met or missed.
fn targets(m: &Measured) -> Vec<String> {
    let (Some(rr), Some(p2), Some(ca)) = (
        row(&m.rows, "round_robin"),
        row(&m.rows, "power_of_two"),
        row(&m.rows, "cache_aware"),
    ) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    let mut check = |name: &str, value: f64, bound: f64, at_least: bool| {
        let met = if at_least {
            value >= bound
        } else {
            value <= bound
        };
        lines.push(format!(
            "{name}: {value:.2} ({})",
            if met { "met" } else { "missed" }
        ));
    };
    check(
        "cache_aware TTFT p99 / power_of_two's, at most 1",
        number(ca, "ttft_p99_ms") / number(p2, "ttft_p99_ms"),
        1.0,
        false,
    );
    check(
        "cache_aware TTFT p50 / round_robin's, at most 0.5",
        number(ca, "ttft_p50_ms") / number(rr, "ttft_p50_ms"),
        0.5,
        false,
    );
    check(
        "cache_aware cached tokens / the oracle's, at least 0.85",
        number(ca, "of_oracle"),
        0.85,
        true,
    );
    check(
        "cache_aware load max/min, at most 1.5",
        number(ca, "load_max_over_min"),
        1.5,
        false,
    );
    if let Some(silent) = row(&m.rows, "cache_aware, no KV events")
        && m.cell.clients.is_none()
    {
        check(
            "no KV events: cached share / with events, at least 0.8",
            number(silent, "cached_share") / number(ca, "cached_share"),
            0.8,
            true,
        );
    }
    lines
}

/// Each policy's TTFT p99 as a multiple of power of two's, per cell, on a log scale.
fn plot(measured: &[Measured]) -> String {
    const WIDTH: f64 = 960.0;
    const ROW: f64 = 26.0;
    const LEFT: f64 = 400.0;
    const RIGHT: f64 = 40.0;
    const TOP: f64 = 130.0;
    const COLOURS: &[(&str, &str)] = &[
        ("round_robin", "#d62728"),
        ("cache_aware", "#2ca02c"),
        ("cache_aware, no KV events", "#9467bd"),
        (PENDING, "#ff7f0e"),
        (PENDING_UNBOUNDED, "#8c564b"),
    ];
    let height = TOP + ROW * measured.len() as f64 + 50.0;
    // Multiples from 1/16 to 16, log 2.
    let x = |ratio: f64| {
        let r = ratio.clamp(1.0 / 16.0, 16.0).log2();
        LEFT + (r + 4.0) / 8.0 * (WIDTH - LEFT - RIGHT)
    };
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="20" font-size="14">TTFT p99 as a multiple of power_of_two's, per workload (replayed)</text>"#
    );
    for (i, (name, colour)) in COLOURS.iter().enumerate() {
        let ly = 40.0 + 16.0 * i as f64;
        let _ = write!(
            svg,
            r#"<circle cx="{LEFT}" cy="{ly}" r="5" fill="{colour}"/><text x="{}" y="{}">{name}</text>"#,
            LEFT + 10.0,
            ly + 4.0
        );
    }
    for tick in [-4i32, -2, 0, 2, 4] {
        let ratio = 2f64.powi(tick);
        let tx = x(ratio);
        let label = if tick < 0 {
            format!("1/{}", 2i32.pow(tick.unsigned_abs()))
        } else {
            format!("{}", 2i32.pow(tick.unsigned_abs()))
        };
        let bottom = height - 40.0;
        let _ = write!(
            svg,
            r##"<line x1="{tx}" y1="{TOP}" x2="{tx}" y2="{bottom}" stroke="{}"/><text x="{tx}" y="{}" text-anchor="middle">{label}</text>"##,
            if tick == 0 { "#333" } else { "#ddd" },
            bottom + 16.0
        );
    }
    for (i, m) in measured.iter().enumerate() {
        let y = TOP + ROW * (i as f64 + 0.5);
        let name = m.cell.name;
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LEFT - 10.0,
            y + 4.0,
            escape(name)
        );
        let Some(p2) = row(&m.rows, "power_of_two") else {
            continue;
        };
        for (policy, colour) in COLOURS {
            if let Some(s) = row(&m.rows, policy) {
                let ratio = number(s, "ttft_p99_ms") / number(p2, "ttft_p99_ms");
                if ratio.is_finite() {
                    let _ = write!(
                        svg,
                        r#"<circle cx="{:.1}" cy="{y:.1}" r="5" fill="{colour}" fill-opacity="0.8"/>"#,
                        x(ratio)
                    );
                }
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

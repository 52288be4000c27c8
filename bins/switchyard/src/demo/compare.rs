//! The demo's policy comparison: a shared-prefix workload replayed through round
//! robin, power of two and cache-aware routing on one fleet, shown as bars in the
//! terminal and in an HTML report.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use engine_sim::EngineSpec;
use router_config::{EngineConfig, ModelConfig, RouterConfig};
use router_replay::{
    ReplaySettings, SharedPrefixWorkload, Summary, oracle_cached_tokens, replay, uncached_capacity,
};

/// The policies compared, the baseline first.
const POLICIES: &[&str] = &["round_robin", "power_of_two", "cache_aware"];
const ENGINES: usize = 8;
/// The share of round robin's capacity the workload runs at.
const LOAD: f64 = 0.85;

/// The modelled engines: prefill shared per engine, caches smaller than the working
/// set (as in `cargo xtask routing-quality`).
fn spec() -> EngineSpec {
    EngineSpec {
        max_running_requests: 32,
        prefill_tokens_per_sec: 20_000.0,
        decode_tokens_per_sec: 100.0,
        kv_capacity_tokens: 65_536,
        page_size: 16,
        dp_size: 1,
        serial_prefill: true,
    }
}

/// What the comparison ran and found.
pub(super) struct Comparison {
    pub(super) requests: usize,
    pub(super) requests_per_sec: f64,
    pub(super) summaries: Vec<Summary>,
}

/// Replays `requests` requests of the workload at 85% of round robin's capacity
/// through each policy.
pub(super) fn run(requests: usize, seed: u64) -> anyhow::Result<Comparison> {
    let engines = (0..ENGINES)
        .map(|i| EngineConfig::new(format!("e{i}"), format!("http://127.0.0.1:{}", i + 1)))
        .collect();
    let config = RouterConfig::new(vec![ModelConfig::new("demo-chat", engines)]);
    let settings = ReplaySettings {
        engine: spec(),
        ..ReplaySettings::default()
    };
    let mut workload = SharedPrefixWorkload {
        seed,
        requests,
        ..SharedPrefixWorkload::default()
    };
    let uncached = ENGINES as f64 * uncached_capacity(&workload.generate(), &settings.engine);
    workload.requests_per_sec = 4.0 * uncached;
    let capacity = replay(&config, &workload.generate(), Some(POLICIES[0]), &settings)?
        .summary(POLICIES[0], 0)
        .requests_per_sec;
    workload.requests_per_sec = LOAD * capacity;
    let trace = workload.generate();
    let oracle = oracle_cached_tokens(&trace, settings.engine.page_size);
    let mut summaries = Vec::new();
    for (i, policy) in POLICIES.iter().enumerate() {
        eprint!(
            "\rreplaying the comparison: {policy} ({}/{})   ",
            i + 1,
            POLICIES.len()
        );
        summaries.push(replay(&config, &trace, Some(policy), &settings)?.summary(policy, oracle));
    }
    eprintln!();
    Ok(Comparison {
        requests,
        requests_per_sec: workload.requests_per_sec,
        summaries,
    })
}

/// One metric of every policy: its name, how to read it, and each policy's value.
struct Metric {
    title: &'static str,
    unit: &'static str,
    decimals: usize,
    better: &'static str,
    value: fn(&Summary) -> f64,
}

const METRICS: &[Metric] = &[
    Metric {
        title: "time to first token, p50",
        unit: "ms",
        decimals: 1,
        better: "lower is better",
        value: |s| s.ttft_p50_ms,
    },
    Metric {
        title: "time to first token, p99",
        unit: "ms",
        decimals: 1,
        better: "lower is better",
        value: |s| s.ttft_p99_ms,
    },
    Metric {
        title: "prompt tokens found cached",
        unit: "%",
        decimals: 1,
        better: "higher is better",
        value: |s| 100.0 * s.cached_share,
    },
    Metric {
        title: "engine load spread, max/min",
        unit: "x",
        decimals: 2,
        better: "1 is even",
        value: |s| s.load_max_over_min,
    },
];

const BAR: usize = 36;

impl Comparison {
    fn heading(&self) -> String {
        format!(
            "policy comparison, replayed: {} requests of a shared-prefix multi-turn workload at {:.0}/s \
             (85% of round robin's capacity), {ENGINES} engines with shared prefill and caches smaller \
             than the working set",
            self.requests, self.requests_per_sec
        )
    }

    /// The bars for the terminal.
    pub(super) fn print(&self) {
        println!("\n{}", self.heading());
        for metric in METRICS {
            println!("{} ({}):", metric.title, metric.better);
            let max = self
                .summaries
                .iter()
                .map(metric.value)
                .fold(f64::MIN_POSITIVE, f64::max);
            for s in &self.summaries {
                let value = (metric.value)(s);
                let filled = ((value / max) * BAR as f64).round() as usize;
                println!(
                    "  {:<14} {}{} {value:.decimals$} {}",
                    s.policy,
                    "#".repeat(filled.min(BAR)),
                    " ".repeat(BAR - filled.min(BAR)),
                    metric.unit,
                    decimals = metric.decimals
                );
            }
        }
    }

    /// Writes the HTML report: the bars as SVG, and the numbers.
    pub(super) fn write_html(&self, path: &Path, live: &str) -> anyhow::Result<()> {
        let mut html = String::from(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>switchyard demo</title>\n\
             <style>body{font-family:sans-serif;max-width:900px;margin:2em auto}pre{background:#f4f4f4;padding:1em}</style>\n\
             </head><body>\n<h1>switchyard demo</h1>\n<h2>The live run</h2>\n",
        );
        let _ = writeln!(html, "<pre>{}</pre>", escape(live));
        let _ = writeln!(
            html,
            "<h2>Policies compared</h2>\n<p>{}</p>",
            escape(&self.heading())
        );
        for metric in METRICS {
            let _ = writeln!(
                html,
                "<h3>{} <small>({})</small></h3>\n{}",
                metric.title,
                metric.better,
                self.svg_bars(metric)
            );
        }
        html.push_str("</body></html>\n");
        std::fs::write(path, html).with_context(|| format!("writing {}", path.display()))
    }

    fn svg_bars(&self, metric: &Metric) -> String {
        const COLOURS: &[&str] = &["#d62728", "#1f77b4", "#2ca02c"];
        let (label, width, row) = (120.0, 600.0, 28.0);
        let max = self
            .summaries
            .iter()
            .map(metric.value)
            .fold(f64::MIN_POSITIVE, f64::max);
        let height = row * self.summaries.len() as f64 + 8.0;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-size=\"13\">\n",
            label + width + 120.0
        );
        for (i, s) in self.summaries.iter().enumerate() {
            let value = (metric.value)(s);
            let y = 4.0 + row * i as f64;
            let _ = writeln!(
                svg,
                "<text x=\"0\" y=\"{:.1}\">{}</text><rect x=\"{label}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{value:.decimals$} {}</text>",
                y + 16.0,
                escape(&s.policy),
                width * value / max,
                row - 8.0,
                COLOURS[i % COLOURS.len()],
                label + width * value / max + 6.0,
                y + 16.0,
                metric.unit,
                decimals = metric.decimals
            );
        }
        svg.push_str("</svg>");
        svg
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

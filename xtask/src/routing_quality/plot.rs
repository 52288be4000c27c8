//! The TTFT distributions of the runs as one SVG chart: a cumulative curve per policy
//! and run, time on a log scale.

use std::fmt::Write as _;

use serde_json::Value;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// A colour per policy, in the order the runs list them.
const COLOURS: &[&str] = &["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"];
/// A dash pattern per run.
const DASHES: &[&str] = &["", "8 4", "2 3"];

/// The chart of `runs` (a name and its summaries each): time to first token against
/// the share of requests served by then.
pub(super) fn ttft_cdf(runs: &[(String, Vec<Value>)]) -> String {
    let curves: Vec<(usize, usize, &str, Vec<f64>)> = runs
        .iter()
        .enumerate()
        .flat_map(|(r, (_, summaries))| {
            summaries.iter().enumerate().map(move |(p, s)| {
                let points = s["ttft_percentiles_ms"]
                    .as_array()
                    .map(|a| a.iter().take(101).filter_map(Value::as_f64).collect())
                    .unwrap_or_default();
                (r, p, s["policy"].as_str().unwrap_or("?"), points)
            })
        })
        .collect();
    let max = curves
        .iter()
        .flat_map(|c| c.3.iter().copied())
        .fold(1.0_f64, f64::max);
    let decades = max.log10().ceil().max(1.0);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |ms: f64| LEFT + plot_w * (ms.max(1.0).log10() / decades);
    let y = |pct: f64| TOP + plot_h * (1.0 - pct / 100.0);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15">Time to first token, shared-prefix multi-turn workload, 8 engines near saturation</text>"#
    );
    for d in 0..=decades as u32 {
        let ms = 10f64.powi(d as i32);
        let gx = x(ms);
        let _ = writeln!(
            svg,
            r##"<line x1="{gx:.1}" y1="{TOP}" x2="{gx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{ms} ms</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0
        );
    }
    for pct in (0..=100).step_by(25) {
        let gy = y(f64::from(pct));
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{pct}%</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            gy + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time to first token (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">requests with a first token by then</text>"#,
        TOP + plot_h / 2.0
    );
    for (run, policy, _, points) in &curves {
        let path: Vec<String> = points
            .iter()
            .enumerate()
            .map(|(pct, ms)| format!("{:.1},{:.1}", x(*ms), y(pct as f64)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" stroke-dasharray="{}" points="{}"/>"#,
            COLOURS[policy % COLOURS.len()],
            DASHES[run % DASHES.len()],
            path.join(" ")
        );
    }
    let mut ly = TOP + 10.0;
    let lx = WIDTH - RIGHT + 20.0;
    for (r, (name, summaries)) in runs.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<text x="{lx:.1}" y="{ly:.1}" font-weight="bold">{}</text>"#,
            escape(name)
        );
        ly += 18.0;
        for (p, s) in summaries.iter().enumerate() {
            let _ = writeln!(
                svg,
                r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2" stroke-dasharray="{}"/><text x="{:.1}" y="{ly:.1}">{} (p50 {:.0} ms)</text>"#,
                ly - 4.0,
                lx + 28.0,
                ly - 4.0,
                COLOURS[p % COLOURS.len()],
                DASHES[r % DASHES.len()],
                lx + 34.0,
                escape(s["policy"].as_str().unwrap_or("?")),
                s["ttft_p50_ms"].as_f64().unwrap_or(f64::NAN)
            );
            ly += 18.0;
        }
        ly += 8.0;
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

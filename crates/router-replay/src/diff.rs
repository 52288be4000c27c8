//! Two runs of the same requests set side by side (`switchyard replay diff`): cell by
//! cell (time to first token at its percentiles, cached share, load spread,
//! refusals), and the requests whose decisions differ most.

use std::fmt::Write as _;

use serde::Serialize;

use crate::report::{Outcome, RunReport, Summary};
use crate::trace::TraceRequest;

/// The percentiles of time to first token a diff shows: their cells' names and their
/// places in [`PERCENTILES`](crate::PERCENTILES).
const SHOWN: [(&str, usize); 4] = [
    ("ttft_p50_ms", 50),
    ("ttft_p90_ms", 90),
    ("ttft_p99_ms", 99),
    ("ttft_p99.9_ms", 101),
];

/// Two runs of one trace compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    /// The first run, summed up.
    pub before: Summary,
    /// The second run, summed up.
    pub after: Summary,
    /// The requests whose outcome differs most, most first.
    pub requests: Vec<RequestDiff>,
}

/// One request's outcome in both runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestDiff {
    /// Its place in the trace, from 0.
    pub index: usize,
    /// Its arrival, microseconds from the trace's start.
    pub at_us: u64,
    /// Its session, if any.
    pub session: Option<String>,
    /// Its prompt length in tokens.
    pub prompt_tokens: u64,
    /// How it went in the first run.
    pub before: Decision,
    /// How it went in the second run.
    pub after: Decision,
}

/// What a run did with one request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The engine it went to.
    pub engine: Option<String>,
    /// Why the policy picked it.
    pub reason: Option<String>,
    /// `served`, `rejected` or `failed`.
    pub outcome: &'static str,
    /// Time to first token, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Prompt tokens the engine found cached.
    pub cached_tokens: u64,
}

impl Decision {
    fn of(outcome: &Outcome, engines: &[String]) -> Self {
        Self {
            engine: outcome.engine.and_then(|e| engines.get(e)).cloned(),
            reason: outcome.reason.clone(),
            outcome: if outcome.rejected {
                "rejected"
            } else if outcome.failed {
                "failed"
            } else {
                "served"
            },
            ttft_ms: outcome.ttft_us.map(|us| us as f64 / 1000.0),
            cached_tokens: outcome.cached_tokens,
        }
    }
}

impl Diff {
    /// `before` and `after`, two runs of `trace` summed up as `summaries`, with the
    /// `top` requests whose outcome differs most: those served in one run and not the
    /// other first, then by how far their time to first token moved; requests that
    /// went to the same engine for the same reason and took as long are left out.
    pub fn of(
        trace: &[TraceRequest],
        summaries: (Summary, Summary),
        before: &RunReport,
        after: &RunReport,
        top: usize,
    ) -> Self {
        let mut requests: Vec<(u64, RequestDiff)> = trace
            .iter()
            .zip(before.outcomes().iter().zip(after.outcomes()))
            .enumerate()
            .filter_map(|(index, (request, (b, a)))| {
                let (b, a) = (
                    Decision::of(b, before.engines()),
                    Decision::of(a, after.engines()),
                );
                if b == a {
                    return None;
                }
                let moved = match (b.outcome == "served", a.outcome == "served") {
                    (true, true) => match (b.ttft_ms, a.ttft_ms) {
                        (Some(b), Some(a)) => ((a - b).abs() * 1000.0) as u64,
                        _ => 0,
                    },
                    // Served in one run only: before every request served in both.
                    (true, false) | (false, true) => u64::MAX,
                    // Served in neither: after those.
                    (false, false) => 0,
                };
                let diff = RequestDiff {
                    index,
                    at_us: request.at_us,
                    session: request.session.clone(),
                    prompt_tokens: request.prompt_tokens(),
                    before: b,
                    after: a,
                };
                Some((moved, diff))
            })
            .collect();
        // Stable: equal moves in trace order.
        requests.sort_by_key(|(moved, _)| std::cmp::Reverse(*moved));
        requests.truncate(top);
        Self {
            before: summaries.0,
            after: summaries.1,
            requests: requests.into_iter().map(|(_, diff)| diff).collect(),
        }
    }

    /// The diff as text: the cells, one a line with both runs and the change, then
    /// the requests that differ most, one a line. A column is as wide as its run's
    /// name; a figure that is not finite (a load spread with an idle engine) and a
    /// change involving one print as `-`.
    pub fn table(&self) -> String {
        let (b, a) = (&self.before, &self.after);
        let (wb, wa) = (b.policy.len().max(14), a.policy.len().max(14));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<18} {:>wb$} {:>wa$} {:>12}",
            "cell", b.policy, a.policy, "change"
        );
        let figure = |x: f64, width: usize, signed: bool| match (x.is_finite(), signed) {
            (false, _) => format!("{:>width$}", "-"),
            (true, false) => format!("{x:>width$.2}"),
            (true, true) => format!("{x:>+width$.2}"),
        };
        let mut cell = |name: &str, before: f64, after: f64| {
            let _ = writeln!(
                out,
                "{name:<18} {} {} {}",
                figure(before, wb, false),
                figure(after, wa, false),
                figure(after - before, 12, true)
            );
        };
        cell("served", served(b), served(a));
        cell("rejected", b.rejected as f64, a.rejected as f64);
        cell("failed", b.failed as f64, a.failed as f64);
        for (name, at) in SHOWN {
            let at_most = |s: &Summary| s.ttft_percentiles_ms.get(at).copied().unwrap_or(0.0);
            cell(name, at_most(b), at_most(a));
        }
        cell("cached_%", b.cached_share * 100.0, a.cached_share * 100.0);
        cell("of_oracle_%", b.of_oracle * 100.0, a.of_oracle * 100.0);
        cell("load_max/min", b.load_max_over_min, a.load_max_over_min);
        cell("req/s", b.requests_per_sec, a.requests_per_sec);
        if self.requests.is_empty() {
            let _ = writeln!(out, "\nevery request went as before");
            return out;
        }
        let _ = writeln!(
            out,
            "\nthe {} requests whose decisions differ most:",
            self.requests.len()
        );
        let _ = writeln!(
            out,
            "{:>8} {:>12} {:>8}  {:<44} {:<44}",
            "request", "at_ms", "tokens", b.policy, a.policy
        );
        for r in &self.requests {
            let _ = writeln!(
                out,
                "{:>8} {:>12.1} {:>8}  {:<44} {:<44}",
                r.index,
                r.at_us as f64 / 1000.0,
                r.prompt_tokens,
                decision(&r.before),
                decision(&r.after)
            );
        }
        out
    }
}

/// Requests served in a run.
fn served(summary: &Summary) -> f64 {
    (summary.requests - summary.rejected - summary.failed) as f64
}

/// A decision in a few words: engine, reason, outcome, time to first token, cached
/// tokens.
fn decision(d: &Decision) -> String {
    let engine = d.engine.as_deref().unwrap_or("-");
    let reason = d.reason.as_deref().unwrap_or("-");
    match d.ttft_ms {
        Some(ms) => format!("{engine} {reason} {ms:.1}ms {}c", d.cached_tokens),
        None => format!("{engine} {reason} {}", d.outcome),
    }
}

#[cfg(test)]
mod tests;

//! What a replay measured: per request, then summed up per policy.

use std::fmt::Write as _;

use std::collections::HashSet;

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::trace::{Segment, TraceRequest};

/// How one request went: what a replay records, and what a live run measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Arrival, microseconds from the trace's start: its trace time, or when its
    /// client sent it in a closed loop.
    pub arrived_us: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// Output tokens asked for.
    pub output_tokens: u64,
    /// The engine it went to, by position in the summary's engine list.
    pub engine: Option<usize>,
    /// Why the policy picked it.
    pub reason: Option<String>,
    /// Refused for capacity: every engine at its caps (the router answers 503
    /// `at_capacity`), or an engine's own 429.
    pub rejected: bool,
    /// Not routed for another reason (no bucket takes it, no engine is available),
    /// or, live, an answer that failed.
    pub failed: bool,
    /// Arrival to the first output token, microseconds.
    pub ttft_us: Option<u64>,
    /// When its last token came, microseconds from the trace's start.
    pub finished_us: Option<u64>,
    /// Prompt tokens the engine found cached.
    pub cached_tokens: u64,
}

impl Outcome {
    /// A request that has arrived and nothing more.
    pub fn arrived(request: &TraceRequest) -> Self {
        Self {
            arrived_us: request.at_us,
            prompt_tokens: request.prompt_tokens(),
            output_tokens: u64::from(request.output_tokens),
            engine: None,
            reason: None,
            rejected: false,
            failed: false,
            ttft_us: None,
            finished_us: None,
            cached_tokens: 0,
        }
    }
}

/// One policy's run, request by request.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub(crate) outcomes: Vec<Outcome>,
    engines: Vec<String>,
}

/// Time to first token in milliseconds at these percentiles: every whole percent,
/// then 99.9.
pub const PERCENTILES: [f64; 102] = {
    let mut p = [0.0; 102];
    let mut i = 0;
    while i <= 100 {
        p[i] = i as f64;
        i += 1;
    }
    p[101] = 99.9;
    p
};

/// One policy's replay, summed up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The policy replayed (`config`: the configuration's own).
    pub policy: String,
    /// Requests in the trace.
    pub requests: u64,
    /// Requests refused for capacity.
    pub rejected: u64,
    /// Requests not routed for another reason, or failed.
    pub failed: u64,
    /// Time to first token, median, milliseconds.
    pub ttft_p50_ms: f64,
    /// Time to first token, 99th percentile, milliseconds.
    pub ttft_p99_ms: f64,
    /// Time to first token at each of [`PERCENTILES`], milliseconds.
    pub ttft_percentiles_ms: Vec<f64>,
    /// Requests served per second, first arrival to last token.
    pub requests_per_sec: f64,
    /// Output tokens per second, first arrival to last token.
    pub output_tokens_per_sec: f64,
    /// Prompt tokens the engines found cached, over all prompt tokens served.
    pub cached_share: f64,
    /// Cached prompt tokens over what an unbounded cache that has seen every earlier
    /// prompt finds (see [`oracle_cached_tokens`]).
    pub of_oracle: f64,
    /// Each engine's load: the mean number of requests it held (waiting or running,
    /// arrival to last token) over the run, in configuration order.
    pub engine_load: Vec<(String, f64)>,
    /// The most loaded engine's load over the least loaded's.
    pub load_max_over_min: f64,
    /// Picks by reason.
    pub reasons: Vec<(String, u64)>,
    /// Of the siblings of new prefixes, the share on the first one's engine
    /// ([`siblings_on_first_engine`](crate::siblings_on_first_engine)), when the
    /// caller measured it.
    pub siblings_on_first_engine: Option<f64>,
}

impl RunReport {
    /// The run of `outcomes`, whose `engine`s index `engines`.
    pub fn new(outcomes: Vec<Outcome>, engines: Vec<String>) -> Self {
        Self { outcomes, engines }
    }

    /// Each request's outcome, in trace order.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }

    /// The engines the outcomes' `engine` indexes.
    pub fn engines(&self) -> &[String] {
        &self.engines
    }

    /// Sums the replay up under `policy`'s name; `oracle_cached` is what the oracle
    /// finds cached over the whole trace ([`oracle_cached_tokens`]).
    pub fn summary(&self, policy: &str, oracle_cached: u64) -> Summary {
        let served: Vec<&Outcome> = self
            .outcomes
            .iter()
            .filter(|o| o.ttft_us.is_some())
            .collect();
        let mut ttft: Vec<u64> = served.iter().filter_map(|o| o.ttft_us).collect();
        ttft.sort_unstable();
        let ms = |p: f64| percentile(&ttft, p) as f64 / 1000.0;
        // In arrival order but for a closed loop's, which may send a request before
        // one above it in the trace.
        let first = self
            .outcomes
            .iter()
            .map(|o| o.arrived_us)
            .min()
            .unwrap_or(0);
        let last = self
            .outcomes
            .iter()
            .filter_map(|o| o.finished_us)
            .max()
            .unwrap_or(first);
        let span = (last.saturating_sub(first)).max(1) as f64 / 1e6;
        let prompt: u64 = served.iter().map(|o| o.prompt_tokens).sum();
        let cached: u64 = served.iter().map(|o| o.cached_tokens).sum();
        let output: u64 = served.iter().map(|o| o.output_tokens).sum();
        let mut held_us = vec![0u64; self.engines.len()];
        for o in &self.outcomes {
            if let (Some(engine), Some(finished)) = (o.engine, o.finished_us) {
                held_us[engine] += finished.saturating_sub(o.arrived_us);
            }
        }
        let engine_load: Vec<(String, f64)> = self
            .engines
            .iter()
            .zip(&held_us)
            .map(|(id, us)| (id.clone(), *us as f64 / 1e6 / span))
            .collect();
        let max = engine_load.iter().map(|(_, l)| *l).fold(0.0, f64::max);
        let min = engine_load
            .iter()
            .map(|(_, l)| *l)
            .fold(f64::INFINITY, f64::min);
        let mut reasons: std::collections::BTreeMap<&str, u64> = Default::default();
        for reason in self.outcomes.iter().filter_map(|o| o.reason.as_deref()) {
            *reasons.entry(reason).or_default() += 1;
        }
        Summary {
            policy: policy.to_owned(),
            requests: self.outcomes.len() as u64,
            rejected: self.outcomes.iter().filter(|o| o.rejected).count() as u64,
            failed: self.outcomes.iter().filter(|o| o.failed).count() as u64,
            ttft_p50_ms: ms(50.0),
            ttft_p99_ms: ms(99.0),
            ttft_percentiles_ms: PERCENTILES.iter().map(|p| ms(*p)).collect(),
            requests_per_sec: served.len() as f64 / span,
            output_tokens_per_sec: output as f64 / span,
            cached_share: ratio(cached, prompt),
            of_oracle: ratio(cached, oracle_cached),
            engine_load,
            load_max_over_min: if min > 0.0 { max / min } else { f64::INFINITY },
            reasons: reasons
                .into_iter()
                .map(|(r, n)| (r.to_owned(), n))
                .collect(),
            siblings_on_first_engine: None,
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The nearest-rank percentile of sorted `values` (0 when there are none).
fn percentile(values: &[u64], p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// The prompt tokens one unbounded cache that has seen every earlier prompt finds: for
/// each request, the full pages of the longest run of leading segments it shares with
/// an earlier request. Segments match whole or not at all (the pages of a
/// [`Segment::Pages`] one by one), so two named segments of one id and different
/// lengths (which share their leading tokens), or recorded ones that share a prefix,
/// count as different; with no such pair (the generated workload has none), no router
/// over caches of any size finds more.
pub fn oracle_cached_tokens(trace: &[TraceRequest], page_size: u32) -> u64 {
    let page = u64::from(page_size.max(1));
    let mut seen: HashSet<u64> = HashSet::new();
    let mut total = 0;
    for request in trace {
        let mut chain = 0u64;
        let mut tokens = 0u64;
        let mut shared = 0u64;
        let mut matching = true;
        let mut step = |hash: u64, len: u64| {
            chain = xxh3_64_with_seed(&hash.to_le_bytes(), chain);
            tokens += len;
            if matching && seen.contains(&chain) {
                shared = tokens;
            } else {
                matching = false;
                seen.insert(chain);
            }
        };
        for segment in &request.prompt {
            match segment {
                Segment::Named { id, tokens } => {
                    step(
                        xxh3_64_with_seed(id.as_bytes(), u64::from(*tokens)),
                        segment.len(),
                    );
                }
                Segment::Recorded { token_ids } => {
                    let bytes: Vec<u8> = token_ids.iter().flat_map(|t| t.to_le_bytes()).collect();
                    step(xxh3_64_with_seed(&bytes, u64::MAX), segment.len());
                }
                Segment::Pages { pages, page_tokens } => {
                    for page in &pages.0 {
                        step(*page, u64::from(*page_tokens));
                    }
                }
            }
        }
        total += shared / page * page;
    }
    total
}

/// The summaries as a fixed-width table, one policy per line.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>8} {:>6} {:>12} {:>12} {:>9} {:>11} {:>9} {:>9} {:>13}",
        "policy",
        "requests",
        "rejected",
        "failed",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "req/s",
        "out_tok/s",
        "cached",
        "of_oracle",
        "load_max/min"
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "{:<16} {:>9} {:>8} {:>6} {:>12.1} {:>12.1} {:>9.1} {:>11.0} {:>8.1}% {:>8.1}% {:>13.2}",
            s.policy,
            s.requests,
            s.rejected,
            s.failed,
            s.ttft_p50_ms,
            s.ttft_p99_ms,
            s.requests_per_sec,
            s.output_tokens_per_sec,
            s.cached_share * 100.0,
            s.of_oracle * 100.0,
            s.load_max_over_min
        );
    }
    out
}

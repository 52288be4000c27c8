//! Bursts: many requests at once on one new long prefix, over background traffic.
//!
//! A burst is what a document shared in a team channel, a new release's changelog in
//! every user's context, or a batch job's fan-out looks like to a router: 16 to 64
//! requests arriving within a few milliseconds, all opening with one long prefix no
//! request has sent before, each with a short suffix of its own. Bursts start as a
//! Poisson process; between them run the background's conversations
//! ([`SharedPrefixWorkload`]). Requests of a burst carry no session: they are
//! separate clients.

use serde::{Deserialize, Serialize};

use super::{SharedPrefixWorkload, count, generators, log_uniform, mean_count, unit};
use crate::trace::{Segment, TraceRequest};

/// The shape of a bursty workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstWorkload {
    /// Seeds every draw.
    pub seed: u64,
    /// Requests to generate, bursts and background together.
    pub requests: usize,
    /// Requests per second, on average, bursts and background together.
    pub requests_per_sec: f64,
    /// The share of requests that come in bursts, above 0 and at most 1; the rest
    /// are the background's.
    pub burst_share: f64,
    /// Requests per burst range.
    pub burst_size: (u32, u32),
    /// The window a burst's requests arrive in, microseconds from its first.
    pub window_us: u64,
    /// A burst's shared prefix length range, tokens.
    pub prefix_tokens: (u32, u32),
    /// Each request's own suffix length range, tokens.
    pub suffix_tokens: (u32, u32),
    /// Answer length range, tokens.
    pub output_tokens: (u32, u32),
    /// The background conversations' shape; its seed, request count and rate are set
    /// from this workload's (the same seed, the rate of the requests not in bursts).
    pub background: SharedPrefixWorkload,
}

impl Default for BurstWorkload {
    fn default() -> Self {
        Self {
            seed: 7,
            requests: 10_000,
            requests_per_sec: 100.0,
            burst_share: 0.3,
            burst_size: (16, 64),
            window_us: 5_000,
            prefix_tokens: (2_000, 8_000),
            suffix_tokens: (20, 200),
            output_tokens: (20, 200),
            background: SharedPrefixWorkload::default(),
        }
    }
}

/// Mixed into the seed of the bursts' generators, so they draw apart from the
/// background's.
const BURST_SEED: u64 = 0x6275_7273_7473;

impl BurstWorkload {
    /// The trace, in arrival order: the bursts' requests and the background's,
    /// merged, the first `requests` of them.
    pub fn generate(&self) -> Vec<TraceRequest> {
        let share = self.burst_share.clamp(0.0, 1.0);
        let bursts = self.bursts(self.requests_per_sec * share);
        let background = if share < 1.0 {
            SharedPrefixWorkload {
                seed: self.seed,
                requests: self.requests,
                requests_per_sec: self.requests_per_sec * (1.0 - share),
                ..self.background.clone()
            }
            .generate()
        } else {
            Vec::new()
        };
        // Each holds every request of its own up to its last: the first `requests`
        // of the merge miss none of either.
        let mut merged = Vec::with_capacity(self.requests);
        let (mut bursts, mut background) = (
            bursts.into_iter().peekable(),
            background.into_iter().peekable(),
        );
        while merged.len() < self.requests {
            let next = match (bursts.peek(), background.peek()) {
                (Some(b), Some(g)) if b.at_us < g.at_us => bursts.next(),
                (_, Some(_)) => background.next(),
                (Some(_), None) => bursts.next(),
                (None, None) => None,
            };
            let Some(request) = next else { break };
            merged.push(request);
        }
        merged
    }

    /// `requests` requests of bursts alone, at `requests_per_sec`.
    fn bursts(&self, requests_per_sec: f64) -> Vec<TraceRequest> {
        if requests_per_sec <= 0.0 {
            return Vec::new();
        }
        let (mut sizes, mut times) = generators(self.seed ^ BURST_SEED);
        let bursts_per_sec = requests_per_sec / mean_count(self.burst_size);
        super::sessions(
            self.requests,
            bursts_per_sec,
            &mut times,
            |burst, start_s, times| {
                let prefix = Segment::Named {
                    id: format!("burst-{burst}"),
                    tokens: log_uniform(&mut sizes, self.prefix_tokens),
                };
                let start_us = super::micros(start_s);
                (0..count(&mut sizes, self.burst_size))
                    .map(|i| TraceRequest {
                        at_us: start_us + (unit(times) * self.window_us as f64) as u64,
                        model: None,
                        session: None,
                        prompt: vec![
                            prefix.clone(),
                            Segment::Named {
                                id: format!("burst-{burst}-{i}"),
                                tokens: log_uniform(&mut sizes, self.suffix_tokens),
                            },
                        ],
                        output_tokens: log_uniform(&mut sizes, self.output_tokens),
                    })
                    .collect()
            },
        )
    }
}

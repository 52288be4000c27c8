//! A generated workload: multi-turn conversations over shared system prompts.
//!
//! Each conversation opens with one of `system_prompts` system prompts, chosen with
//! Zipf popularity (a few are very common, most are rare), then runs its turns: a
//! turn's prompt is the whole conversation so far plus a new user message, and its
//! answer becomes part of the next turn's prompt. Conversations start as a Poisson
//! process; a turn follows the one before after its answer is read and thought about.
//! Lengths are drawn log-uniformly from their ranges. Sizes and times come from
//! separate generators, so changing the rate moves requests in time without changing
//! a token.

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::trace::{Segment, TraceRequest};

/// The shape of a shared-prefix multi-turn workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedPrefixWorkload {
    /// Seeds every draw.
    pub seed: u64,
    /// Requests to generate.
    pub requests: usize,
    /// Requests per second, on average.
    pub requests_per_sec: f64,
    /// Distinct system prompts.
    pub system_prompts: u32,
    /// System prompt length range, tokens.
    pub system_tokens: (u32, u32),
    /// Turns per conversation range.
    pub turns: (u32, u32),
    /// User message length range, tokens.
    pub user_tokens: (u32, u32),
    /// Answer length range, tokens.
    pub output_tokens: (u32, u32),
    /// Time a user takes to read one answer token, microseconds.
    pub read_us_per_token: u64,
    /// Mean think time between reading an answer and sending the next turn,
    /// milliseconds (exponentially distributed).
    pub think_ms: f64,
}

impl Default for SharedPrefixWorkload {
    fn default() -> Self {
        Self {
            seed: 7,
            requests: 10_000,
            requests_per_sec: 100.0,
            system_prompts: 64,
            system_tokens: (500, 4000),
            turns: (1, 6),
            user_tokens: (20, 400),
            output_tokens: (20, 400),
            read_us_per_token: 10_000,
            think_ms: 2000.0,
        }
    }
}

/// Uniform in `[0, 1)`.
fn unit(rng: &mut Xoshiro256PlusPlus) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Log-uniform in `[lo, hi]`.
fn log_uniform(rng: &mut Xoshiro256PlusPlus, (lo, hi): (u32, u32)) -> u32 {
    let (lo, hi) = (f64::from(lo.max(1)), f64::from(hi.max(lo.max(1))));
    (lo * (hi / lo).powf(unit(rng))).round() as u32
}

/// Uniform in `[lo, hi]`.
fn uniform(rng: &mut Xoshiro256PlusPlus, (lo, hi): (u32, u32)) -> u32 {
    let span = u64::from(hi.saturating_sub(lo)) + 1;
    lo + (rng.next_u64() % span) as u32
}

/// Exponential with `mean`.
fn exponential(rng: &mut Xoshiro256PlusPlus, mean: f64) -> f64 {
    -mean * (1.0 - unit(rng)).ln()
}

impl SharedPrefixWorkload {
    /// Mean turns per conversation.
    fn mean_turns(&self) -> f64 {
        f64::from(self.turns.0.max(1) + self.turns.1.max(self.turns.0.max(1))) / 2.0
    }

    /// The trace, in arrival order.
    pub fn generate(&self) -> Vec<TraceRequest> {
        let mut sizes = Xoshiro256PlusPlus::seed_from_u64(self.seed);
        let mut times = Xoshiro256PlusPlus::seed_from_u64(self.seed ^ 0x9e37_79b9_7f4a_7c15);
        let systems = self.system_prompts.max(1);
        // Zipf(1) popularity: the cumulative weights of 1/1, 1/2, ... 1/n.
        let mut cumulative = Vec::with_capacity(systems as usize);
        let mut sum = 0.0;
        for i in 1..=systems {
            sum += 1.0 / f64::from(i);
            cumulative.push(sum);
        }
        let system_lengths: Vec<u32> = (0..systems)
            .map(|_| log_uniform(&mut sizes, self.system_tokens))
            .collect();
        let conversations_per_sec = self.requests_per_sec.max(1e-9) / self.mean_turns();
        let mut requests: Vec<(u64, u32, u32, TraceRequest)> = Vec::with_capacity(self.requests);
        let mut start_s = 0.0;
        let mut conversation = 0u32;
        // Conversations start until the trace has its requests and a new one would
        // start after the last request kept: none missing before the cut.
        let mut cut_us: Option<u64> = None;
        loop {
            if cut_us.is_none() && requests.len() >= self.requests {
                let mut at: Vec<u64> = requests.iter().map(|r| r.0).collect();
                at.sort_unstable();
                cut_us = Some(
                    at.get(self.requests.saturating_sub(1))
                        .copied()
                        .unwrap_or(0),
                );
            }
            start_s += exponential(&mut times, 1.0 / conversations_per_sec);
            if cut_us.is_some_and(|cut| (start_s * 1e6) as u64 > cut) {
                break;
            }
            let draw = unit(&mut sizes) * sum;
            let system = cumulative
                .partition_point(|c| *c <= draw)
                .min(systems as usize - 1);
            let session = format!("c{conversation}");
            let mut prompt = vec![Segment::Named {
                id: format!("system-{system}"),
                tokens: system_lengths[system],
            }];
            let mut at_s = start_s;
            let turns = uniform(&mut sizes, self.turns).max(1);
            for turn in 0..turns {
                prompt.push(Segment::Named {
                    id: format!("{session}-user-{turn}"),
                    tokens: log_uniform(&mut sizes, self.user_tokens),
                });
                let output = log_uniform(&mut sizes, self.output_tokens);
                requests.push((
                    (at_s * 1e6) as u64,
                    conversation,
                    turn,
                    TraceRequest {
                        at_us: (at_s * 1e6) as u64,
                        model: None,
                        session: Some(session.clone()),
                        prompt: prompt.clone(),
                        output_tokens: output,
                    },
                ));
                prompt.push(Segment::Named {
                    id: format!("{session}-answer-{turn}"),
                    tokens: output,
                });
                at_s += (u64::from(output) * self.read_us_per_token) as f64 / 1e6
                    + exponential(&mut times, self.think_ms / 1000.0);
            }
            conversation += 1;
        }
        requests.sort_by_key(|(at, c, t, _)| (*at, *c, *t));
        requests.truncate(self.requests);
        requests.into_iter().map(|(.., r)| r).collect()
    }
}

/// Requests per second one engine rank serves when nothing is cached, as `spec`
/// times them: every slot busy prefilling whole prompts and generating answers, or,
/// with serial prefill, the prefill turn always taken, whichever binds first.
pub fn uncached_capacity(trace: &[TraceRequest], spec: &engine_sim::EngineSpec) -> f64 {
    if trace.is_empty() {
        return 0.0;
    }
    let n = trace.len() as f64;
    let prefill: f64 = trace
        .iter()
        .map(|r| spec.prefill_time(r.prompt_tokens()).as_secs_f64())
        .sum::<f64>()
        / n;
    let decode: f64 = trace
        .iter()
        .map(|r| spec.decode_time(1).as_secs_f64() * f64::from(r.output_tokens))
        .sum::<f64>()
        / n;
    let slots = f64::from(spec.max_running_requests) / (prefill + decode).max(1e-9);
    if spec.serial_prefill {
        slots.min(1.0 / prefill.max(1e-9))
    } else {
        slots
    }
}

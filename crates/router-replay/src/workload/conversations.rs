//! Multi-turn conversations over shared system prompts.
//!
//! Each conversation opens with one of `system_prompts` system prompts, drawn with a
//! [`Popularity`], then runs its turns: a turn's prompt is the whole conversation so
//! far plus a new user message, and its answer becomes part of the next turn's prompt.
//! Conversations start as a Poisson process; a turn follows the one before after its
//! answer is read and thought about.

use serde::{Deserialize, Serialize};

use super::{Popular, Popularity, count, exponential, generators, log_uniform, mean_count};
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
    /// How often each system prompt opens a conversation.
    #[serde(default)]
    pub popularity: Popularity,
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
            popularity: Popularity::Zipf,
            system_tokens: (500, 4000),
            turns: (1, 6),
            user_tokens: (20, 400),
            output_tokens: (20, 400),
            read_us_per_token: 10_000,
            think_ms: 2000.0,
        }
    }
}

impl SharedPrefixWorkload {
    /// The trace, in arrival order.
    pub fn generate(&self) -> Vec<TraceRequest> {
        let (mut sizes, mut times) = generators(self.seed);
        let systems = Popular::new(self.system_prompts, self.popularity);
        let system_lengths: Vec<u32> = (0..self.system_prompts.max(1))
            .map(|_| log_uniform(&mut sizes, self.system_tokens))
            .collect();
        let conversations_per_sec = self.requests_per_sec.max(1e-9) / mean_count(self.turns);
        super::sessions(
            self.requests,
            conversations_per_sec,
            &mut times,
            |conversation, start_s, times| {
                let system = systems.pick(&mut sizes);
                let session = format!("c{conversation}");
                let mut prompt = vec![Segment::Named {
                    id: format!("system-{system}"),
                    tokens: system_lengths[system],
                }];
                let mut at_s = start_s;
                let turns = count(&mut sizes, self.turns);
                let mut requests = Vec::with_capacity(turns as usize);
                for turn in 0..turns {
                    prompt.push(Segment::Named {
                        id: format!("{session}-user-{turn}"),
                        tokens: log_uniform(&mut sizes, self.user_tokens),
                    });
                    let output = log_uniform(&mut sizes, self.output_tokens);
                    requests.push(TraceRequest {
                        at_us: super::micros(at_s),
                        model: None,
                        session: Some(session.clone()),
                        prompt: prompt.clone(),
                        output_tokens: output,
                    });
                    prompt.push(Segment::Named {
                        id: format!("{session}-answer-{turn}"),
                        tokens: output,
                    });
                    at_s += (u64::from(output) * self.read_us_per_token) as f64 / 1e6
                        + exponential(times, self.think_ms / 1000.0);
                }
                requests
            },
        )
    }
}

//! Agent sessions: a long tools-and-instructions prefix, tool results appended turn
//! by turn, sub-agents branching off.
//!
//! A session opens with one of a few long tools-and-instructions prompts (drawn with
//! a [`Popularity`]) and its task. Each turn the agent answers with a short tool
//! call; the tool runs (an exponential time) and its result, longer, is appended with
//! the call, so the next turn's prompt is the whole session so far. At a turn before
//! its last, a session may hand work to sub-agents instead of a tool: each sub-agent's
//! prompt is the parent's so far (the call that started it included) plus a task of
//! its own, and it runs a few turns of its own the same way; the parent's next turn
//! comes once all of them have answered, their answers appended as the call's result.
//! A session is `a{n}`; its sub-agents started at turn `t` are `a{n}-sub{t}-{j}`.

use serde::{Deserialize, Serialize};

use super::{
    Popular, Popularity, count, exponential, generators, log_uniform, mean_count, micros, unit,
};
use crate::trace::{Segment, TraceRequest};

/// The shape of an agent workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentWorkload {
    /// Seeds every draw.
    pub seed: u64,
    /// Requests to generate.
    pub requests: usize,
    /// Requests per second, on average.
    pub requests_per_sec: f64,
    /// Distinct tools-and-instructions prompts.
    pub tool_prompts: u32,
    /// How often each tools-and-instructions prompt opens a session.
    pub popularity: Popularity,
    /// Tools-and-instructions prompt length range, tokens.
    pub tool_prompt_tokens: (u32, u32),
    /// A session's or a sub-agent's task length range, tokens.
    pub task_tokens: (u32, u32),
    /// Turns per session range.
    pub turns: (u32, u32),
    /// Tool call (each turn's answer) length range, tokens.
    pub call_tokens: (u32, u32),
    /// Tool result length range, tokens.
    pub result_tokens: (u32, u32),
    /// The chance that a turn before a session's last starts sub-agents rather than a
    /// tool, 0 to 1.
    pub subagent_share: f64,
    /// Sub-agents a turn starts, range.
    pub subagents: (u32, u32),
    /// Turns per sub-agent range.
    pub subagent_turns: (u32, u32),
    /// Time the engine takes to generate one output token, as the client sees it,
    /// microseconds: a call is made once its last token has come.
    pub generate_us_per_token: u64,
    /// Mean time a tool runs, milliseconds (exponentially distributed).
    pub tool_ms: f64,
}

impl Default for AgentWorkload {
    fn default() -> Self {
        Self {
            seed: 7,
            requests: 10_000,
            requests_per_sec: 100.0,
            tool_prompts: 4,
            popularity: Popularity::Zipf,
            tool_prompt_tokens: (4_000, 12_000),
            task_tokens: (50, 400),
            turns: (2, 12),
            call_tokens: (20, 150),
            result_tokens: (100, 2_000),
            subagent_share: 0.15,
            subagents: (1, 3),
            subagent_turns: (1, 4),
            generate_us_per_token: 10_000,
            tool_ms: 500.0,
        }
    }
}

/// One agent's requests and the time its last answer is done.
struct Agent {
    requests: Vec<TraceRequest>,
    done_s: f64,
}

impl AgentWorkload {
    /// Requests a session makes, on average, its sub-agents' included.
    fn mean_requests(&self) -> f64 {
        let turns = mean_count(self.turns);
        let share = self.subagent_share.clamp(0.0, 1.0);
        turns + share * (turns - 1.0) * mean_count(self.subagents) * mean_count(self.subagent_turns)
    }

    /// The trace, in arrival order.
    pub fn generate(&self) -> Vec<TraceRequest> {
        let (mut sizes, mut times) = generators(self.seed);
        let tools = Popular::new(self.tool_prompts, self.popularity);
        let tool_lengths: Vec<u32> = (0..self.tool_prompts.max(1))
            .map(|_| log_uniform(&mut sizes, self.tool_prompt_tokens))
            .collect();
        let sessions_per_sec = self.requests_per_sec.max(1e-9) / self.mean_requests();
        let share = self.subagent_share.clamp(0.0, 1.0);
        super::sessions(
            self.requests,
            sessions_per_sec,
            &mut times,
            |n, start_s, times| {
                let tool = tools.pick(&mut sizes);
                let session = format!("a{n}");
                let mut prompt = vec![
                    Segment::Named {
                        id: format!("tools-{tool}"),
                        tokens: tool_lengths[tool],
                    },
                    Segment::Named {
                        id: format!("{session}-task"),
                        tokens: log_uniform(&mut sizes, self.task_tokens),
                    },
                ];
                let mut requests = Vec::new();
                let mut at_s = start_s;
                let turns = count(&mut sizes, self.turns);
                for turn in 0..turns {
                    let call = log_uniform(&mut sizes, self.call_tokens);
                    requests.push(self.request(at_s, &session, &prompt, call));
                    if turn + 1 == turns {
                        break;
                    }
                    prompt.push(Segment::Named {
                        id: format!("{session}-call-{turn}"),
                        tokens: call,
                    });
                    at_s += self.generating(call);
                    let result = if unit(&mut sizes) < share {
                        let mut answers = 0;
                        let mut done_s = at_s;
                        for j in 0..count(&mut sizes, self.subagents) {
                            let sub = format!("{session}-sub{turn}-{j}");
                            let agent =
                                self.subagent(&sub, prompt.clone(), at_s, &mut sizes, times);
                            answers += agent.requests.last().map_or(0, |r| r.output_tokens);
                            done_s = done_s.max(agent.done_s);
                            requests.extend(agent.requests);
                        }
                        at_s = done_s;
                        answers
                    } else {
                        at_s += exponential(times, self.tool_ms / 1000.0);
                        log_uniform(&mut sizes, self.result_tokens)
                    };
                    prompt.push(Segment::Named {
                        id: format!("{session}-result-{turn}"),
                        tokens: result,
                    });
                }
                requests
            },
        )
    }

    /// A sub-agent `session` started at `start_s` on its parent's `prompt` so far.
    fn subagent(
        &self,
        session: &str,
        mut prompt: Vec<Segment>,
        start_s: f64,
        sizes: &mut rand_xoshiro::Xoshiro256PlusPlus,
        times: &mut rand_xoshiro::Xoshiro256PlusPlus,
    ) -> Agent {
        prompt.push(Segment::Named {
            id: format!("{session}-task"),
            tokens: log_uniform(sizes, self.task_tokens),
        });
        let mut requests = Vec::new();
        let mut at_s = start_s;
        let turns = count(sizes, self.subagent_turns);
        for turn in 0..turns {
            let call = log_uniform(sizes, self.call_tokens);
            requests.push(self.request(at_s, session, &prompt, call));
            at_s += self.generating(call);
            if turn + 1 == turns {
                break;
            }
            at_s += exponential(times, self.tool_ms / 1000.0);
            prompt.push(Segment::Named {
                id: format!("{session}-call-{turn}"),
                tokens: call,
            });
            prompt.push(Segment::Named {
                id: format!("{session}-result-{turn}"),
                tokens: log_uniform(sizes, self.result_tokens),
            });
        }
        Agent {
            requests,
            done_s: at_s,
        }
    }

    /// The time `tokens` output tokens take to come, seconds.
    fn generating(&self, tokens: u32) -> f64 {
        (u64::from(tokens) * self.generate_us_per_token) as f64 / 1e6
    }

    fn request(&self, at_s: f64, session: &str, prompt: &[Segment], output: u32) -> TraceRequest {
        TraceRequest {
            at_us: micros(at_s),
            model: None,
            session: Some(session.to_owned()),
            prompt: prompt.to_vec(),
            output_tokens: output,
        }
    }
}

//! `switchyard workload`: a generated trace of one of the shapes, at a share of a
//! fleet's capacity.

use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use router_replay::{
    AgentWorkload, BurstWorkload, DocumentWorkload, LaggingFeeds, Popularity, SharedPrefixWorkload,
    TraceRequest, Workload, replay, uncached_capacity, write_trace,
};

use crate::replay::{EngineModelArgs, FeedSettings, read_config};

/// Options of `switchyard workload`.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkloadArgs {
    /// Where to write the trace.
    #[arg(long)]
    out: PathBuf,
    /// Requests in the trace.
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    /// Seed of every draw.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The workload's shape.
    #[arg(long, value_enum, default_value_t = Shape::Conversations)]
    shape: Shape,
    /// How often each shared prefix (system prompt, tools prompt, document) is drawn.
    #[arg(long, value_enum, default_value_t = PopularityArg::Zipf)]
    popularity: PopularityArg,
    #[command(flatten)]
    conversations: ConversationArgs,
    #[command(flatten)]
    bursts: BurstArgs,
    #[command(flatten)]
    agents: AgentArgs,
    #[command(flatten)]
    documents: DocumentArgs,
    /// Arrival rate as a share of the fleet's capacity (0.5, 0.85, 1.0, 1.2, ...): by
    /// default the capacity with nothing cached; with `--config`, the throughput
    /// `--capacity-policy` reaches when the fleet is overloaded.
    #[arg(long, default_value_t = 0.85)]
    load: f64,
    /// Engines the capacity is computed for, without `--config`.
    #[arg(long, default_value_t = 8)]
    engines: u32,
    /// Tokens per page (the model's block size), without `--config`.
    #[arg(long, default_value_t = 16)]
    page_size: u32,
    /// Measure the capacity by replaying the workload, overloaded, through the router
    /// this configuration describes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The policy whose capacity `--load` is a share of, with `--config`.
    #[arg(long, default_value = "round_robin", requires = "config")]
    capacity_policy: String,
    #[command(flatten)]
    engine: EngineModelArgs,
}

/// The shapes of workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Shape {
    /// Multi-turn conversations over shared system prompts.
    Conversations,
    /// Bursts of requests on one new long prefix each, over background conversations.
    Bursts,
    /// Agent sessions: long tools prompts, tool results appended, sub-agents.
    Agents,
    /// Short questions about long documents.
    Documents,
}

/// [`Popularity`] on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PopularityArg {
    /// The k-th prefix drawn in proportion to 1/k.
    Zipf,
    /// Every prefix equally often.
    Uniform,
}

/// A range of counts or tokens, `LO-HI` or one number.
type Range = (u32, u32);

/// The largest token range a prompt's segment is drawn from.
const MAX_SEGMENT_TOKENS: u32 = router_replay::MAX_PROMPT_TOKENS as u32;
/// The most shared prefixes (system prompts, tools prompts, documents) a workload
/// draws from.
const MAX_PREFIXES: u32 = 100_000;
/// The most turns a conversation, an agent or a sub-agent has.
const MAX_TURNS: u32 = 64;
/// The longest mean think or tool time, milliseconds (an hour).
const MAX_WAIT_MS: f64 = 3_600_000.0;
/// The most requests in one burst.
const MAX_BURST: u32 = 4_096;
/// The longest burst window, milliseconds.
const MAX_WINDOW_MS: f64 = 60_000.0;
/// The most sub-agents one turn starts.
const MAX_SUBAGENTS: u32 = 16;

/// Knobs of the conversations (also the background of bursts).
#[derive(Debug, clap::Args)]
struct ConversationArgs {
    /// Distinct system prompts (default 64; conversations and bursts).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PREFIXES)))]
    system_prompts: Option<u32>,
    /// Most turns per conversation, each having 1 to this many (default 6;
    /// conversations and bursts).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_TURNS)))]
    max_turns: Option<u32>,
    /// Mean think time between an answer and the next turn, milliseconds (default
    /// 2000; conversations and bursts).
    #[arg(long, value_parser = between(0.0, MAX_WAIT_MS))]
    think_ms: Option<f64>,
}

/// Knobs of the bursts.
#[derive(Debug, clap::Args)]
struct BurstArgs {
    /// Requests per burst, LO-HI (default 16-64).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_BURST))]
    burst_size: Option<Range>,
    /// The window a burst's requests arrive in, milliseconds (default 5).
    #[arg(long, value_parser = between(0.0, MAX_WINDOW_MS))]
    burst_window_ms: Option<f64>,
    /// The share of requests in bursts, above 0 and at most 1 (default 0.3); the
    /// rest are background conversations.
    #[arg(long, value_parser = share_above_zero)]
    burst_share: Option<f64>,
    /// A burst's new shared prefix, tokens, LO-HI (default 2000-8000).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_SEGMENT_TOKENS))]
    burst_prefix_tokens: Option<Range>,
    /// Each burst request's own suffix, tokens, LO-HI (default 20-200).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_SEGMENT_TOKENS))]
    burst_suffix_tokens: Option<Range>,
}

/// Knobs of the agent sessions.
#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// Distinct tools-and-instructions prompts (default 4).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PREFIXES)))]
    tool_prompts: Option<u32>,
    /// A tools-and-instructions prompt, tokens, LO-HI (default 4000-12000).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_SEGMENT_TOKENS))]
    tool_prompt_tokens: Option<Range>,
    /// Turns per agent session, LO-HI (default 2-12).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_TURNS))]
    agent_turns: Option<Range>,
    /// A tool result, tokens, LO-HI (default 100-2000).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_SEGMENT_TOKENS))]
    tool_result_tokens: Option<Range>,
    /// The chance a turn before a session's last starts sub-agents, 0 to 1 (default
    /// 0.15).
    #[arg(long, value_parser = between(0.0, 1.0))]
    subagent_share: Option<f64>,
    /// Sub-agents such a turn starts, LO-HI (default 1-3).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_SUBAGENTS))]
    subagents: Option<Range>,
    /// Turns per sub-agent, LO-HI (default 1-4).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_TURNS))]
    subagent_turns: Option<Range>,
    /// Mean time a tool runs, milliseconds (default 500).
    #[arg(long, value_parser = between(0.0, MAX_WAIT_MS))]
    tool_ms: Option<f64>,
}

/// Knobs of the long documents.
#[derive(Debug, clap::Args)]
struct DocumentArgs {
    /// Distinct documents (default 100).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PREFIXES)))]
    documents: Option<u32>,
    /// A document, tokens, LO-HI (default 8000-32000).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_SEGMENT_TOKENS))]
    document_tokens: Option<Range>,
    /// A question, tokens, LO-HI (default 10-100).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, MAX_SEGMENT_TOKENS))]
    question_tokens: Option<Range>,
    /// An answer, tokens, LO-HI (default 10-200).
    #[arg(long, value_name = "LO-HI", value_parser = range(1, router_replay::MAX_OUTPUT_TOKENS))]
    answer_tokens: Option<Range>,
}

/// A parser of `LO-HI` (or one number) within `min..=max`, `LO` at most `HI`.
fn range(min: u32, max: u32) -> impl Fn(&str) -> Result<Range, String> + Clone + Send + Sync {
    move |text| {
        let number = |part: &str| {
            part.trim()
                .parse::<u32>()
                .map_err(|_| format!("{part:?} is not a whole number"))
        };
        let (lo, hi) = match text.split_once('-') {
            Some((lo, hi)) => (number(lo)?, number(hi)?),
            None => {
                let n = number(text)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(format!("{lo} is above {hi}: a range is LO-HI"));
        }
        if lo < min || hi > max {
            return Err(format!("must lie within {min}-{max}"));
        }
        Ok((lo, hi))
    }
}

/// A parser of a number within `min..=max`.
fn between(min: f64, max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |text| match text.parse::<f64>() {
        Ok(x) if (min..=max).contains(&x) => Ok(x),
        _ => Err(format!("must be a number from {min} to {max}")),
    }
}

/// A share above 0 and at most 1.
fn share_above_zero(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err("must be above 0 and at most 1".to_owned()),
    }
}

/// The first flag given of a shape's knobs, by name.
fn first_given(flags: &[(&'static str, bool)]) -> Option<&'static str> {
    flags
        .iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| *flag)
}

impl WorkloadArgs {
    /// The workload the flags describe, at the default rate; a shape's knob given
    /// with another shape is refused.
    fn workload(&self) -> anyhow::Result<Workload> {
        let (c, b, a, d) = (
            &self.conversations,
            &self.bursts,
            &self.agents,
            &self.documents,
        );
        let knobs = [
            (
                "conversations or bursts",
                matches!(self.shape, Shape::Conversations | Shape::Bursts),
                first_given(&[
                    ("--system-prompts", c.system_prompts.is_some()),
                    ("--max-turns", c.max_turns.is_some()),
                    ("--think-ms", c.think_ms.is_some()),
                ]),
            ),
            (
                "bursts",
                self.shape == Shape::Bursts,
                first_given(&[
                    ("--burst-size", b.burst_size.is_some()),
                    ("--burst-window-ms", b.burst_window_ms.is_some()),
                    ("--burst-share", b.burst_share.is_some()),
                    ("--burst-prefix-tokens", b.burst_prefix_tokens.is_some()),
                    ("--burst-suffix-tokens", b.burst_suffix_tokens.is_some()),
                ]),
            ),
            (
                "agents",
                self.shape == Shape::Agents,
                first_given(&[
                    ("--tool-prompts", a.tool_prompts.is_some()),
                    ("--tool-prompt-tokens", a.tool_prompt_tokens.is_some()),
                    ("--agent-turns", a.agent_turns.is_some()),
                    ("--tool-result-tokens", a.tool_result_tokens.is_some()),
                    ("--subagent-share", a.subagent_share.is_some()),
                    ("--subagents", a.subagents.is_some()),
                    ("--subagent-turns", a.subagent_turns.is_some()),
                    ("--tool-ms", a.tool_ms.is_some()),
                ]),
            ),
            (
                "documents",
                self.shape == Shape::Documents,
                first_given(&[
                    ("--documents", d.documents.is_some()),
                    ("--document-tokens", d.document_tokens.is_some()),
                    ("--question-tokens", d.question_tokens.is_some()),
                    ("--answer-tokens", d.answer_tokens.is_some()),
                ]),
            ),
        ];
        for (shapes, applies, given) in knobs {
            if let (false, Some(flag)) = (applies, given) {
                anyhow::bail!("{flag} is a knob of --shape {shapes}");
            }
        }
        let popularity = match self.popularity {
            PopularityArg::Zipf => Popularity::Zipf,
            PopularityArg::Uniform => Popularity::Uniform,
        };
        let conversations = {
            let default = SharedPrefixWorkload::default();
            SharedPrefixWorkload {
                seed: self.seed,
                requests: self.requests,
                system_prompts: c.system_prompts.unwrap_or(default.system_prompts),
                popularity,
                turns: (1, c.max_turns.unwrap_or(default.turns.1)),
                think_ms: c.think_ms.unwrap_or(default.think_ms),
                ..default
            }
        };
        Ok(match self.shape {
            Shape::Conversations => Workload::Conversations(conversations),
            Shape::Bursts => {
                let default = BurstWorkload::default();
                Workload::Bursts(BurstWorkload {
                    seed: self.seed,
                    requests: self.requests,
                    burst_share: b.burst_share.unwrap_or(default.burst_share),
                    burst_size: b.burst_size.unwrap_or(default.burst_size),
                    window_us: b
                        .burst_window_ms
                        .map_or(default.window_us, |ms| (ms * 1000.0) as u64),
                    prefix_tokens: b.burst_prefix_tokens.unwrap_or(default.prefix_tokens),
                    suffix_tokens: b.burst_suffix_tokens.unwrap_or(default.suffix_tokens),
                    background: conversations,
                    ..default
                })
            }
            Shape::Agents => {
                let default = AgentWorkload::default();
                Workload::Agents(AgentWorkload {
                    seed: self.seed,
                    requests: self.requests,
                    tool_prompts: a.tool_prompts.unwrap_or(default.tool_prompts),
                    popularity,
                    tool_prompt_tokens: a.tool_prompt_tokens.unwrap_or(default.tool_prompt_tokens),
                    turns: a.agent_turns.unwrap_or(default.turns),
                    result_tokens: a.tool_result_tokens.unwrap_or(default.result_tokens),
                    subagent_share: a.subagent_share.unwrap_or(default.subagent_share),
                    subagents: a.subagents.unwrap_or(default.subagents),
                    subagent_turns: a.subagent_turns.unwrap_or(default.subagent_turns),
                    tool_ms: a.tool_ms.unwrap_or(default.tool_ms),
                    ..default
                })
            }
            Shape::Documents => {
                let default = DocumentWorkload::default();
                Workload::Documents(DocumentWorkload {
                    seed: self.seed,
                    requests: self.requests,
                    documents: d.documents.unwrap_or(default.documents),
                    popularity,
                    document_tokens: d.document_tokens.unwrap_or(default.document_tokens),
                    question_tokens: d.question_tokens.unwrap_or(default.question_tokens),
                    output_tokens: d.answer_tokens.unwrap_or(default.output_tokens),
                    ..default
                })
            }
        })
    }
}

/// How much faster than the uncached capacity an overloaded replay first sends
/// requests.
const OVERLOAD: f64 = 4.0;
/// An overloaded replay whose throughput reaches this share of the rate sent was not
/// overloaded: the rate is doubled and the replay run again.
const SATURATED_BELOW: f64 = 0.9;
/// The fastest an overloaded replay sends, as a multiple of the uncached capacity.
const MAX_OVERLOAD: f64 = 64.0;

pub(crate) fn run(args: &WorkloadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.load.is_finite() && args.load > 0.0 && args.load <= 100.0,
        "--load must be above 0 and at most 100"
    );
    anyhow::ensure!(
        args.requests <= router_replay::MAX_REQUESTS,
        "--requests must be at most {}",
        router_replay::MAX_REQUESTS
    );
    let mut workload = args.workload()?;
    let config = match &args.config {
        Some(path) => Some(read_config(path)?),
        None => None,
    };
    let (engines, page_size) = match &config {
        Some(config) => (
            config
                .models
                .iter()
                .flat_map(|m| &m.engines)
                .map(|e| u64::from(e.dp_size.unwrap_or(1).max(1)))
                .sum::<u64>(),
            config.models.first().map_or(16, |m| m.block_size),
        ),
        None => (u64::from(args.engines), args.page_size),
    };
    anyhow::ensure!(engines > 0, "the fleet has no engine");
    let feeds = FeedSettings {
        kv_delay: Duration::from_millis(1),
        lagging: LaggingFeeds::default(),
    };
    let settings = args.engine.settings(page_size, feeds, 0)?;
    let spec = settings.engine;
    // Sizes do not depend on the rate: draw them once to find the capacity.
    let uncached = engines as f64 * uncached_capacity(&checked(workload.generate())?, &spec);
    let capacity = match &config {
        None => {
            eprintln!("capacity with nothing cached: {uncached:.1} requests/s");
            uncached
        }
        Some(config) => {
            let mut sent = OVERLOAD * uncached;
            loop {
                workload.set_requests_per_sec(sent);
                let overloaded = workload.generate();
                let measured = replay(config, &overloaded, Some(&args.capacity_policy), &settings)?
                    .summary(&args.capacity_policy, 0)
                    .requests_per_sec;
                eprintln!(
                    "capacity under {}: {measured:.1} requests/s (sent {sent:.1}/s; {uncached:.1}/s with nothing cached)",
                    args.capacity_policy
                );
                if measured < SATURATED_BELOW * sent || sent >= MAX_OVERLOAD * uncached {
                    break measured;
                }
                eprintln!("  not overloaded: sending twice as fast");
                sent *= 2.0;
            }
        }
    };
    workload.set_requests_per_sec(args.load * capacity);
    eprintln!(
        "generating {} requests at {:.1}/s",
        args.requests,
        workload.requests_per_sec()
    );
    let trace = checked(workload.generate())?;
    if let Some(last) = trace.last() {
        anyhow::ensure!(
            last.at_us <= router_replay::MAX_AT_US,
            "the trace would run past 30 days at {:.3} requests/s: raise --load",
            workload.requests_per_sec()
        );
    }
    let out = std::fs::File::create(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    write_trace(BufWriter::new(out), &trace)
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

/// `trace`, if every prompt fits a trace's bound.
fn checked(trace: Vec<TraceRequest>) -> anyhow::Result<Vec<TraceRequest>> {
    if let Some(long) = trace
        .iter()
        .map(TraceRequest::prompt_tokens)
        .find(|tokens| *tokens > router_replay::MAX_PROMPT_TOKENS)
    {
        anyhow::bail!(
            "a prompt would be {long} tokens, above a trace's {}: lower the lengths or turns",
            router_replay::MAX_PROMPT_TOKENS
        );
    }
    Ok(trace)
}

//! `switchyard replay` and `switchyard workload`: a trace through the real selection
//! code on a virtual clock, and the shared-prefix workload that makes one.

use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use engine_sim::EngineSpec;
use router_config::RouterConfig;
use router_replay::{
    Arrivals, HostTier, LaggingFeeds, ReplaySettings, SharedPrefixWorkload, Summary,
    oracle_cached_tokens, read_trace, replay, table, uncached_capacity, write_trace,
};

/// How the modelled engines run: engine-sim's model, the same for every engine.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EngineModelArgs {
    /// Requests each engine rank runs at once; the rest wait in arrival order.
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Uncached prompt tokens prefilled per second: per request, or per rank with
    /// `--serial-prefill`.
    #[arg(long, default_value_t = 40_000.0)]
    prefill_tokens_per_sec: f64,
    /// Prefill one request at a time per rank, as a GPU whose prefill throughput its
    /// requests share.
    #[arg(long)]
    serial_prefill: bool,
    /// Output tokens generated per second per request.
    #[arg(long, default_value_t = 1_000.0)]
    decode_tokens_per_sec: f64,
    /// KV-cache capacity per engine rank, tokens.
    #[arg(long, default_value_t = 1 << 20)]
    kv_capacity_tokens: u64,
    /// Pages each rank keeps in a host-memory tier, written through from the device
    /// cache and loaded back when a prompt's prefix continues there (0: no host tier).
    #[arg(long, default_value_t = 0)]
    host_tier_pages: usize,
    /// Time to load a host page back, as a share of the time to prefill it.
    #[arg(long, default_value_t = 0.1)]
    host_load_cost: f64,
}

/// How the engines' KV events reach the router.
#[derive(Debug, Clone, Copy)]
struct FeedSettings {
    kv_delay: Duration,
    lagging: LaggingFeeds,
}

impl EngineModelArgs {
    /// The engines' spec and the replay's settings, checked.
    fn settings(
        &self,
        page_size: u32,
        feeds: FeedSettings,
        seed: u64,
    ) -> anyhow::Result<ReplaySettings> {
        let settings = ReplaySettings {
            engine: self.spec(page_size),
            host_tier: HostTier {
                pages: self.host_tier_pages,
                load_cost: self.host_load_cost,
            },
            kv_delay: feeds.kv_delay,
            lagging_feeds: feeds.lagging,
            silent_kv_engines: 0,
            arrivals: Arrivals::Open,
            seed,
        };
        settings.check()?;
        Ok(settings)
    }

    fn spec(&self, page_size: u32) -> EngineSpec {
        EngineSpec {
            max_running_requests: self.slots,
            prefill_tokens_per_sec: self.prefill_tokens_per_sec,
            decode_tokens_per_sec: self.decode_tokens_per_sec,
            kv_capacity_tokens: self.kv_capacity_tokens,
            page_size,
            dp_size: 1,
            serial_prefill: self.serial_prefill,
        }
    }
}

/// Options of `switchyard replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// The trace: JSON lines, one request each, in arrival order.
    #[arg(long)]
    trace: PathBuf,
    /// The router configuration (YAML) whose engines, buckets and policies route it.
    #[arg(long)]
    config: PathBuf,
    /// Replay once per policy type, every group running it (default: once, as
    /// configured).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    #[command(flatten)]
    engines: EngineModelArgs,
    /// Time a KV-event batch takes from an engine to the router, milliseconds.
    #[arg(long, default_value_t = 1)]
    kv_delay_ms: u64,
    /// How many engines (the first configured) have a KV feed that lags.
    #[arg(long, default_value_t = 0)]
    lagging_feeds: usize,
    /// Time a KV-event batch takes from a lagging engine, milliseconds.
    #[arg(long, default_value_t = 0)]
    lagging_delay_ms: u64,
    /// Seed of the policies that draw random numbers and name no seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the summaries, with TTFT percentiles, as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl ReplayArgs {
    fn feeds(&self) -> FeedSettings {
        FeedSettings {
            kv_delay: Duration::from_millis(self.kv_delay_ms),
            lagging: LaggingFeeds {
                engines: self.lagging_feeds,
                delay: Duration::from_millis(self.lagging_delay_ms),
            },
        }
    }
}

pub(crate) fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let config = read_config(&args.config)?;
    let page_size = config.models.first().map_or(16, |m| m.block_size);
    let file = std::fs::File::open(&args.trace)
        .with_context(|| format!("opening {}", args.trace.display()))?;
    let trace = read_trace(BufReader::new(file))
        .with_context(|| format!("reading {}", args.trace.display()))?;
    let settings = args.engines.settings(page_size, args.feeds(), args.seed)?;
    let oracle = oracle_cached_tokens(&trace, page_size);
    let policies: Vec<Option<&str>> = if args.policies.is_empty() {
        vec![None]
    } else {
        args.policies.iter().map(|p| Some(p.as_str())).collect()
    };
    let mut summaries: Vec<Summary> = Vec::new();
    for policy in policies {
        let name = policy.unwrap_or("config");
        eprintln!("replaying {} requests with {name} ...", trace.len());
        let started = tokio::time::Instant::now();
        let report = replay(&config, &trace, policy, &settings)?;
        eprintln!("  {name}: done in {:.1} s", started.elapsed().as_secs_f64());
        summaries.push(report.summary(name, oracle));
    }
    print!("{}", table(&summaries));
    if let Some(path) = &args.json {
        let out =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        serde_json::to_writer_pretty(BufWriter::new(out), &summaries)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

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
    /// Distinct system prompts (Zipf popularity).
    #[arg(long, default_value_t = 64)]
    system_prompts: u32,
    /// Most turns per conversation (each has 1 to this many).
    #[arg(long, default_value_t = 6)]
    max_turns: u32,
    /// Mean think time between an answer and the next turn, milliseconds.
    #[arg(long, default_value_t = 2000.0)]
    think_ms: f64,
    /// Arrival rate as a share of the fleet's capacity: by default the capacity with
    /// nothing cached; with `--config`, the throughput `--capacity-policy` reaches
    /// when the fleet is overloaded.
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

/// How much faster than the uncached capacity an overloaded replay sends requests.
const OVERLOAD: f64 = 4.0;

/// The most system prompts a workload draws from.
const MAX_SYSTEM_PROMPTS: u32 = 100_000;
/// The most turns a conversation has.
const MAX_TURNS: u32 = 64;
/// The longest mean think time, milliseconds (an hour).
const MAX_THINK_MS: f64 = 3_600_000.0;

pub(crate) fn workload(args: &WorkloadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.load.is_finite() && args.load > 0.0 && args.load <= 100.0,
        "--load must be above 0 and at most 100"
    );
    anyhow::ensure!(
        (1..=MAX_TURNS).contains(&args.max_turns),
        "--max-turns must be 1 to {MAX_TURNS}"
    );
    anyhow::ensure!(
        (1..=MAX_SYSTEM_PROMPTS).contains(&args.system_prompts),
        "--system-prompts must be 1 to {MAX_SYSTEM_PROMPTS}"
    );
    anyhow::ensure!(
        args.think_ms.is_finite() && (0.0..=MAX_THINK_MS).contains(&args.think_ms),
        "--think-ms must be 0 to {MAX_THINK_MS}"
    );
    anyhow::ensure!(
        args.requests <= router_replay::MAX_REQUESTS,
        "--requests must be at most {}",
        router_replay::MAX_REQUESTS
    );
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
    let mut workload = SharedPrefixWorkload {
        seed: args.seed,
        requests: args.requests,
        system_prompts: args.system_prompts,
        turns: (1, args.max_turns),
        think_ms: args.think_ms,
        ..SharedPrefixWorkload::default()
    };
    // Sizes do not depend on the rate: draw them once to find the capacity.
    let uncached = engines as f64 * uncached_capacity(&workload.generate(), &spec);
    let capacity = match &config {
        None => {
            eprintln!("capacity with nothing cached: {uncached:.1} requests/s");
            uncached
        }
        Some(config) => {
            workload.requests_per_sec = OVERLOAD * uncached;
            let overloaded = workload.generate();
            let measured = replay(config, &overloaded, Some(&args.capacity_policy), &settings)?
                .summary(&args.capacity_policy, 0)
                .requests_per_sec;
            eprintln!(
                "capacity under {}: {measured:.1} requests/s (sent {:.1}/s; {uncached:.1}/s with nothing cached)",
                args.capacity_policy, workload.requests_per_sec
            );
            measured
        }
    };
    workload.requests_per_sec = args.load * capacity;
    eprintln!(
        "generating {} requests at {:.1}/s",
        args.requests, workload.requests_per_sec
    );
    let trace = workload.generate();
    if let Some(last) = trace.last() {
        anyhow::ensure!(
            last.at_us <= router_replay::MAX_AT_US,
            "the trace would run past 30 days at {:.3} requests/s: raise --load",
            workload.requests_per_sec
        );
    }
    let out = std::fs::File::create(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    write_trace(BufWriter::new(out), &trace)
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

/// The configuration in `path`, its fields checked.
fn read_config(path: &std::path::Path) -> anyhow::Result<RouterConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config =
        RouterConfig::from_yaml(&text).with_context(|| format!("parsing {}", path.display()))?;
    let problems = config.check_fields();
    anyhow::ensure!(
        problems.is_empty(),
        "{}: {}",
        path.display(),
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok(config)
}

//! `switchyard replay`: a trace, or replayable decision records, through the real
//! selection code on a virtual clock, and the modelled engines `switchyard workload`
//! measures capacity on too.

use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use engine_sim::EngineSpec;
use router_config::RouterConfig;
use router_replay::{
    Arrivals, HostTier, LaggingFeeds, MAX_CLIENTS, Recorded, ReplaySettings, Summary,
    oracle_cached_tokens, read_records, read_trace, replay, siblings_on_first_engine, table,
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
pub(crate) struct FeedSettings {
    /// How long a batch takes.
    pub(crate) kv_delay: Duration,
    /// The engines whose batches take longer.
    pub(crate) lagging: LaggingFeeds,
}

impl EngineModelArgs {
    /// The engines' spec and the replay's settings (open loop, every engine
    /// publishing KV events), checked.
    pub(crate) fn settings(
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
#[command(group = clap::ArgGroup::new("input").required(true).args(["trace", "records"]))]
pub(crate) struct ReplayArgs {
    /// The trace: JSON lines, one request each, in arrival order.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Replayable decision records (`decisions.replayable`) instead of a trace; give
    /// a rotated file and the current one as two `--records`. What the records say
    /// happened is printed above the replays, as `recorded`.
    #[arg(long)]
    records: Vec<PathBuf>,
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
    /// How many engines (the first configured) publish no KV events: they cache as
    /// the others do, but the router's prefix index never hears of it.
    #[arg(long, default_value_t = 0)]
    silent_kv_engines: usize,
    /// No engine publishes KV events (`--silent-kv-engines` with every engine).
    #[arg(long, conflicts_with = "silent_kv_engines")]
    no_kv_events: bool,
    /// Send the trace's requests from N clients in a closed loop instead of at their
    /// times: each client sends its next request as soon as its previous one
    /// completed, the earliest in the trace whose session has nothing in flight
    /// (1 to 65536).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_CLIENTS as u64))]
    closed_loop: Option<u64>,
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
    let (trace, recorded) = match &args.trace {
        Some(path) => {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let trace = read_trace(BufReader::new(file))
                .with_context(|| format!("reading {}", path.display()))?;
            (trace, None)
        }
        None => {
            let recorded = records(&args.records)?;
            check_pages(&config, &recorded)?;
            (recorded.trace.clone(), Some(recorded))
        }
    };
    let mut settings = args.engines.settings(page_size, args.feeds(), args.seed)?;
    settings.silent_kv_engines = if args.no_kv_events {
        config.models.iter().map(|m| m.engines.len()).sum()
    } else {
        args.silent_kv_engines
    };
    if let Some(clients) = args.closed_loop {
        settings.arrivals = Arrivals::Closed {
            clients: clients as usize,
        };
    }
    let oracle = oracle_cached_tokens(&trace, page_size);
    let policies: Vec<Option<&str>> = if args.policies.is_empty() {
        vec![None]
    } else {
        args.policies.iter().map(|p| Some(p.as_str())).collect()
    };
    let mut summaries: Vec<Summary> = Vec::new();
    if let Some(recorded) = &recorded {
        summaries.push(recorded.happened.summary("recorded", oracle));
    }
    for policy in policies {
        let name = policy.unwrap_or("config");
        eprintln!("replaying {} requests with {name} ...", trace.len());
        let started = tokio::time::Instant::now();
        let report = replay(&config, &trace, policy, &settings)?;
        eprintln!("  {name}: done in {:.1} s", started.elapsed().as_secs_f64());
        let mut summary = report.summary(name, oracle);
        summary.siblings_on_first_engine = siblings_on_first_engine(&trace, &report);
        summaries.push(summary);
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

/// The replayable decision records in `paths`, read as one trace; what was left out
/// or stood in for is said on stderr.
fn records(paths: &[PathBuf]) -> anyhow::Result<Recorded> {
    let mut sources = Vec::new();
    for path in paths {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        sources.push(BufReader::new(file));
    }
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let recorded =
        read_records(sources).with_context(|| format!("reading {}", names.join(", ")))?;
    anyhow::ensure!(
        !recorded.trace.is_empty(),
        "{} hold no replayable record ({} records without a replay object: turn on decisions.replayable)",
        names.join(", "),
        recorded.not_replayable
    );
    let notes = [
        (
            recorded.not_replayable,
            "records without a replay object left out",
        ),
        (
            recorded.without_pages,
            "prompts without page hashes (no tokenizer) replayed as sharing nothing",
        ),
        (
            recorded.without_output,
            "answers that reported no output tokens replayed with their max_tokens, or 1",
        ),
    ];
    for (count, note) in notes {
        if count > 0 {
            eprintln!("{count} {note}");
        }
    }
    Ok(recorded)
}

/// Refuses a configuration whose models' pages the recorded pages do not make up: a
/// model's `block_size` must be a multiple of the records' page size.
fn check_pages(config: &RouterConfig, recorded: &Recorded) -> anyhow::Result<()> {
    let Some(recorded_size) = recorded.page_tokens else {
        return Ok(());
    };
    for model in &config.models {
        anyhow::ensure!(
            model.block_size.is_multiple_of(recorded_size),
            "model {:?} has pages of {} tokens, which pages of {recorded_size} tokens (the records') do not make up: replay with a block_size that is a multiple of {recorded_size}",
            model.id,
            model.block_size
        );
    }
    Ok(())
}

/// The configuration in `path`, its fields checked.
pub(crate) fn read_config(path: &std::path::Path) -> anyhow::Result<RouterConfig> {
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

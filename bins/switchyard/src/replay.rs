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
    Arrivals, Diff, HostTier, LaggingFeeds, MAX_CLIENTS, Recorded, ReplaySettings, RunReport,
    Summary, TraceRequest, calibrate, fit_capacity, oracle_cached_tokens, read_records, read_trace,
    replay, siblings_on_first_engine, table,
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
            first_token_delay: Duration::ZERO,
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

/// Options of `switchyard replay`, or its `diff`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    #[command(subcommand)]
    command: Option<ReplayCommand>,
    #[command(flatten)]
    run: RunArgs,
    /// Replay once per policy type, every group running it (default: once, as
    /// configured).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Also write the summaries, with TTFT percentiles, as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// What `switchyard replay` does besides a replay.
#[derive(Debug, clap::Subcommand)]
enum ReplayCommand {
    /// Replay one trace, or one set of decision records, with two configurations
    /// (`--config` and `--against`), and print cell by cell what changed (TTFT
    /// percentiles, cached share, load spread, refusals) and the requests whose
    /// decisions differ most.
    Diff(DiffArgs),
}

/// Options of `switchyard replay diff`.
#[derive(Debug, clap::Args)]
struct DiffArgs {
    #[command(flatten)]
    run: RunArgs,
    /// The configuration compared with `--config`'s.
    #[arg(long)]
    against: PathBuf,
    /// The requests whose decisions differ most listed, at most.
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Also write the diff (both summaries and the requests listed) as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// What a replay reads: its requests, the configuration, the modelled engines and
/// their feeds.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["trace", "records"]))]
struct RunArgs {
    /// The trace: JSON lines, one request each, in arrival order.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Replayable decision records (`decisions.replayable`) instead of a trace; give
    /// a rotated file and the current one as two `--records`. What the records say
    /// happened is printed above the replays, as `recorded`.
    #[arg(long)]
    records: Vec<PathBuf>,
    /// The router configuration (YAML) whose engines, buckets and policies route it.
    /// (Optional to clap only so that `replay diff` parses without `replay`'s own.)
    #[arg(long, required = true)]
    config: Option<PathBuf>,
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
    /// Fit the modelled engines to the records before replaying (prefill speed,
    /// decode pace, the first-token delay outside the engine, the KV capacity),
    /// in place of the engine flags, and print the fit and its error.
    #[arg(long)]
    calibrate: bool,
}

impl RunArgs {
    /// Refuses flags that do not go together, before anything is read.
    fn check(&self) -> anyhow::Result<()> {
        if self.calibrate && self.records.is_empty() {
            anyhow::bail!("--calibrate fits the engines to decision records: give --records");
        }
        if self.calibrate && self.closed_loop.is_some() {
            anyhow::bail!(
                "--calibrate fits a first-token delay, which a closed loop's clients would not wait for: replay calibrated records at their times"
            );
        }
        Ok(())
    }

    /// `--config`, which clap requires.
    fn config(&self) -> anyhow::Result<&std::path::Path> {
        self.config
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--config is required"))
    }

    fn feeds(&self) -> FeedSettings {
        FeedSettings {
            kv_delay: Duration::from_millis(self.kv_delay_ms),
            lagging: LaggingFeeds {
                engines: self.lagging_feeds,
                delay: Duration::from_millis(self.lagging_delay_ms),
            },
        }
    }

    /// The requests: the trace's, or the records' with what they say happened (their
    /// pages checked against the models of each of `configs`).
    fn requests(
        &self,
        configs: &[&RouterConfig],
    ) -> anyhow::Result<(Vec<TraceRequest>, Option<Recorded>)> {
        match &self.trace {
            Some(path) => {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                let trace = read_trace(BufReader::new(file))
                    .with_context(|| format!("reading {}", path.display()))?;
                Ok((trace, None))
            }
            None => {
                let mut recorded = records(&self.records)?;
                for config in configs {
                    check_pages(config, &recorded)?;
                }
                Ok((std::mem::take(&mut recorded.trace), Some(recorded)))
            }
        }
    }

    /// [`settings`](Self::settings), fitted to `recorded` when `--calibrate` asks,
    /// with the records replayed through `config` (the configuration that recorded
    /// them); the fit is printed.
    fn calibrated(
        &self,
        config: &RouterConfig,
        trace: &[TraceRequest],
        recorded: Option<&Recorded>,
    ) -> anyhow::Result<ReplaySettings> {
        let settings = self.settings(config)?;
        let (true, Some(recorded)) = (self.calibrate, recorded) else {
            return Ok(settings);
        };
        let fitted = calibrate(recorded).context("calibrating to the records")?;
        let mut settings = fitted.apply(&settings);
        let oracle = oracle_cached_tokens(trace, page_size(config));
        let cached = recorded.happened.summary("recorded", oracle).cached_share;
        eprintln!("fitting the KV capacity to the records' cached share ...");
        let (capacity, share) = fit_capacity(config, trace, &settings, cached)?;
        settings.engine.kv_capacity_tokens = capacity;
        settings.check()?;
        println!(
            "calibrated to {} streamed answers:\n  prefill            {:.0} tokens/s\n  first-token delay  {:.1} ms (outside the engine)\n  decode             {}\n  KV capacity        {capacity} tokens a rank (cached share {:.1}% replayed, {:.1}% recorded)\n  fit error          {:.1}% (median, time to first token)\n",
            fitted.answers,
            fitted.prefill_tokens_per_sec,
            settings.first_token_delay.as_secs_f64() * 1e3,
            fitted.decode_tokens_per_sec.map_or_else(
                || "not fitted (no answer of two tokens or more)".to_owned(),
                |rate| format!("{rate:.0} tokens/s"),
            ),
            share * 100.0,
            cached * 100.0,
            fitted.ttft_error * 100.0,
        );
        Ok(settings)
    }

    /// The replay's settings for `config`, checked.
    fn settings(&self, config: &RouterConfig) -> anyhow::Result<ReplaySettings> {
        let mut settings = self
            .engines
            .settings(page_size(config), self.feeds(), self.seed)?;
        settings.silent_kv_engines = if self.no_kv_events {
            config.models.iter().map(|m| m.engines.len()).sum()
        } else {
            self.silent_kv_engines
        };
        if let Some(clients) = self.closed_loop {
            settings.arrivals = Arrivals::Closed {
                clients: clients as usize,
            };
        }
        Ok(settings)
    }
}

/// The page size of `config`'s engines: its first model's.
fn page_size(config: &RouterConfig) -> u32 {
    config.models.first().map_or(16, |m| m.block_size)
}

pub(crate) fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    if let Some(ReplayCommand::Diff(diff)) = &args.command {
        return run_diff(diff);
    }
    let run = &args.run;
    run.check()?;
    let config = read_config(run.config()?)?;
    let (trace, recorded) = run.requests(&[&config])?;
    let settings = run.calibrated(&config, &trace, recorded.as_ref())?;
    let oracle = oracle_cached_tokens(&trace, page_size(&config));
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
        serde_json::to_writer_pretty(json_file(path)?, &summaries)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `switchyard replay diff`: the same requests through two configurations.
fn run_diff(args: &DiffArgs) -> anyhow::Result<()> {
    let run = &args.run;
    run.check()?;
    let configs = [read_config(run.config()?)?, read_config(&args.against)?];
    let (trace, recorded) = run.requests(&[&configs[0], &configs[1]])?;
    // The engines are the same in both runs: fitted once, through `--config`.
    let calibrated = run.calibrated(&configs[0], &trace, recorded.as_ref())?;
    let paths = [run.config()?, args.against.as_path()];
    // Each run by its file's name, or its path when the two names are one.
    let names = paths.map(|path| {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    });
    let names = if names[0] == names[1] {
        paths.map(|path| path.display().to_string())
    } else {
        names
    };
    let mut runs = Vec::new();
    for (config, name) in configs.iter().zip(&names) {
        eprintln!("replaying {} requests with {name} ...", trace.len());
        let mut settings = run.settings(config)?;
        if run.calibrate {
            let page_size = settings.engine.page_size;
            settings.engine = EngineSpec {
                page_size,
                ..calibrated.engine
            };
            settings.first_token_delay = calibrated.first_token_delay;
        }
        let report = replay(config, &trace, None, &settings)?;
        let summary = report.summary(name, oracle_cached_tokens(&trace, page_size(config)));
        runs.push((summary, report));
    }
    let [(before, before_run), (after, after_run)]: [(Summary, RunReport); 2] =
        runs.try_into().map_err(|_| anyhow::anyhow!("two runs"))?;
    let diff = Diff::of(&trace, (before, after), &before_run, &after_run, args.top);
    print!("{}", diff.table());
    if let Some(path) = &args.json {
        serde_json::to_writer_pretty(json_file(path)?, &diff)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The file `--json` names, created.
fn json_file(path: &std::path::Path) -> anyhow::Result<BufWriter<std::fs::File>> {
    let out =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    Ok(BufWriter::new(out))
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

/// Refuses a configuration whose models' pages the recorded pages do not make up: the
/// `block_size` of each model the records name (the only one, for records naming
/// none) must be a multiple of the records' page size.
fn check_pages(config: &RouterConfig, recorded: &Recorded) -> anyhow::Result<()> {
    let Some(recorded_size) = recorded.page_tokens else {
        return Ok(());
    };
    let named: std::collections::HashSet<Option<&str>> =
        recorded.trace.iter().map(|r| r.model.as_deref()).collect();
    let replayed = config.models.iter().filter(|model| {
        named.contains(&Some(model.id.as_str()))
            || (config.models.len() == 1 && named.contains(&None))
    });
    for model in replayed {
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

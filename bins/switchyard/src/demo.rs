//! `switchyard demo`: simulated engines, the real router on a local port, a
//! multi-turn shared-prefix chat workload over HTTP, and a report; then the routing
//! policies compared on a replayed workload, as bars and in an HTML report.

mod compare;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use engine_sim::{EngineRole as SimRole, RunningEngine, SimConfig, SimEngine};
use futures_util::StreamExt;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use router_config::{EngineConfig, EngineRole, ModelConfig, RouterConfig};
use router_http::RunningRouter;
use router_state::kv_events::KvFeedStats;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio::time::{Instant, interval};

/// Options of `switchyard demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Conversations in the workload.
    #[arg(long, default_value_t = 120)]
    conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Conversations in flight at once.
    #[arg(long, default_value_t = 24)]
    concurrency: usize,
    /// Seed of the workload.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Keep the router and engines running after the report, with commands to try.
    #[arg(long)]
    serve: bool,
    /// Router port (0 = any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Requests of the replayed policy comparison (0 = no comparison).
    #[arg(long, default_value_t = 20_000)]
    compare_requests: usize,
    /// Where to write the HTML report (the live run and the comparison's bars).
    #[arg(long, default_value = "switchyard-demo-report.html")]
    report: std::path::PathBuf,
}

/// `(model, engine id, role, running slots)` of the demo fleet.
const FLEET: &[(&str, &str, SimRole, u32)] = &[
    ("demo-chat", "A1", SimRole::Plain, 8),
    ("demo-chat", "A2", SimRole::Plain, 8),
    ("demo-chat", "A3", SimRole::Plain, 16),
    ("demo-chat", "A4", SimRole::Plain, 8),
    ("demo-pd", "P1", SimRole::Prefill, 8),
    ("demo-pd", "D1", SimRole::Decode, 8),
    ("demo-pd", "P2", SimRole::Prefill, 16),
    ("demo-pd", "D2", SimRole::Decode, 16),
];

/// The demo's buckets, in the schema operators write: short prompts on a small
/// group that routes by prefix cache with a waiting-queue cap, everything else (and
/// the overflow) on the rest.
const BUCKETS: &[(&str, &str)] = &[
    (
        "demo-chat",
        r#"[{"id": "short", "limits": {"max": 8000}, "max_context_tokens": 12000,
             "groups": {"plain": {"engine_ids": ["A1", "A2", "A4"],
                                  "policy": {"type": "cache_aware", "min_matched_tokens": 256,
                                             "admission": {"max_waiting_requests": 2}}}}},
            {"id": "long", "groups": {"plain": {"engine_ids": ["A3"], "policy": {"type": "load_based"}}}}]"#,
    ),
    (
        "demo-pd",
        r#"[{"id": "short", "limits": {"max": 8000}, "max_context_tokens": 12000,
             "groups": {"pd": {"prefill": {"engine_ids": ["P1"], "policy": {"type": "power_of_two", "admission": {"max_waiting_requests": 2}}},
                               "decode": {"engine_ids": ["D1"]}}}},
            {"id": "long", "groups": {"pd": {"prefill": {"engine_ids": ["P2"]}, "decode": {"engine_ids": ["D2"]}}}}]"#,
    ),
];

/// The tokenizer the demo's router and engines share (one token per byte), so the
/// router's prefix hashes meet the engines' KV events.
const TOKENIZER: &str = include_str!("../../../testdata/tokenizer-bytes/tokenizer.json");
const TOKENIZER_CONFIG: &str =
    include_str!("../../../testdata/tokenizer-bytes/tokenizer_config.json");

/// Longest a conversation waits for the router to index its last turn's KV events.
const INDEX_WAIT: Duration = Duration::from_secs(5);

/// The KV-event feeds the router follows (the engines of models it keeps a prefix
/// index for), to wait for after each turn.
struct Feeds {
    stats: Arc<KvFeedStats>,
    engines: Vec<Arc<SimEngine>>,
}

impl Feeds {
    fn of(router: &RunningRouter, fleet: &[(&str, &str, SimRole, RunningEngine)]) -> Self {
        let routing = router.context().fleet();
        Self {
            stats: Arc::clone(routing.kv_stats()),
            engines: fleet
                .iter()
                .filter(|(model, ..)| routing.prefix_index(model).is_some())
                .map(|(.., engine)| Arc::clone(engine.engine()))
                .collect(),
        }
    }

    /// Waits until the router has applied every KV-event batch these engines had
    /// published, so the next turn is routed on an index that holds the turns before
    /// it, as a client pausing between turns would see; a feed lagging longer than
    /// `INDEX_WAIT` does not hold the workload up.
    async fn indexed(&self) {
        let published: u64 = self.engines.iter().map(|e| e.published_batches()).sum();
        let caught_up = async {
            loop {
                let seen = self.stats.steps();
                if self.stats.applied() >= published {
                    return;
                }
                self.stats.steps_after(seen).await;
            }
        };
        let _ = tokio::time::timeout(INDEX_WAIT, caught_up).await;
    }
}

/// A temporary directory holding the demo's tokenizer, removed when dropped.
struct TokenizerDir(std::path::PathBuf);

impl TokenizerDir {
    fn create() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("switchyard-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = Self(dir);
        std::fs::write(dir.0.join("tokenizer.json"), TOKENIZER)?;
        std::fs::write(dir.0.join("tokenizer_config.json"), TOKENIZER_CONFIG)?;
        Ok(dir)
    }

    fn tokenizer(&self) -> std::path::PathBuf {
        self.0.join("tokenizer.json")
    }
}

impl Drop for TokenizerDir {
    fn drop(&mut self) {
        drop(std::fs::remove_dir_all(&self.0));
    }
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.concurrency > 0 && args.turns > 0,
        "--concurrency and --turns must be at least 1"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(drive(args))
}

async fn start_fleet(
    tokenizer: &std::path::Path,
) -> anyhow::Result<Vec<(&'static str, &'static str, SimRole, RunningEngine)>> {
    let mut fleet = Vec::new();
    for &(model, id, role, slots) in FLEET {
        let mut config = SimConfig::for_tests();
        config.tokenizer = Some(tokenizer.to_owned());
        config.replay_port = Some(0);
        config.model = model.into();
        config.role = role;
        config.max_running_requests = slots;
        config.prefill_tokens_per_sec = 100_000.0;
        config.decode_tokens_per_sec = 1_000.0;
        config.kv_port = Some(0);
        config.load_port = Some(0);
        if role == SimRole::Prefill {
            config.bootstrap_port = Some(0);
        }
        let engine = engine_sim::start(config)
            .await
            .with_context(|| format!("starting simulated engine {id}"))?;
        fleet.push((model, id, role, engine));
    }
    Ok(fleet)
}

fn router_config(
    fleet: &[(&str, &str, SimRole, RunningEngine)],
    tokenizer: &std::path::Path,
    port: u16,
) -> anyhow::Result<RouterConfig> {
    let mut models = Vec::new();
    for &(model, buckets) in BUCKETS {
        let engines = fleet
            .iter()
            .filter(|f| f.0 == model)
            .map(|(_, id, role, engine)| EngineConfig {
                role: Some(match role {
                    SimRole::Plain => EngineRole::Plain,
                    SimRole::Prefill => EngineRole::Prefill,
                    SimRole::Decode => EngineRole::Decode,
                }),
                ..EngineConfig::new(*id, engine.url())
            })
            .collect();
        models.push(ModelConfig {
            buckets: Some(serde_json::from_str(buckets).context("demo buckets")?),
            tokenizer: Some(tokenizer.to_owned()),
            ..ModelConfig::new(model, engines)
        });
    }
    let mut config = RouterConfig::new(models);
    config.listen = ([127, 0, 0, 1], port).into();
    Ok(config)
}

async fn drive(args: DemoArgs) -> anyhow::Result<()> {
    let tokenizer = TokenizerDir::create()?;
    let fleet = start_fleet(&tokenizer.tokenizer()).await?;
    let router = router_http::start(router_config(&fleet, &tokenizer.tokenizer(), args.port)?)
        .await
        .context("starting the router")?;
    let base = format!("http://{}", router.addr());
    let total = args.conversations * args.turns;
    println!(
        "switchyard demo: {} simulated engines (demo-chat: plain, short prompts routed by prefix cache; demo-pd: prefill/decode), router at {base}\n\
         workload: {} conversations x {} turns sharing system prompts, {} at a time",
        fleet.len(),
        args.conversations,
        args.turns,
        args.concurrency
    );
    let report = Arc::new(Mutex::new(Report::default()));
    let feeds = Arc::new(Feeds::of(&router, &fleet));
    let next = Arc::new(Mutex::new(0usize));
    let progress = tokio::spawn(show_progress(Arc::clone(&report), total));
    let started = Instant::now();
    let client = reqwest::Client::new();
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (client, base, report, feeds, next) = (
                client.clone(),
                base.clone(),
                Arc::clone(&report),
                Arc::clone(&feeds),
                Arc::clone(&next),
            );
            let (conversations, turns, seed) = (args.conversations, args.turns, args.seed);
            tokio::spawn(async move {
                loop {
                    let conversation = {
                        let mut n = next.lock().await;
                        if *n == conversations {
                            return;
                        }
                        *n += 1;
                        *n - 1
                    };
                    converse(&client, &base, conversation, turns, seed, &report, &feeds).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await?;
    }
    progress.abort();
    let report = report.lock().await;
    eprintln!("\r{}", progress_bar(report.finished(), total));
    let mut live = report.text(started.elapsed());
    match picks_by_reason(&client, &base).await {
        Ok(reasons) => {
            live.push_str("picks by reason (router metrics):\n");
            for (reason, count) in reasons {
                let _ = writeln!(live, "  {reason:<30} {count:>6}");
            }
        }
        Err(e) => {
            let _ = writeln!(live, "picks by reason: unavailable ({e})");
        }
    }
    print!("{live}");
    if args.compare_requests > 0 {
        let (requests, seed) = (args.compare_requests, args.seed);
        let comparison =
            tokio::task::spawn_blocking(move || compare::run(requests, seed)).await??;
        comparison.print();
        comparison.write_html(&args.report, &live)?;
        println!("\nreport: {}", args.report.display());
    }
    if args.serve {
        print_try_it(&base);
        crate::sim_engine::shutdown_signal().await;
    }
    router.shutdown().await;
    for (_, _, _, engine) in fleet {
        engine.shutdown().await;
    }
    Ok(())
}

/// One multi-turn conversation: every turn resends the history plus a new message,
/// so later turns share ever longer prefixes with earlier ones. Each turn waits until
/// the router has indexed the KV events of the turns before it.
async fn converse(
    client: &reqwest::Client,
    base: &str,
    conversation: usize,
    turns: usize,
    seed: u64,
    report: &Mutex<Report>,
    feeds: &Feeds,
) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ conversation as u64);
    let model = if conversation % 5 < 3 {
        "demo-chat"
    } else {
        "demo-pd"
    };
    let system_words = if rng.next_u32() % 4 == 0 { 1200 } else { 300 };
    let system = words(&format!("sys{}", conversation % 6), system_words);
    let mut messages = vec![json!({"role": "system", "content": system})];
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": words(&format!("c{conversation}t{turn}"), 20 + rng.next_u32() as usize % 60)}));
        let body = json!({
            "model": model, "messages": messages, "max_tokens": 16 + rng.next_u32() % 48,
            "stream": true, "stream_options": {"include_usage": true},
        });
        if turn > 0 {
            feeds.indexed().await;
        }
        let outcome = one_turn(client, base, &body).await;
        let mut report = report.lock().await;
        match outcome {
            Ok(turn) => {
                messages.push(json!({"role": "assistant", "content": turn.text.clone()}));
                report.record(model, turn);
            }
            Err(error) => {
                *report.errors.entry(error).or_default() += 1;
                return;
            }
        }
    }
}

struct Turn {
    bucket: String,
    engines: Vec<String>,
    text: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft: Duration,
}

async fn one_turn(client: &reqwest::Client, base: &str, body: &Value) -> Result<Turn, String> {
    let sent = Instant::now();
    let response = client
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    if !response.status().is_success() {
        let status = response.status();
        let code = response
            .json::<Value>()
            .await
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
        return Err(format!("{status} {}", code.unwrap_or_default()));
    }
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let bucket = header("x-switchyard-bucket").unwrap_or_default();
    let engines = [
        "x-switchyard-engine",
        "x-switchyard-prefill",
        "x-switchyard-decode",
    ]
    .iter()
    .filter_map(|h| header(h))
    .collect();
    let mut stream = response.bytes_stream();
    let (mut text, mut buffer, mut ttft, mut usage) =
        (String::new(), String::new(), None, Value::Null);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("stream: {e}"))?;
        ttft.get_or_insert_with(|| sent.elapsed());
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let value: Value = serde_json::from_str(data).map_err(|e| format!("bad chunk: {e}"))?;
            if let Some(content) = value["choices"][0]["delta"]["content"].as_str() {
                text.push_str(content);
            }
            if !value["usage"].is_null() {
                usage = value["usage"].clone();
            }
        }
    }
    Ok(Turn {
        bucket,
        engines,
        text,
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        ttft: ttft.unwrap_or_else(|| sent.elapsed()),
    })
}

fn words(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{prefix}w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Default)]
struct Report {
    completed: usize,
    errors: BTreeMap<String, usize>,
    buckets: BTreeMap<String, usize>,
    engines: BTreeMap<String, usize>,
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft_ms: Vec<f64>,
}

impl Report {
    fn finished(&self) -> usize {
        self.completed + self.errors.values().sum::<usize>()
    }

    fn record(&mut self, model: &str, turn: Turn) {
        self.completed += 1;
        *self
            .buckets
            .entry(format!("{model}/{}", turn.bucket))
            .or_default() += 1;
        for engine in turn.engines {
            *self.engines.entry(engine).or_default() += 1;
        }
        self.prompt_tokens += turn.prompt_tokens;
        self.cached_tokens += turn.cached_tokens;
        self.ttft_ms.push(turn.ttft.as_secs_f64() * 1000.0);
    }

    /// The report as text.
    fn text(&self, elapsed: Duration) -> String {
        let mut out = String::new();
        let errors: usize = self.errors.values().sum();
        let _ = writeln!(
            out,
            "requests: {} completed, {errors} failed in {:.2} s",
            self.completed,
            elapsed.as_secs_f64()
        );
        for (error, count) in &self.errors {
            let _ = writeln!(out, "  error {error:<28} {count:>6}");
        }
        let _ = writeln!(out, "picks by bucket:");
        for (bucket, count) in &self.buckets {
            let _ = writeln!(out, "  {bucket:<30} {count:>6}");
        }
        let _ = writeln!(out, "picks by engine:");
        for (engine, count) in &self.engines {
            let _ = writeln!(out, "  {engine:<30} {count:>6}");
        }
        let _ = writeln!(
            out,
            "prompt tokens: {}, of which cached at the engines: {} ({:.1}%)",
            self.prompt_tokens,
            self.cached_tokens,
            100.0 * self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
        );
        let mut ttft = self.ttft_ms.clone();
        ttft.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            ttft.get(((ttft.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let _ = writeln!(
            out,
            "time to first token: p50 {:.1} ms, p99 {:.1} ms",
            pct(0.5),
            pct(0.99)
        );
        out
    }
}

/// Sums `switchyard_picks_total` by its `reason` label.
async fn picks_by_reason(
    client: &reqwest::Client,
    base: &str,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let mut reasons = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("switchyard_picks_total{"))
    {
        let reason = line
            .split("reason=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        let count = line.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok());
        if let (Some(reason), Some(count)) = (reason, count) {
            *reasons.entry(reason.to_owned()).or_default() += count as u64;
        }
    }
    Ok(reasons)
}

fn print_try_it(base: &str) {
    println!(
        "\nThe router and engines keep running; try (Ctrl-C stops):\n\n\
         curl -s {base}/v1/chat/completions -H 'content-type: application/json' \\\n  \
         -d '{{\"model\": \"demo-chat\", \"messages\": [{{\"role\": \"user\", \"content\": \"hello\"}}]}}'\n\n\
         python3 -c 'from openai import OpenAI; c = OpenAI(base_url=\"{base}/v1\", api_key=\"-\"); \
         print(c.chat.completions.create(model=\"demo-pd\", messages=[{{\"role\": \"user\", \"content\": \"hi\"}}]).choices[0].message.content)'\n\n\
         curl -s {base}/metrics | grep switchyard_picks_total\n"
    );
}

async fn show_progress(report: Arc<Mutex<Report>>, total: usize) {
    let terminal = std::io::stderr().is_terminal();
    let mut tick = interval(Duration::from_millis(if terminal { 100 } else { 1000 }));
    loop {
        tick.tick().await;
        let done = report.lock().await.finished();
        if terminal {
            eprint!("\r{}", progress_bar(done, total));
        } else {
            eprintln!("{}", progress_bar(done, total));
        }
    }
}

fn progress_bar(done: usize, total: usize) -> String {
    let filled = (done * 30).checked_div(total).unwrap_or(30).min(30);
    format!(
        "[{}{}] {done}/{total} requests",
        "#".repeat(filled),
        ".".repeat(30 - filled)
    )
}

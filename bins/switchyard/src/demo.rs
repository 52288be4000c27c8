//! `switchyard demo`: simulated engines, the real selection core, a workload, a report.
//!
//! Engines are in-process [`SimEngine`]s that publish their load as SGLang `LoadStat`
//! payloads; the router side decodes those bytes into its load table exactly as it
//! does for a real engine's feed, resolves buckets, runs the configured policies and
//! holds in-flight guards while the engines serve.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use engine_sim::{EngineSpec, Served, SimEngine, encode_load_stat};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use router_buckets::{
    BucketConfig, BucketRequest, BucketResolver, DefaultPolicies, EnginePicks, ModelRoster,
    Selection, build_resolver,
};
use router_policy::PolicyHandles;
use router_state::{EngineReportedLoadTable, LoadReport, Role, Worker, WorkerRegistry};
use tokio::sync::Mutex;
use tokio::time::{Instant, interval};

/// Options of `switchyard demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Requests in the workload.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 48)]
    concurrency: usize,
    /// Seed of the workload's random prompt and output lengths.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// The demo fleet: `(model, engine id, role, running slots)`.
const ENGINES: &[(&str, &str, Role, u32)] = &[
    ("demo-chat", "A1", Role::Plain, 8),
    ("demo-chat", "A2", Role::Plain, 8),
    ("demo-chat", "A3", Role::Plain, 16),
    ("demo-chat", "A4", Role::Plain, 16),
    ("demo-pd", "P1", Role::Prefill, 8),
    ("demo-pd", "P2", Role::Prefill, 16),
    ("demo-pd", "D1", Role::Decode, 8),
    ("demo-pd", "D2", Role::Decode, 16),
];

/// Buckets per model, in the configuration schema operators write.
const BUCKETS: &[(&str, &str)] = &[
    (
        "demo-chat",
        r#"[
        {"id": "short", "limits": {"max": 2048}, "max_context_tokens": 4096,
         "groups": {"plain": {"worker_ids": ["A1", "A2"],
                              "policy": {"type": "power_of_two", "admission": {"max_waiting_requests": 2}}}}},
        {"id": "long", "groups": {"plain": {"worker_ids": ["A3", "A4"], "policy": {"type": "load_based"}}}}]"#,
    ),
    (
        "demo-pd",
        r#"[
        {"id": "short", "limits": {"max": 2048}, "max_context_tokens": 4096,
         "groups": {"pd": {"prefill": {"worker_ids": ["P1"], "policy": {"type": "power_of_two", "admission": {"max_waiting_requests": 2}}},
                           "decode": {"worker_ids": ["D1"], "policy": {"type": "power_of_two", "admission": {"max_waiting_requests": 2}}}}}},
        {"id": "long", "groups": {"pd": {"prefill": {"worker_ids": ["P2"]}, "decode": {"worker_ids": ["D2"]}}}}]"#,
    ),
];

struct Fleet {
    registry: WorkerRegistry,
    load: Arc<EngineReportedLoadTable>,
    resolvers: BTreeMap<&'static str, BucketResolver>,
    engines: BTreeMap<&'static str, Arc<SimEngine>>,
}

impl Fleet {
    fn build() -> anyhow::Result<Self> {
        let registry = WorkerRegistry::new();
        let load = Arc::new(EngineReportedLoadTable::default());
        let mut engines = BTreeMap::new();
        for &(model, id, role, slots) in ENGINES {
            let worker = Worker::new(id, format!("sim://{id}"), model, role);
            load.register(worker.id(), worker.dp_size());
            registry.add(worker)?;
            let spec = EngineSpec {
                max_running_requests: slots,
                prefill_tokens_per_sec: 400_000.0,
                decode_tokens_per_sec: 3_000.0,
                ..EngineSpec::default()
            };
            engines.insert(id, Arc::new(SimEngine::new(spec)));
        }
        let handles = PolicyHandles::new(Arc::clone(&load));
        let mut resolvers = BTreeMap::new();
        for &(model, json) in BUCKETS {
            let configs: Vec<BucketConfig> =
                serde_json::from_str(json).context("demo bucket configuration")?;
            let roster = ModelRoster::new(
                ENGINES
                    .iter()
                    .filter(|e| e.0 == model)
                    .map(|&(_, id, role, _)| (id.into(), role)),
            );
            let resolver = build_resolver(
                Some(&configs),
                &roster,
                &DefaultPolicies::default(),
                &handles,
            )
            .with_context(|| format!("model {model}"))?;
            resolvers.insert(model, resolver);
        }
        Ok(Self {
            registry,
            load,
            resolvers,
            engines,
        })
    }

    /// Feeds every engine's `LoadStat` payload through the router's decoder into the
    /// load table, as the ZMQ load feed would.
    fn publish_load(&self) -> anyhow::Result<()> {
        let now = Instant::now();
        for (id, engine) in &self.engines {
            let report = LoadReport::decode(&encode_load_stat(&engine.load(), Some(0)))?;
            self.load.ingest(&(*id).into(), 0, report, now)?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Report {
    completed: usize,
    errors: BTreeMap<&'static str, usize>,
    buckets: BTreeMap<String, usize>,
    engines: BTreeMap<String, usize>,
    reasons: BTreeMap<&'static str, usize>,
    passed_over: usize,
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft_ms: Vec<f64>,
}

impl Report {
    fn finished(&self) -> usize {
        self.completed + self.errors.values().sum::<usize>()
    }

    fn record(&mut self, model: &str, selection: &Selection, served: &Served) {
        let pick = &selection.pick;
        self.completed += 1;
        self.passed_over += selection.passed_over.len();
        *self
            .buckets
            .entry(format!("{model}/{}", pick.bucket))
            .or_default() += 1;
        for p in pick.engines.iter() {
            *self.engines.entry(p.engine.id().to_string()).or_default() += 1;
            *self.reasons.entry(p.reason.as_str()).or_default() += 1;
        }
        self.cached_tokens += served.cached_tokens;
        self.prompt_tokens += served.prompt_tokens;
        self.ttft_ms
            .push(served.time_to_first_token.as_secs_f64() * 1000.0);
    }
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_time()
        .build()?;
    runtime.block_on(drive(args))
}

async fn drive(args: DemoArgs) -> anyhow::Result<()> {
    let fleet = Arc::new(Fleet::build()?);
    println!(
        "switchyard demo: {} simulated engines, models demo-chat (plain) and demo-pd (prefill/decode), \
         {} requests at concurrency {}",
        fleet.engines.len(),
        args.requests,
        args.concurrency
    );
    fleet.publish_load()?;
    let feed = tokio::spawn({
        let fleet = Arc::clone(&fleet);
        async move {
            let mut tick = interval(Duration::from_millis(20));
            loop {
                tick.tick().await;
                if let Err(e) = fleet.publish_load() {
                    eprintln!("load feed: {e}");
                }
            }
        }
    });
    let workload = Arc::new(Mutex::new((
        0usize,
        Xoshiro256PlusPlus::seed_from_u64(args.seed),
    )));
    let report = Arc::new(Mutex::new(Report::default()));
    let started = Instant::now();
    let progress = tokio::spawn(show_progress(Arc::clone(&report), args.requests));
    let clients: Vec<_> = (0..args.concurrency)
        .map(|_| {
            tokio::spawn(client(
                Arc::clone(&fleet),
                Arc::clone(&workload),
                Arc::clone(&report),
                args.requests,
            ))
        })
        .collect();
    for client in clients {
        client.await?;
    }
    progress.abort();
    feed.abort();
    let elapsed = started.elapsed();
    let report = report.lock().await;
    eprintln!("\r{}", progress_bar(report.finished(), args.requests));
    print_report(&report, elapsed);
    Ok(())
}

async fn client(
    fleet: Arc<Fleet>,
    workload: Arc<Mutex<(usize, Xoshiro256PlusPlus)>>,
    report: Arc<Mutex<Report>>,
    total: usize,
) {
    loop {
        let (model, prompt, output) = {
            let mut w = workload.lock().await;
            if w.0 == total {
                return;
            }
            w.0 += 1;
            let rng = &mut w.1;
            let model = if rng.next_u32() % 10 < 6 {
                "demo-chat"
            } else {
                "demo-pd"
            };
            let length = if rng.next_u32() % 10 < 7 {
                200 + rng.next_u32() % 1800
            } else {
                3000 + rng.next_u32() % 9000
            };
            (
                model,
                prompt_tokens(rng, length),
                16 + u64::from(rng.next_u32() % 112),
            )
        };
        let outcome = serve_one(&fleet, model, prompt, output).await;
        let mut r = report.lock().await;
        match outcome {
            Ok((selection, served)) => r.record(model, &selection, &served),
            Err(code) => *r.errors.entry(code).or_default() += 1,
        }
    }
}

/// A prompt of `length` tokens: three quarters a shared system prompt (one of 16),
/// the rest unique to the request, as in a fleet of chat applications.
fn prompt_tokens(rng: &mut Xoshiro256PlusPlus, length: u32) -> Vec<u32> {
    let system = rng.next_u32() % 16;
    let shared = length * 3 / 4;
    (0..shared)
        .map(|i| system * 1_000_000 + i)
        .chain((shared..length).map(|_| rng.next_u32()))
        .collect()
}

/// Selects engines for one request, holds their in-flight guards, and lets the
/// simulated engines serve it. Returns the selection and how the engines served it.
async fn serve_one(
    fleet: &Fleet,
    model: &str,
    prompt: Vec<u32>,
    output: u64,
) -> Result<(Selection, Served), &'static str> {
    let request = BucketRequest::new(model, prompt.len() as u64)
        .with_max_output_tokens(Some(output))
        .map_err(|e| e.code())?;
    let resolver = fleet.resolvers.get(model).ok_or("model_not_found")?;
    let selection = resolver
        .select(&fleet.registry.snapshot(), &request)
        .await
        .map_err(|e| e.code())?;
    let _guards: Vec<_> = selection
        .pick
        .engines
        .iter()
        .map(|p| fleet.load.acquire(p.engine.id()))
        .collect();
    let engine = |id: &str| Arc::clone(&fleet.engines[id]);
    let served = match &selection.pick.engines {
        EnginePicks::Plain(pick) => {
            engine(pick.engine.id().as_str())
                .serve(prompt, output)
                .await
        }
        EnginePicks::Pd { prefill, decode } => {
            let prefilled = engine(prefill.engine.id().as_str()).serve(prompt, 0).await;
            let decoded = engine(decode.engine.id().as_str())
                .serve(Vec::new(), output)
                .await;
            Served {
                time_to_first_token: prefilled.total + decoded.time_to_first_token,
                ..prefilled
            }
        }
    };
    Ok((selection, served))
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
    let filled = (done * 30).checked_div(total).unwrap_or(30);
    format!(
        "[{}{}] {done}/{total} requests",
        "#".repeat(filled),
        ".".repeat(30 - filled)
    )
}

fn print_report(report: &Report, elapsed: Duration) {
    let errors: usize = report.errors.values().sum();
    println!(
        "requests: {} completed, {errors} failed in {:.2} s",
        report.completed,
        elapsed.as_secs_f64()
    );
    for (code, count) in &report.errors {
        println!("  error {code:<24} {count:>6}");
    }
    println!(
        "picks by bucket ({} fallbacks to a later bucket):",
        report.passed_over
    );
    for (bucket, count) in &report.buckets {
        println!("  {bucket:<30} {count:>6}");
    }
    println!("picks by engine:");
    for (engine, count) in &report.engines {
        println!("  {engine:<30} {count:>6}");
    }
    println!("picks by reason:");
    for (reason, count) in &report.reasons {
        println!("  {reason:<30} {count:>6}");
    }
    let mut ttft = report.ttft_ms.clone();
    ttft.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        ttft.get(((ttft.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "prompt tokens: {}, of which cached: {} ({:.1}%)",
        report.prompt_tokens,
        report.cached_tokens,
        100.0 * report.cached_tokens as f64 / report.prompt_tokens.max(1) as f64
    );
    println!(
        "time to first token: p50 {:.1} ms, p99 {:.1} ms",
        pct(0.5),
        pct(0.99)
    );
}

//! In-process simulated engines and routers for serving tests.

use engine_sim::{EngineRole as SimRole, RunningEngine, SimConfig};
use router_config::{EngineConfig, EngineRole, ModelConfig, RouterConfig};
use router_http::RunningRouter;
use serde_json::{Value, json};

pub(crate) async fn sim(configure: impl FnOnce(&mut SimConfig)) -> RunningEngine {
    let mut config = SimConfig::for_tests();
    configure(&mut config);
    engine_sim::start(config).await.expect("the engine starts")
}

/// The byte-level tokenizer of the prefix tests: one token a byte.
pub(crate) fn byte_tokenizer() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tokenizer-bytes/tokenizer.json")
}

/// `n` engines of model `m` publishing KV events of 16-token pages, tokenizing with
/// [`byte_tokenizer`].
pub(crate) async fn kv_sims(n: usize) -> Vec<RunningEngine> {
    let mut sims = Vec::new();
    for _ in 0..n {
        sims.push(
            sim(|c| {
                c.model = "m".into();
                c.tokenizer = Some(byte_tokenizer());
                c.page_size = 16;
                c.kv_port = Some(0);
                c.replay_port = Some(0);
            })
            .await,
        );
    }
    sims
}

pub(crate) async fn prefill_sim() -> RunningEngine {
    sim(|c| {
        c.role = SimRole::Prefill;
        c.bootstrap_port = Some(0);
    })
    .await
}

pub(crate) async fn decode_sim() -> RunningEngine {
    sim(|c| c.role = SimRole::Decode).await
}

pub(crate) fn engine(id: &str, sim: &RunningEngine, role: EngineRole) -> EngineConfig {
    EngineConfig {
        role: Some(role),
        ..EngineConfig::new(id, sim.url())
    }
}

/// A router on a local port whose probes notice a stopped or recovered engine within a
/// few 50 ms intervals. Only three failed probes in a row, each with a generous
/// timeout, make an engine unhealthy, so one slow probe on a loaded machine never takes
/// a serving engine out of an exact round-robin or affinity assertion; tests that stop
/// an engine wait for its health state to change.
pub(crate) fn config(models: Vec<ModelConfig>) -> RouterConfig {
    let mut config = RouterConfig::new(models);
    config.listen = "127.0.0.1:0".parse().expect("an address");
    config.health.interval_ms = 50;
    config.health.timeout_ms = 5_000;
    config.health.failure_threshold = 3;
    config.health.success_threshold = 1;
    config
}

pub(crate) async fn router(config: RouterConfig) -> RunningRouter {
    router_http::start(config).await.expect("the router starts")
}

pub(crate) fn url(router: &RunningRouter, path: &str) -> String {
    format!("http://{}{path}", router.addr())
}

pub(crate) fn chat(model: &str, prompt: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4})
}

pub(crate) async fn post(router: &RunningRouter, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url(router, "/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("the router answers")
}

pub(crate) async fn metrics(router: &RunningRouter) -> String {
    reqwest::get(url(router, "/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text")
}

/// Whether the `/metrics` exposition `text` has `line`, whole (`...} 1` is not
/// `...} 10`).
pub(crate) fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// The value of the `/metrics` line that starts with `line_prefix` (0 without one).
pub(crate) async fn metric(router: &RunningRouter, line_prefix: &str) -> f64 {
    metrics(router)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits (at most 20 s) until `router` has applied every KV batch `engines`
/// published; panics with the feed's counters past that.
pub(crate) async fn kv_caught_up(router: &RunningRouter, engines: &[RunningEngine]) {
    let stats = router.context().fleet().kv_stats();
    let published: u64 = engines.iter().map(|e| e.engine().published_batches()).sum();
    let wait = async {
        loop {
            let seen = stats.steps();
            if stats.applied() >= published {
                return;
            }
            stats.steps_after(seen).await;
        }
    };
    if tokio::time::timeout(std::time::Duration::from_secs(20), wait)
        .await
        .is_err()
    {
        panic!(
            "the router applied {} of {published} batches: {:?}",
            stats.applied(),
            stats.counters()
        );
    }
}

/// What `sim` recorded of its latest requests (bootstrap fields, budgets, ids).
pub(crate) async fn recent_requests(sim: &RunningEngine) -> Vec<Value> {
    let body: Value = reqwest::get(format!("{}/admin/requests", sim.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["requests"].as_array().unwrap().clone()
}

/// The decision records in `file` once `n` are written (the writer thread says so in
/// its counter), waiting at most 20 s.
pub(crate) async fn decision_records(
    router: &RunningRouter,
    file: &std::path::Path,
    n: u64,
) -> Vec<Value> {
    let line = "switchyard_decision_records_total{outcome=\"written\"} ";
    let written = async {
        loop {
            let count: u64 = metrics(router)
                .await
                .lines()
                .find_map(|l| l.strip_prefix(line)?.parse().ok())
                .unwrap_or(0);
            if count >= n {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), written)
        .await
        .expect("the records are written");
    std::fs::read_to_string(file)
        .expect("the records' file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect()
}

/// A directory of the test's own, gone once the test has passed.
pub(crate) struct TempDir(std::path::PathBuf);

impl TempDir {
    pub(crate) fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("switchyard-{test}-{}", std::process::id()));
        drop(std::fs::remove_dir_all(&dir));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// The directory.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }

    pub(crate) fn remove(self) {
        std::fs::remove_dir_all(&self.0).unwrap();
    }
}

//! LoRA adapters end to end: an adapter request goes only to engines that serve the
//! adapter (their `/v1/models`), and its prompt is looked up in the adapter's cache
//! namespace, where the engine's KV events (`lora_name`) put the adapter's pages; a
//! base-model request with the same prompt never matches them. An adapter no engine
//! lists is not found, however it is named; an engine's 404 to an adapter request
//! has its list read again.

use crate::common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use engine_sim::RunningEngine;
use parking_lot::Mutex;
use router_config::{EngineConfig, EngineRole, ModelConfig};
use router_http::RunningRouter;
use serde_json::{Value, json};
use tokio::sync::watch;

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(30);

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-bytes/tokenizer.json")
}

async fn engine_with(adapters: &[&str]) -> RunningEngine {
    sim(|c| {
        c.model = "m".into();
        c.tokenizer = Some(tokenizer());
        c.kv_port = Some(0);
        c.replay_port = Some(0);
        c.lora_adapters = adapters.iter().map(|a| (*a).to_owned()).collect();
    })
    .await
}

/// Sends a chat for `model`; the engine that answered and the cached tokens it
/// reported.
async fn ask(router: &RunningRouter, model: &str, prompt: &str) -> (u16, String, u64) {
    let response = post(router, &chat(model, prompt)).await;
    let status = response.status().as_u16();
    let engine = response
        .headers()
        .get("x-switchyard-engine")
        .map(|e| e.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body: Value = response.json().await.unwrap();
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_default();
    (status, engine, cached)
}

/// Prompt tokens the router's cache-aware picks expected to find cached so far.
async fn predicted(router: &RunningRouter) -> f64 {
    metrics(router)
        .await
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"switchyard_predicted_cached_tokens_total{model="m",stage="plain"} "#)?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Waits until the router's index holds more entries than `before`.
async fn indexed(router: &RunningRouter, before: usize) {
    let fleet = router.context().fleet();
    let index = fleet.prefix_index("m").expect("an index");
    let stats = fleet.kv_stats();
    tokio::time::timeout(GUARD, async {
        let mut seen = stats.steps();
        while index.size().entries <= before {
            seen = stats.steps_after(seen).await;
        }
    })
    .await
    .expect("the router indexes the engine's pages");
}

#[tokio::test]
async fn adapter_requests_hit_the_adapters_pages_and_base_requests_do_not() {
    let (a, b) = (engine_with(&["sql"]).await, engine_with(&[]).await);
    let mut model = ModelConfig::new(
        "m",
        vec![
            engine("A", &a, EngineRole::Plain),
            engine("B", &b, EngineRole::Plain),
        ],
    );
    model.tokenizer = Some(tokenizer());
    model.policies.plain = Some(
        serde_json::from_value(json!({"type": "cache_aware", "min_matched_tokens": 64})).unwrap(),
    );
    let router = router(config(vec![model])).await;
    let prompt = "select every row of the orders table ".repeat(12);
    let (status, engine, cached) = ask(&router, "sql", &prompt).await;
    assert_eq!(
        (status, engine.as_str(), cached),
        (200, "A", 0),
        "only A serves the adapter"
    );
    indexed(&router, 0).await;
    let before = predicted(&router).await;
    let (status, engine, cached) = ask(&router, "sql", &prompt).await;
    assert_eq!((status, engine.as_str()), (200, "A"));
    assert!(cached > 0, "the engine found the adapter's pages");
    assert!(
        predicted(&router).await > before,
        "the router found them in the adapter's namespace"
    );
    let before = predicted(&router).await;
    let (status, _, cached) = ask(&router, "m", &prompt).await;
    assert_eq!(
        (status, cached),
        (200, 0),
        "the base model has no such pages"
    );
    assert_eq!(
        predicted(&router).await,
        before,
        "the router matched nothing for the base model"
    );
    for n in 0..3 {
        let (status, engine, _) = ask(&router, "m:sql", &format!("{n} {prompt}")).await;
        assert_eq!(
            (status, engine.as_str()),
            (200, "A"),
            "SGLang's model:adapter names it too"
        );
    }
    let (status, _, _) = ask(&router, "unknown-adapter", &prompt).await;
    assert_eq!(status, 404);
    router.shutdown().await;
}

/// The status and error code of `response`.
async fn refusal(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test]
async fn an_adapter_no_engine_lists_is_not_found_however_it_is_named() {
    let (a, b) = (engine_with(&["sql"]).await, engine_with(&[]).await);
    let model = ModelConfig::new(
        "m",
        vec![
            engine("A", &a, EngineRole::Plain),
            engine("B", &b, EngineRole::Plain),
        ],
    );
    let router = router(config(vec![model])).await;
    let not_found = (404, "model_not_found".to_owned());
    for named in ["nosuch", "m:nosuch"] {
        let response = post(&router, &chat(named, "hello")).await;
        assert_eq!(refusal(response).await, not_found, "{named}");
    }
    let generate = |lora_path: &str| {
        reqwest::Client::new()
            .post(url(&router, "/generate"))
            .json(&json!({"text": "hello", "lora_path": lora_path, "sampling_params": {"max_new_tokens": 2}}))
            .send()
    };
    let response = generate("nosuch").await.unwrap();
    assert_eq!(refusal(response).await, not_found, "lora_path");
    let served = generate("sql").await.unwrap();
    assert_eq!(
        (
            served.status(),
            served.headers()["x-switchyard-engine"].to_str().unwrap()
        ),
        (reqwest::StatusCode::OK, "A"),
        "a listed adapter is served"
    );
    router.shutdown().await;
}

/// A plain engine of model `m` that lists the adapters `listing` holds, answers
/// every chat with a 404 (as an engine that unloaded the adapter does), and counts
/// the reads of its `/v1/models` in `reads`.
async fn unloading_engine(
    listing: Arc<Mutex<Vec<String>>>,
    reads: watch::Sender<usize>,
) -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::{get, post};
    let reads = Arc::new(reads);
    let models = move || {
        let adapters = listing.lock().clone();
        reads.send_modify(|n| *n += 1);
        let mut cards = vec![json!({"id": "m", "parent": null})];
        cards.extend(adapters.iter().map(|a| json!({"id": a, "parent": "m"})));
        async move { axum::Json(json!({"data": cards})) }
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/server_info",
            get(|| async { axum::Json(json!({"disaggregation_mode": "null"})) }),
        )
        .route("/v1/models", get(models))
        .route(
            "/v1/chat/completions",
            post(|| async {
                let body = json!({"error": {"message": "The model `sql` does not exist."}});
                (axum::http::StatusCode::NOT_FOUND, axum::Json(body))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, server)
}

/// Waits until the engine's `/v1/models` was read more than `n` times.
async fn reads_past(read: &mut watch::Receiver<usize>, n: usize) {
    let past = read.wait_for(|reads| *reads > n);
    drop(tokio::time::timeout(GUARD, past).await.unwrap().unwrap());
}

#[tokio::test]
async fn an_engines_404_to_an_adapter_request_reads_its_adapters_again() {
    let listing = Arc::new(Mutex::new(vec!["sql".to_owned()]));
    let (reads, mut read) = watch::channel(0);
    let (engine_url, server) = unloading_engine(Arc::clone(&listing), reads).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![EngineConfig {
            role: Some(EngineRole::Plain),
            ..EngineConfig::new("A", engine_url.as_str())
        }],
    )]);
    // Probes (which read the adapters too) only at startup.
    config.health.interval_ms = 86_400_000;
    let router = router(config).await;
    // Read when the engine joined, and after the startup probe.
    reads_past(&mut read, 1).await;
    listing.lock().clear();
    let response = post(&router, &chat("sql", "hello")).await;
    assert_eq!(
        (
            response.status(),
            response.headers()["x-switchyard-engine"].to_str().unwrap()
        ),
        (reqwest::StatusCode::NOT_FOUND, "A"),
        "the engine's own 404"
    );
    reads_past(&mut read, 2).await;
    let fleet = router.context().fleet();
    let forgotten = async {
        while fleet.snapshot().get("A").unwrap().serves_adapter("sql") {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, forgotten).await.unwrap();
    let response = post(&router, &chat("sql", "hello")).await;
    assert!(response.headers().get("x-switchyard-engine").is_none());
    assert_eq!(
        refusal(response).await,
        (404, "model_not_found".to_owned()),
        "the router's own 404 now"
    );
    router.shutdown().await;
    server.abort();
}

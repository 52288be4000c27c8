//! LoRA adapters end to end: an adapter request goes only to engines that serve the
//! adapter (their `/v1/models`), and its prompt is looked up in the adapter's cache
//! namespace, where the engine's KV events (`lora_name`) put the adapter's pages; a
//! base-model request with the same prompt never matches them.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use engine_sim::RunningEngine;
use router_config::{EngineRole, ModelConfig};
use router_http::RunningRouter;
use serde_json::{Value, json};

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

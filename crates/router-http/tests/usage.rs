//! The usage engines' answers report, counted as metrics: an answer's prompt tokens
//! with its cached tokens, 0 of them when it reports none (vLLM on a miss), and
//! nothing for a batch, whose answer holds one usage per prompt.

use crate::common;

use common::*;
use router_config::{EngineConfig, EngineRole, ModelConfig};
use serde_json::{Value, json};

/// An engine answering chats with `usage` (cached tokens only when the prompt starts
/// with "hit") and `/generate` batches with one `meta_info` per prompt.
async fn engine() -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::{get, post};
    let chat = |body: axum::Json<Value>| async move {
        let hit = body["messages"][0]["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("hit"));
        let usage = if hit {
            json!({"prompt_tokens": 40, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 32}})
        } else {
            json!({"prompt_tokens": 30, "completion_tokens": 2})
        };
        axum::Json(
            json!({"choices": [{"message": {"role": "assistant", "content": "ok"}}], "usage": usage}),
        )
    };
    let generate = || async {
        axum::Json(json!([
            {"text": "a", "meta_info": {"prompt_tokens": 5, "cached_tokens": 4}},
            {"text": "b", "meta_info": {"prompt_tokens": 7, "cached_tokens": 6}},
        ]))
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/server_info",
            get(|| async { axum::Json(json!({"disaggregation_mode": "null"})) }),
        )
        .route("/v1/chat/completions", post(chat))
        .route("/generate", post(generate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, server)
}

async fn reported(router: &router_http::RunningRouter) -> (f64, f64) {
    (
        metric(
            router,
            "switchyard_reported_cached_tokens_total{model=\"m\",stage=\"plain\"}",
        )
        .await,
        metric(
            router,
            "switchyard_reported_prompt_tokens_total{model=\"m\",stage=\"plain\"}",
        )
        .await,
    )
}

#[tokio::test]
async fn answers_count_their_prompt_and_cached_tokens_and_batches_count_none() {
    let (engine_url, server) = engine().await;
    let router = router(config(vec![ModelConfig::new(
        "m",
        vec![EngineConfig {
            role: Some(EngineRole::Plain),
            ..EngineConfig::new("A", engine_url.as_str())
        }],
    )]))
    .await;
    assert_eq!(post(&router, &chat("m", "hit me")).await.status(), 200);
    assert_eq!(reported(&router).await, (32.0, 40.0));
    assert_eq!(post(&router, &chat("m", "miss")).await.status(), 200);
    assert_eq!(
        reported(&router).await,
        (32.0, 70.0),
        "an answer without cached tokens counts its prompt, with none cached"
    );
    let batch = reqwest::Client::new()
        .post(url(&router, "/generate"))
        .json(&json!({"model": "m", "text": ["a", "b"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 200);
    assert_eq!(
        batch
            .json::<Value>()
            .await
            .unwrap()
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        reported(&router).await,
        (32.0, 70.0),
        "a batch's usages are not one answer's"
    );
    router.shutdown().await;
    server.abort();
}

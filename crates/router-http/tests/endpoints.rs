//! The routed endpoints beside chat (`/v1/completions`, `/v1/embeddings`, SGLang's
//! `/generate`) against in-process simulated engines over real sockets.

use crate::common;

use common::*;
use router_config::{EngineRole, ModelConfig};
use serde_json::{Value, json};

/// `POST /v1/completions` with `body` through `router`.
async fn complete(router: &router_http::RunningRouter, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url(router, "/v1/completions"))
        .json(body)
        .send()
        .await
        .expect("the router answers")
}

/// A router serving model `m` on one plain engine and `pd` on a prefill and a decode
/// engine, with the engines.
async fn plain_and_pd() -> (
    router_http::RunningRouter,
    engine_sim::RunningEngine,
    engine_sim::RunningEngine,
    engine_sim::RunningEngine,
) {
    let plain = sim(|_| {}).await;
    let (prefill, decode) = (prefill_sim().await, decode_sim().await);
    let models = vec![
        ModelConfig::new("m", vec![engine("A", &plain, EngineRole::Plain)]),
        ModelConfig::new(
            "pd",
            vec![
                engine("P1", &prefill, EngineRole::Prefill),
                engine("D1", &decode, EngineRole::Decode),
            ],
        ),
    ];
    (router(config(models)).await, plain, prefill, decode)
}

#[tokio::test]
async fn completions_are_routed_on_their_prompt_plain_and_pd_json_and_streamed() {
    let (router, _plain, _prefill, decode) = plain_and_pd().await;
    for model in ["m", "pd"] {
        let ids =
            serde_json::json!({"model": model, "prompt": [11, 12, 13, 14, 15], "max_tokens": 3});
        let response = complete(&router, &ids).await;
        assert_eq!(response.status(), 200, "{model}");
        assert_eq!(
            response.headers()["x-switchyard-prompt-tokens"],
            "5",
            "token ids are routed on as sent"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["usage"]["prompt_tokens"], 5);
        assert_eq!(
            body["choices"][0]["text"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            3
        );
        let streamed =
            serde_json::json!({"model": model, "prompt": "a b c", "max_tokens": 2, "stream": true});
        let response = complete(&router, &streamed).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let text = response.text().await.unwrap();
        let events: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
        let first: Value = serde_json::from_str(events[0]).unwrap();
        assert_eq!(first["object"], "text_completion");
        assert!(
            !first["choices"][0]["text"].as_str().unwrap().is_empty(),
            "{model}: the first event is text, no role event"
        );
        assert_eq!(
            events.len(),
            2 + 1 + 1,
            "{model}: two words, the finish, [DONE]"
        );
    }
    let bad = complete(&router, &serde_json::json!({"model": "m", "prompt": []})).await;
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await.unwrap();
    assert_eq!(error["error"]["param"], "prompt");
    let pd_requests = recent_requests(&decode).await;
    assert_eq!(
        pd_requests.len(),
        2,
        "the decode engine had both completions"
    );
    assert!(
        pd_requests.iter().all(|r| r["bootstrap_room"].is_u64()),
        "the PD legs of completions carry a room: {pd_requests:?}"
    );
    router.shutdown().await;
}

#[tokio::test]
async fn embeddings_are_served_by_plain_engines_only() {
    let (router, _plain, prefill, decode) = plain_and_pd().await;
    let embed = |body: Value| {
        reqwest::Client::new()
            .post(url(&router, "/v1/embeddings"))
            .json(&body)
            .send()
    };
    let response = embed(serde_json::json!({"model": "m", "input": ["a b c", "d e"]}))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["usage"]["prompt_tokens"], 5);
    let ids = embed(serde_json::json!({"model": "m", "input": [[1, 2, 3], [4, 5]]}))
        .await
        .unwrap();
    assert_eq!(
        ids.headers()["x-switchyard-prompt-tokens"],
        "3",
        "the longest input"
    );
    ids.bytes().await.unwrap();
    let refused = embed(serde_json::json!({"model": "pd", "input": "a"}))
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "invalid_model");
    assert!(
        metrics(&router).await.contains(
            r#"switchyard_requests_total{model="pd",outcome="client_error",code="invalid_model"} 1"#
        ),
        "a refusal is counted under the model it named"
    );
    assert_eq!(
        (prefill.visits(), decode.visits()),
        Default::default(),
        "no PD engine was asked"
    );
    router.shutdown().await;
}

/// `POST /generate` with `body` to `base` (a router's or an engine's address).
async fn generate(base: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/generate"))
        .json(body)
        .send()
        .await
        .expect("an answer")
}

#[tokio::test]
async fn generate_needs_no_model_and_is_relayed_in_sglangs_framing_unchanged() {
    let plain = sim(|_| {}).await;
    let models = vec![ModelConfig::new(
        "m",
        vec![engine("A", &plain, EngineRole::Plain)],
    )];
    let router = router(config(models)).await;
    let base = format!("http://{}", router.addr());
    for stream in [false, true] {
        let body = json!({"text": "the same words twice", "rid": "r-7", "stream": stream,
                          "sampling_params": {"max_new_tokens": 3}});
        let routed = generate(&base, &body).await;
        assert_eq!(routed.status(), 200);
        assert_eq!(routed.headers()["x-switchyard-engine"], "A");
        let routed = routed.bytes().await.unwrap();
        let flushed = reqwest::Client::new()
            .post(format!("{}/flush_cache", plain.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(flushed.status(), 200);
        let direct = generate(&plain.url(), &body).await.bytes().await.unwrap();
        assert_eq!(routed, direct, "the engine's own bytes (stream: {stream})");
        let text = String::from_utf8(routed.to_vec()).unwrap();
        if stream {
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            assert_eq!(text.matches("data: ").count(), 3 + 1 + 1, "{text}");
        } else {
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["meta_info"]["id"], "r-7");
        }
    }
    let budgets: Vec<Value> = recent_requests(&plain)
        .await
        .iter()
        .map(|r| r["max_tokens"].clone())
        .collect();
    assert_eq!(budgets, vec![json!(3); 4]);
    router.shutdown().await;
}

#[tokio::test]
async fn generate_over_prefill_decode_gives_each_prompt_of_a_batch_its_own_room() {
    let (prefill, decode) = (prefill_sim().await, decode_sim().await);
    let models = vec![ModelConfig::new(
        "pd",
        vec![
            engine("P1", &prefill, EngineRole::Prefill),
            engine("D1", &decode, EngineRole::Decode),
        ],
    )];
    let router = router(config(models)).await;
    let base = format!("http://{}", router.addr());
    let one = json!({"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 2}});
    let response = generate(&base, &one).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        (
            response.headers()["x-switchyard-prefill"].to_str().unwrap(),
            response.headers()["x-switchyard-decode"].to_str().unwrap(),
            response.headers()["x-switchyard-prompt-tokens"]
                .to_str()
                .unwrap()
        ),
        ("P1", "D1", "4")
    );
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["meta_info"]["completion_tokens"], 2);
    let batch = json!({"text": ["a batch of one"], "stream": true, "sampling_params": [{"max_new_tokens": 2}]});
    let response = generate(&base, &batch).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let (p, d) = (
        recent_requests(&prefill).await,
        recent_requests(&decode).await,
    );
    assert_eq!((p.len(), d.len()), (2, 2), "both legs of both requests");
    for (p, d) in p.iter().zip(&d) {
        assert_eq!(
            p["bootstrap_room"], d["bootstrap_room"],
            "one room, both legs"
        );
        assert!(p["bootstrap_room"].is_u64());
        assert_eq!(d["bootstrap_host"], "127.0.0.1");
    }
    assert_eq!(
        (d[0]["batch"].as_bool(), d[1]["batch"].as_bool()),
        (Some(false), Some(true)),
        "the batch was sent lists of bootstrap fields, which the engine accepted"
    );
    assert_ne!(p[0]["bootstrap_room"], p[1]["bootstrap_room"]);
    router.shutdown().await;
}

#[tokio::test]
async fn without_a_model_a_router_serving_several_names_them() {
    let (router, plain, _prefill, _decode) = plain_and_pd().await;
    let base = format!("http://{}", router.addr());
    let refused = generate(&base, &json!({"text": "which model?"})).await;
    assert_eq!(refused.status(), 400);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(
        (
            error["error"]["code"].as_str(),
            error["error"]["param"].as_str(),
            error["error"]["message"].as_str()
        ),
        (
            Some("missing_model"),
            Some("model"),
            Some("model is required: this router serves \"m\", \"pd\"")
        )
    );
    let named = generate(&base, &json!({"model": "m", "text": "this one"})).await;
    assert_eq!(named.status(), 200);
    assert_eq!(named.headers()["x-switchyard-engine"], "A");
    named.bytes().await.unwrap();
    assert_eq!(
        plain.visits().answered,
        1,
        "only the named request reached an engine"
    );
    router.shutdown().await;
}

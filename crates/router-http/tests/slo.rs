//! Buckets with latency targets, end to end: the router measures an engine's time per
//! output token on the answers it streams, and a bucket predicted to miss its target
//! is tried after the others.

use crate::common::*;

use router_config::{EngineRole, ModelConfig};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_whose_engines_decode_slower_than_its_target_is_tried_last() {
    // 200 tokens a second: 5 ms a token, against a 1 ms target.
    let slow = sim(|c| {
        c.decode_tokens_per_sec = 200.0;
        c.output_tokens = 24;
    })
    .await;
    let other = sim(|_| {}).await;
    let mut model = ModelConfig::new(
        "m",
        vec![
            engine("F", &slow, EngineRole::Plain),
            engine("B", &other, EngineRole::Plain),
        ],
    );
    model.buckets = Some(
        serde_json::from_value(json!([
            {"id": "fast", "slo": {"tpot_ms": 1}, "groups": {"plain": {"engine_ids": ["F"]}}},
            {"id": "bulk", "rank": 1, "groups": {"plain": {"engine_ids": ["B"]}}},
        ]))
        .unwrap(),
    );
    let mut config = config(vec![model]);
    config.admin.token = Some("admin".into());
    let router = router(config).await;
    let mut streamed = chat("m", "hello");
    streamed["stream"] = true.into();
    streamed["max_tokens"] = 24.into();
    let bucket = |answer: &reqwest::Response| answer.headers()["x-switchyard-bucket"].clone();

    let first = post(&router, &streamed).await;
    assert_eq!(first.status(), 200);
    assert_eq!(bucket(&first), "fast", "nothing is known of its pace yet");
    first.bytes().await.unwrap();

    let second = post(&router, &chat("m", "hello")).await;
    assert_eq!(
        bucket(&second),
        "bulk",
        "F streamed at about 5 ms a token: over the target"
    );
    second.bytes().await.unwrap();
    let text = metrics(&router).await;
    assert!(
        text.contains("switchyard_slo_demotions_total{model=\"m\",bucket=\"fast\"} 1"),
        "{text}"
    );
    let tpot: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("switchyard_engine_tpot_seconds{engine=\"F\"} "))
        .expect("F's pace is exported")
        .parse()
        .unwrap();
    assert!(tpot > 0.001, "{tpot}");
    assert!(
        !text.contains("switchyard_engine_tpot_seconds{engine=\"B\"}"),
        "only streamed answers are measured"
    );
    let explained: serde_json::Value = reqwest::Client::new()
        .post(url(&router, "/explain/v1/chat/completions"))
        .bearer_auth("admin")
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let buckets = explained["buckets"].as_array().unwrap();
    assert_eq!(buckets[0]["id"], "bulk", "considered first: {explained}");
    assert_eq!(buckets[1]["id"], "fast");
    let slo = &buckets[1]["slo"];
    assert_eq!((&slo["tpot_ms"], &slo["meets"]), (&json!(1), &json!(false)));
    assert!(slo["predicted_tpot_ms"].as_f64().unwrap() > 1.0, "{slo}");
    router.shutdown().await;
    slow.shutdown().await;
    other.shutdown().await;
}

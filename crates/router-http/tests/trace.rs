//! W3C trace context through the router: a client's valid `traceparent` (and
//! `tracestate`) reaches every engine a request is sent to, both legs of a PD pair
//! included, unchanged; an invalid one reaches none.

use crate::common;

use common::*;
use router_config::{EngineRole, ModelConfig};
use serde_json::Value;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn traced(router: &router_http::RunningRouter, traceparent: &str) {
    let response = reqwest::Client::new()
        .post(url(router, "/v1/chat/completions"))
        .header("traceparent", traceparent)
        .header("tracestate", "congo=t61rcWkgMzE")
        .json(&chat("m", "hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
}

async fn last_traceparent(sim: &engine_sim::RunningEngine) -> Value {
    recent_requests(sim).await.last().unwrap()["traceparent"].clone()
}

#[tokio::test]
async fn a_valid_traceparent_reaches_every_engine_and_an_invalid_one_none() {
    let a = sim(|_| {}).await;
    let plain = router(config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]))
    .await;
    traced(&plain, PARENT).await;
    assert_eq!(last_traceparent(&a).await, PARENT);
    traced(
        &plain,
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    )
    .await;
    assert_eq!(last_traceparent(&a).await, Value::Null);
    plain.shutdown().await;

    let (p, d) = (prefill_sim().await, decode_sim().await);
    let pd = router(config(vec![ModelConfig::new(
        "m",
        vec![
            engine("P", &p, EngineRole::Prefill),
            engine("D", &d, EngineRole::Decode),
        ],
    )]))
    .await;
    traced(&pd, PARENT).await;
    assert_eq!(last_traceparent(&p).await, PARENT, "the prefill leg");
    assert_eq!(last_traceparent(&d).await, PARENT, "the decode leg");
    pd.shutdown().await;
}

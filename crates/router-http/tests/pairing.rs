//! Prefill and decode engines that cannot hand a request's KV cache over (another
//! page size, another transfer backend, as their `/server_info` says) are never
//! paired: the request goes to a pair that can, or is refused at once with a 503
//! naming the mismatch, rather than failing at the decode engine.

use crate::common;

use common::*;
use engine_sim::{EngineRole as SimRole, RunningEngine};
use router_config::{EngineRole, ModelConfig};
use router_http::RunningRouter;
use serde_json::{Value, json};

const TOKEN: &str = "s3cret";

async fn prefill(page_size: u32, backend: &str) -> RunningEngine {
    sim(|c| {
        c.role = SimRole::Prefill;
        c.bootstrap_port = Some(0);
        c.page_size = page_size;
        c.transfer_backend = backend.into();
    })
    .await
}

async fn decode(page_size: u32, backend: &str) -> RunningEngine {
    sim(|c| {
        c.role = SimRole::Decode;
        c.page_size = page_size;
        c.transfer_backend = backend.into();
    })
    .await
}

async fn pd_router(
    prefills: &[(&str, &RunningEngine)],
    decodes: &[(&str, &RunningEngine)],
) -> RunningRouter {
    let engines = prefills
        .iter()
        .map(|(id, sim)| engine(id, sim, EngineRole::Prefill))
        .chain(
            decodes
                .iter()
                .map(|(id, sim)| engine(id, sim, EngineRole::Decode)),
        )
        .collect();
    let mut config = config(vec![ModelConfig::new("m", engines)]);
    config.admin.token = Some(TOKEN.into());
    router(config).await
}

async fn explain(router: &RunningRouter) -> Value {
    let response = reqwest::Client::new()
        .post(url(router, "/explain/v1/chat/completions"))
        .bearer_auth(TOKEN)
        .json(&chat("m", "explain the pair"))
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200);
    response.json().await.expect("a JSON explanation")
}

#[tokio::test]
async fn a_request_is_served_by_the_decode_engine_that_can_take_the_prefill_engines_kv() {
    let p1 = prefill(16, "mooncake").await;
    let (d1, d2) = (decode(32, "mooncake").await, decode(16, "mooncake").await);
    let router = pd_router(&[("P1", &p1)], &[("D1", &d1), ("D2", &d2)]).await;
    for n in 0..6 {
        let response = post(&router, &chat("m", &format!("pair {n}"))).await;
        let status = response.status();
        let decode = response.headers().get("x-switchyard-decode").cloned();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "{text}");
        assert_eq!(decode.unwrap(), "D2");
    }
    assert!(recent_requests(&d1).await.is_empty(), "D1 was never asked");

    let explained = explain(&router).await;
    let stages = &explained["buckets"][0]["stages"];
    assert_eq!(stages[1]["stage"], "decode");
    assert_eq!(
        stages[1]["unpaired"],
        json!([{"engine": "D1", "with": "P1", "field": "page_size", "prefill": "16", "decode": "32"}])
    );
    assert_eq!(stages[1]["candidates"].as_array().unwrap().len(), 1);
    assert_eq!(explained["pick"]["engines"]["decode"]["engine"], "D2");
    router.shutdown().await;
    for sim in [p1, d1, d2] {
        sim.shutdown().await;
    }
}

#[tokio::test]
async fn engines_that_cannot_pair_are_a_503_naming_the_mismatch_and_nothing_is_sent() {
    let p1 = prefill(16, "mooncake").await;
    let d1 = decode(16, "nixl").await;
    let router = pd_router(&[("P1", &p1)], &[("D1", &d1)]).await;
    let response = post(&router, &chat("m", "no pair")).await;
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_engine_available");
    assert_eq!(
        body["error"]["message"],
        "no prefill engine is available: bucket default: no prefill engine can hand its KV cache \
         to a decode engine: prefill P1 and decode D1: disaggregation_transfer_backend mooncake \
         (prefill) and nixl (decode) differ"
    );
    assert!(recent_requests(&p1).await.is_empty() && recent_requests(&d1).await.is_empty());

    let explained = explain(&router).await;
    let bucket = &explained["buckets"][0];
    assert_eq!(bucket["outcome"], "passed_over");
    assert_eq!(bucket["stages"][0]["error"]["code"], "no_compatible_pair");
    assert_eq!(
        bucket["stages"][0]["unpaired"][0]["field"],
        "disaggregation_transfer_backend"
    );
    router.shutdown().await;
    p1.shutdown().await;
    d1.shutdown().await;
}

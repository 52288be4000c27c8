//! `POST /explain/...` end to end: an explanation names the bucket, engine and reason
//! the real request then gets in the same state, dispatches nothing and binds
//! nothing, says why each bucket was skipped, passed over or picked with the load
//! and admission verdicts selection saw, and is part of the admin API. Every routed
//! answer carries `x-switchyard-reason`.

use crate::common;

use std::time::Duration;

use common::{decode_sim, engine, prefill_sim, router, sim, url};
use engine_sim::RunningEngine;
use router_config::{EngineRole, ModelConfig, RouterConfig};
use router_http::RunningRouter;
use serde_json::{Value, json};

const TOKEN: &str = "s3cret";
/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);

fn config(models: Value) -> RouterConfig {
    let text = json!({
        "listen": "127.0.0.1:0",
        "admin": {"token": TOKEN},
        "models": models,
    })
    .to_string();
    RouterConfig::from_yaml(&text).expect("a configuration")
}

fn plain(id: &str, sim: &RunningEngine) -> Value {
    json!({"id": id, "url": sim.url(), "role": "plain"})
}

fn chat(prompt: &str) -> Value {
    common::chat("m", prompt)
}

async fn explain(router: &RunningRouter, path: &str, body: &Value, session: &str) -> Value {
    let response = reqwest::Client::new()
        .post(url(router, &format!("/explain{path}")))
        .bearer_auth(TOKEN)
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200);
    response.json().await.expect("a JSON explanation")
}

/// Sends a chat: the bucket, engine and reason headers of its answer.
async fn served(router: &RunningRouter, body: &Value, session: &str) -> (String, String, String) {
    let response = reqwest::Client::new()
        .post(url(router, "/v1/chat/completions"))
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200);
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
    let answer = (
        header("x-switchyard-bucket"),
        header("x-switchyard-engine"),
        header("x-switchyard-reason"),
    );
    response.bytes().await.expect("the body");
    answer
}

/// The explanation's plain pick: bucket, engine and reason.
fn pick(explanation: &Value) -> (String, String, String) {
    let plain = &explanation["pick"]["engines"]["plain"];
    (
        explanation["pick"]["bucket"].as_str().unwrap().to_owned(),
        plain["engine"].as_str().unwrap().to_owned(),
        plain["reason"].as_str().unwrap().to_owned(),
    )
}

fn answered(sims: &[&RunningEngine]) -> u64 {
    sims.iter()
        .map(|s| {
            let v = s.visits();
            v.open + v.answered + v.abandoned
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explanation_names_what_the_request_then_gets_and_changes_nothing() {
    let (a, b, c) = (sim(|_| {}).await, sim(|_| {}).await, sim(|_| {}).await);
    // `short` fits no chat below; `capped` (B, one request at a time) is tried before
    // `main`, whose session-aware group binds each session to one of A, B, C.
    let router = router(config(json!([{
        "id": "m",
        "engines": [plain("A", &a), plain("B", &b), plain("C", &c)],
        "buckets": [
            {"id": "short", "limits": {"max": 2}, "groups": {"plain": {"engine_ids": ["A"]}}},
            {"id": "capped", "rank": 0, "groups": {"plain": {"engine_ids": ["B"], "policy": {"type": "round_robin", "admission": {"max_inflight_requests": 1}}}}},
            {"id": "main", "rank": 1, "groups": {"plain": {"policy": {"type": "session_aware", "seed": 7}}}},
        ],
    }])))
    .await;

    // A stream held on B fills `capped`.
    let reply = reqwest::Client::new()
        .post(format!("{}/admin/faults", b.url()))
        .json(&json!({"hold_after_chunks": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let mut held = chat("held");
    held["stream"] = json!(true);
    let held = reqwest::Client::new()
        .post(url(&router, "/v1/chat/completions"))
        .json(&held)
        .send()
        .await
        .unwrap();
    assert_eq!(held.headers()["x-switchyard-bucket"], "capped");
    assert_eq!(held.headers()["x-switchyard-reason"], "single_candidate");
    tokio::time::timeout(GUARD, b.visits_until(|v| v.open == 1))
        .await
        .expect("the stream is held on B");

    let sims = [&a, &b, &c];
    let before = answered(&sims);
    let body = chat("a question long enough for no short bucket");
    let first = explain(&router, "/v1/chat/completions", &body, "s1").await;
    let again = explain(&router, "/v1/chat/completions", &body, "s1").await;
    assert_eq!(answered(&sims), before, "an explanation dispatches nothing");
    assert_eq!(first, again, "an explanation changes nothing it explains");

    assert_eq!(first["model"], "m");
    let prompt_tokens = first["request"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 2);
    assert_eq!(first["request"]["session_key"], "s1");
    assert_eq!(first["request"]["max_output_tokens"], 4);
    assert_eq!(first["request"]["expected_peak_tokens"], prompt_tokens + 4);
    let buckets = first["buckets"].as_array().unwrap();
    let outcomes: Vec<(&str, &str)> = buckets
        .iter()
        .map(|b| (b["id"].as_str().unwrap(), b["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("short", "skipped"),
            ("capped", "passed_over"),
            ("main", "picked")
        ]
    );
    assert!(
        buckets[0]["why"]
            .as_str()
            .unwrap()
            .contains("outside the bucket's limits"),
        "{}",
        buckets[0]["why"]
    );
    let capped = &buckets[1]["stages"][0];
    assert_eq!(capped["stage"], "plain");
    assert_eq!(capped["candidates"][0]["engine"], "B");
    assert_eq!(capped["candidates"][0]["load"]["inflight_requests"], 1);
    assert_eq!(
        capped["candidates"][0]["admission"][0],
        json!({
            "verdict": "rejected",
            "caps": {"max_inflight_requests": 1},
            "exceeded": {"limit": "max_inflight_requests", "observed": 1, "cap": 1},
        })
    );
    assert_eq!(capped["error"]["code"], "no_admissible_engine");
    let main = &buckets[2]["stages"][0];
    let candidates: Vec<&str> = main["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["engine"].as_str().unwrap())
        .collect();
    assert_eq!(candidates, ["A", "B", "C"]);
    let explained = pick(&first);
    assert_eq!(explained.0, "main");
    assert_eq!(explained.2, "affinity_assigned");
    assert_eq!(main["pick"]["engine"], explained.1.as_str());

    // The real request gets what the explanation named, and binds the session.
    assert_eq!(served(&router, &body, "s1").await, explained);
    let bound = explain(&router, "/v1/chat/completions", &body, "s1").await;
    assert_eq!(
        pick(&bound),
        (
            explained.0.clone(),
            explained.1.clone(),
            "affinity_bound".into()
        )
    );
    assert_eq!(
        served(&router, &body, "s1").await,
        (explained.0, explained.1, "affinity_bound".into())
    );
    drop(held);
    router.shutdown().await;
}

#[tokio::test]
async fn explanations_are_admin_requests_and_refuse_what_the_endpoint_refuses() {
    let a = sim(|_| {}).await;
    let router = router(config(json!([{"id": "m", "engines": [plain("A", &a)]}]))).await;
    let client = reqwest::Client::new();
    let path = url(&router, "/explain/v1/chat/completions");
    let anonymous = client.post(&path).json(&chat("hi")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let unknown = client
        .post(&path)
        .bearer_auth(TOKEN)
        .json(&common::chat("other", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        unknown.status(),
        404,
        "an unknown model, as the endpoint says"
    );
    let broken = client
        .post(&path)
        .bearer_auth(TOKEN)
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(broken.status(), 400);
    for endpoint in ["/v1/completions", "/generate", "/v1/embeddings"] {
        let body = match endpoint {
            "/generate" => json!({"text": "hi"}),
            "/v1/embeddings" => json!({"model": "m", "input": "hi"}),
            _ => json!({"model": "m", "prompt": "hi"}),
        };
        let explanation = explain(&router, endpoint, &body, "k").await;
        assert_eq!(explanation["endpoint"], endpoint);
        assert_eq!(pick(&explanation).1, "A");
    }
    assert_eq!(answered(&[&a]), 0, "nothing was dispatched");

    let off = router_http::start({
        let mut config = common::config(vec![ModelConfig::new(
            "m",
            vec![engine("A", &a, EngineRole::Plain)],
        )]);
        config.admin.token = None;
        config
    })
    .await
    .unwrap();
    let refused = client
        .post(url(&off, "/explain/v1/chat/completions"))
        .bearer_auth(TOKEN)
        .json(&chat("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403, "no admin token, no explanations");
    off.shutdown().await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_prefill_decode_explanation_names_both_legs_as_the_answer_does() {
    let (p, d) = (prefill_sim().await, decode_sim().await);
    let router = router(config(json!([{
        "id": "m",
        "engines": [
            {"id": "P", "url": p.url(), "role": "prefill"},
            {"id": "D", "url": d.url(), "role": "decode"},
        ],
    }])))
    .await;
    let explanation = explain(&router, "/v1/chat/completions", &chat("hi"), "k").await;
    let engines = &explanation["pick"]["engines"];
    assert_eq!(
        (&engines["prefill"]["engine"], &engines["decode"]["engine"]),
        (&json!("P"), &json!("D"))
    );
    let stages: Vec<&str> = explanation["buckets"][0]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["prefill", "decode"]);
    let response = common::post(&router, &chat("hi")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-switchyard-reason"],
        "prefill=single_candidate, decode=single_candidate"
    );
    router.shutdown().await;
}

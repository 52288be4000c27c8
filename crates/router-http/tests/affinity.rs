//! Session and routing-key affinity through the router: turns stick to one engine,
//! move together when it leaves, and keyless requests spread.

mod common;

use std::collections::BTreeSet;

use common::{chat, config, engine, router, sim, url};
use router_http::{EngineRole, ModelConfig, RunningRouter};
use router_policy::PolicyConfig;
use serde_json::json;

async fn fleet(policy: serde_json::Value) -> (RunningRouter, Vec<engine_sim::RunningEngine>) {
    let mut sims = Vec::new();
    for _ in 0..4 {
        sims.push(sim(|_| {}).await);
    }
    let engines = sims
        .iter()
        .enumerate()
        .map(|(i, s)| engine(&format!("E{i}"), s, EngineRole::Plain))
        .collect();
    let mut model = ModelConfig::new("m", engines);
    model.policies.plain = Some(serde_json::from_value::<PolicyConfig>(policy).expect("a policy"));
    let mut config = config(vec![model]);
    config.affinity.session_header = "x-conversation".into();
    config.admin.token = Some("s3cret".into());
    (router(config).await, sims)
}

async fn send(
    client: &reqwest::Client,
    router: &RunningRouter,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client
        .post(url(router, "/v1/chat/completions"))
        .json(&chat("m", "hello"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("the router answers")
}

async fn engine_of(
    client: &reqwest::Client,
    router: &RunningRouter,
    headers: &[(&str, &str)],
) -> String {
    let response = send(client, router, headers).await;
    assert_eq!(response.status(), 200);
    response.headers()["x-switchyard-engine"]
        .to_str()
        .expect("ascii")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sticks_and_moves_together_when_its_engine_leaves() {
    let (router, sims) = fleet(json!({"type": "session_aware", "seed": 5})).await;
    let client = reqwest::Client::new();
    let session = [("x-conversation", "chat-42")];
    let first = engine_of(&client, &router, &session).await;
    for _ in 0..9 {
        assert_eq!(engine_of(&client, &router, &session).await, first);
    }
    let removed = client
        .delete(url(&router, &format!("/workers/{first}")))
        .bearer_auth("s3cret")
        .send()
        .await
        .expect("the admin API answers");
    assert_eq!(removed.status(), 204);
    let moved = engine_of(&client, &router, &session).await;
    assert_ne!(moved, first, "the session left the removed engine");
    for _ in 0..9 {
        assert_eq!(
            engine_of(&client, &router, &session).await,
            moved,
            "and sticks again"
        );
    }

    // Keyless requests spread over the engines left.
    let mut spread = BTreeSet::new();
    for _ in 0..30 {
        spread.insert(engine_of(&client, &router, &[]).await);
    }
    assert!(spread.len() >= 2, "keyless requests spread: {spread:?}");
    assert!(!spread.contains(&first));
    assert_eq!(
        router.context().affinity().len(),
        1,
        "only the keyed session is bound"
    );
    router.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_keys_stick_and_oversized_keys_are_refused() {
    let (router, sims) = fleet(json!({"type": "sticky", "fallback": "round_robin"})).await;
    let client = reqwest::Client::new();
    let mut bound = BTreeSet::new();
    for key in ["tenant-a", "tenant-b", "tenant-c"] {
        let header = [("x-switchyard-routing-key", key)];
        let first = engine_of(&client, &router, &header).await;
        for _ in 0..4 {
            assert_eq!(engine_of(&client, &router, &header).await, first, "{key}");
        }
        bound.insert(first);
    }
    assert_eq!(
        bound.len(),
        3,
        "new keys take the round-robin fallback's engines"
    );

    let long = "k".repeat(257);
    let response = send(&client, &router, &[("x-switchyard-routing-key", &long)]).await;
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.expect("an OpenAI-shaped error");
    assert_eq!(body["error"]["code"], "invalid_header");
    assert_eq!(body["error"]["param"], "x-switchyard-routing-key");
    router.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

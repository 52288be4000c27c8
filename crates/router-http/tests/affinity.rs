//! Session and routing-key affinity through the router: turns stick to one engine,
//! move together when it leaves, keyless requests spread, and replicas sharing a
//! backend (Redis, or rendezvous with none) agree on every session's engine.

use crate::common;

use std::collections::BTreeSet;

use common::{chat, config, engine, router, sim, url};
use router_config::{AffinityBackendKind, EngineRole, ModelConfig, RedisConfig, RouterConfig};
use router_http::RunningRouter;
use router_policy::PolicyConfig;
use router_state::test_util::RedisServer;
use serde_json::json;

async fn fleet(policy: &serde_json::Value) -> (RunningRouter, Vec<engine_sim::RunningEngine>) {
    let mut sims = Vec::new();
    for _ in 0..4 {
        sims.push(sim(|_| {}).await);
    }
    (router(file(&sims, policy, None)).await, sims)
}

/// The configuration of model `m` served by `sims` (engines `E0`...), but engine
/// `without`.
fn file(
    sims: &[engine_sim::RunningEngine],
    policy: &serde_json::Value,
    without: Option<&str>,
) -> RouterConfig {
    let engines = sims
        .iter()
        .enumerate()
        .map(|(i, s)| engine(&format!("E{i}"), s, EngineRole::Plain))
        .filter(|e| Some(e.id.as_str()) != without)
        .collect();
    let mut model = ModelConfig::new("m", engines);
    model.policies.plain =
        Some(serde_json::from_value::<PolicyConfig>(policy.clone()).expect("a policy"));
    let mut config = config(vec![model]);
    config.affinity.session_header = "x-conversation".into();
    config.admin.token = Some("s3cret".into());
    config
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
    let policy = json!({"type": "session_aware", "seed": 5});
    let (router, sims) = fleet(&policy).await;
    let client = reqwest::Client::new();
    let session = [("x-conversation", "chat-42")];
    let first = engine_of(&client, &router, &session).await;
    for _ in 0..9 {
        assert_eq!(engine_of(&client, &router, &session).await, first);
    }
    let summary = router
        .context()
        .reload(file(&sims, &policy, Some(&first)))
        .await
        .expect("the engine leaves");
    assert_eq!(summary.removed, 1);
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
        router.context().affinity().expect("a local store").len(),
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
    let (router, sims) = fleet(&json!({"type": "sticky", "fallback": "round_robin"})).await;
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

/// Three routers in front of the same four engines, with `backend`; each session's
/// turns go to the routers in turn. Answers the engines each session was served by.
async fn sessions_across_replicas(
    backend: AffinityBackendKind,
    redis: Option<RedisConfig>,
) -> Vec<BTreeSet<String>> {
    let mut sims = Vec::new();
    for _ in 0..4 {
        sims.push(sim(|_| {}).await);
    }
    let mut routers = Vec::new();
    for _ in 0..3 {
        let engines = sims
            .iter()
            .enumerate()
            .map(|(i, s)| engine(&format!("E{i}"), s, EngineRole::Plain))
            .collect();
        let mut model = ModelConfig::new("m", engines);
        // Unseeded: each replica's fallback samples differently.
        model.policies.plain = Some(
            serde_json::from_value::<PolicyConfig>(json!({"type": "session_aware"}))
                .expect("a policy"),
        );
        let mut config = config(vec![model]);
        config.affinity.backend = backend;
        config.affinity.redis = redis.clone();
        routers.push(router(config).await);
    }
    let client = reqwest::Client::new();
    let mut served = Vec::new();
    for s in 0..12 {
        let session = format!("conversation-{s}");
        let mut engines = BTreeSet::new();
        for turn in 0..6 {
            let header = [("x-session-id", session.as_str())];
            engines.insert(engine_of(&client, &routers[turn % 3], &header).await);
        }
        served.push(engines);
    }
    if redis.is_some() {
        let scraped = common::metrics(&routers[0]).await;
        assert!(
            scraped.contains("switchyard_affinity_backend_up 1"),
            "{scraped}"
        );
        for family in [
            "switchyard_affinity_local_fallbacks_total 0",
            "switchyard_affinity_backend_skips_total 0",
        ] {
            assert!(scraped.contains(family), "{scraped}");
        }
    }
    for r in routers {
        r.shutdown().await;
    }
    for s in sims {
        s.shutdown().await;
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_redis_or_rendezvous_keep_each_session_on_one_engine() {
    let server = RedisServer::start();
    let mut redis = RedisConfig::new(server.url());
    // A loaded test machine must not time a command out into a local binding.
    redis.timeout_ms = 5_000;
    for (backend, redis) in [
        (AffinityBackendKind::Redis, Some(redis)),
        (AffinityBackendKind::Rendezvous, None),
    ] {
        let served = sessions_across_replicas(backend, redis).await;
        assert!(
            served.iter().all(|engines| engines.len() == 1),
            "{backend:?}: {served:?}"
        );
        let used: BTreeSet<&String> = served.iter().flatten().collect();
        assert!(
            used.len() >= 2,
            "{backend:?}: sessions spread over engines: {used:?}"
        );
    }
    // The control: per-process bindings scatter a session over the replicas' picks.
    let served = sessions_across_replicas(AffinityBackendKind::Local, None).await;
    assert!(
        served.iter().any(|engines| engines.len() > 1),
        "local bindings are not shared: {served:?}"
    );
}

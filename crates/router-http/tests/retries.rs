//! Retries end to end, over real sockets against simulated engines: a request an
//! engine never started goes to another engine of its bucket (PD: both legs, with a
//! fresh room), nothing is sent again once it may have started, and the router-wide
//! budget holds when every engine refuses.

use crate::common;

use common::*;
use engine_sim::{RunningEngine, SimConfig};
use router_config::{EngineRole, ModelConfig, RetryConfig, RouterConfig};
use serde_json::{Value, json};

/// A router whose engines stay candidates whatever they answer: probed only at
/// startup, with a breaker that never opens in these tests.
fn steady(models: Vec<ModelConfig>) -> RouterConfig {
    let mut config = config(models);
    config.health.interval_ms = 86_400_000;
    config.health.breaker_failures = 1_000_000;
    config
}

fn plain(engines: &[(&str, &RunningEngine)]) -> Vec<ModelConfig> {
    vec![ModelConfig::new(
        "m",
        engines
            .iter()
            .map(|(id, sim)| engine(id, sim, EngineRole::Plain))
            .collect(),
    )]
}

/// The sum of the samples of `name` whose labels contain every one of `labels`.
async fn metric(router: &router_http::RunningRouter, name: &str, labels: &[&str]) -> f64 {
    metrics(router)
        .await
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn failing(status: u16) -> impl FnOnce(&mut SimConfig) {
    move |c: &mut SimConfig| {
        c.faults.error_rate = 1.0;
        c.faults.error_status = Some(status);
    }
}

#[tokio::test]
async fn a_refused_engines_requests_are_served_by_another() {
    let (a, b) = (sim(|_| {}).await, sim(|_| {}).await);
    let router = router(steady(plain(&[("A", &a), ("B", &b)]))).await;
    a.shutdown().await;
    for n in 0..6 {
        let mut body = chat("m", &format!("request {n}"));
        body["stream"] = json!(n % 2 == 0);
        let response = post(&router, &body).await;
        assert_eq!(response.status(), 200, "request {n}");
        assert_eq!(response.headers()["x-switchyard-engine"], "B");
        response.bytes().await.unwrap();
    }
    let refused = metric(&router, "switchyard_picks_total", &[r#"engine="A""#]).await;
    assert!(refused >= 1.0, "round robin offered A");
    assert_eq!(
        metric(
            &router,
            "switchyard_retries_total",
            &[r#"reason="connect_failed""#]
        )
        .await,
        refused,
        "every pick of A was sent again"
    );
    assert_eq!(b.visits().answered, 6);
    router.shutdown().await;
}

#[tokio::test]
async fn a_429_or_503_is_retried_counted_once_and_the_last_engines_429_is_relayed_as_it_is() {
    let (a, b) = (sim(failing(429)).await, sim(|_| {}).await);
    let router = router(steady(plain(&[("A", &a), ("B", &b)]))).await;
    let set_faults = |sim: &RunningEngine, faults: Value| {
        let url = format!("{}/admin/faults", sim.url());
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&faults)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    };
    for (status, reason) in [(429, "status_429"), (503, "status_503")] {
        set_faults(&a, json!({"error_rate": 1.0, "error_status": status})).await;
        let refused = a.visits().answered;
        for n in 0..4 {
            let response = post(&router, &chat("m", &format!("request {n}"))).await;
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["x-switchyard-engine"], "B");
            response.bytes().await.unwrap();
        }
        let retried = metric(
            &router,
            "switchyard_retries_total",
            &[&format!(r#"reason="{reason}""#)],
        )
        .await;
        assert_eq!(retried, (a.visits().answered - refused) as f64);
        assert!(retried >= 1.0, "round robin offered A");
    }
    set_faults(&a, json!({"error_rate": 1.0, "error_status": 503})).await;
    set_faults(&b, json!({"error_rate": 1.0, "error_status": 429})).await;
    let (a_before, b_before) = (a.visits().answered, b.visits().answered);
    let response = post(&router, &chat("m", "nobody can take it")).await;
    assert_eq!(
        (
            a.visits().answered - a_before,
            b.visits().answered - b_before
        ),
        (1, 1),
        "each engine tried once"
    );
    assert_eq!(
        response.status(),
        429,
        "an engine's 429 is the client's answer"
    );
    let relayed: Value = response.json().await.unwrap();
    assert_eq!(relayed["error"]["message"], "simulated engine failure");
    assert_eq!(
        metric(&router, "switchyard_requests_total", &[]).await,
        9.0,
        "each request counted once, a retried 429 not at all"
    );
    assert_eq!(
        metric(
            &router,
            "switchyard_requests_total",
            &[r#"outcome="cancelled""#]
        )
        .await,
        0.0
    );
    router.shutdown().await;
}

#[tokio::test]
async fn nothing_the_engine_may_have_started_is_sent_again() {
    let (a, b) = (sim(failing(500)).await, sim(|_| {}).await);
    let failing_router = router(steady(plain(&[("A", &a), ("B", &b)]))).await;
    let mut statuses = Vec::new();
    for n in 0..4 {
        let response = post(&failing_router, &chat("m", &format!("request {n}"))).await;
        statuses.push(response.status().as_u16());
        response.bytes().await.unwrap();
    }
    statuses.sort_unstable();
    let failed = a.visits().answered as usize;
    assert!(failed >= 1, "round robin offered A");
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count(),
        failed,
        "a 500 may follow started work: {statuses:?}"
    );
    assert_eq!(
        metric(&failing_router, "switchyard_retries_total", &[]).await,
        0.0
    );
    failing_router.shutdown().await;
    let (cut, whole) = (
        sim(|c| c.faults.disconnect_after_chunks = Some(2)).await,
        sim(|_| {}).await,
    );
    let cutting = router(steady(plain(&[("A", &cut), ("B", &whole)]))).await;
    for n in 0..2 {
        let mut body = chat("m", &format!("stream {n}"));
        body["stream"] = json!(true);
        let response = post(&cutting, &body).await;
        assert_eq!(response.status(), 200);
        let engine = response.headers()["x-switchyard-engine"].clone();
        assert_eq!(
            response.bytes().await.is_err(),
            engine == "A",
            "A's stream ends with an error, B's whole"
        );
    }
    assert_eq!(
        (cut.visits().answered, whole.visits().answered),
        (1, 1),
        "the stream A cut was not sent to B"
    );
    assert_eq!(metric(&cutting, "switchyard_retries_total", &[]).await, 0.0);
    cutting.shutdown().await;
}

#[tokio::test]
async fn a_pd_retry_picks_both_legs_again_with_a_fresh_room() {
    let (p1, p2, d1) = (
        sim(|c| {
            failing(503)(c);
            c.role = engine_sim::EngineRole::Prefill;
            c.bootstrap_port = Some(0);
        })
        .await,
        prefill_sim().await,
        decode_sim().await,
    );
    let mut model = ModelConfig::new(
        "pd",
        vec![
            engine("P1", &p1, EngineRole::Prefill),
            engine("P2", &p2, EngineRole::Prefill),
            engine("D1", &d1, EngineRole::Decode),
        ],
    );
    model.policies.prefill = Some(serde_json::from_value(json!({"type": "round_robin"})).unwrap());
    let router = router(steady(vec![model])).await;
    for n in 0..4 {
        let response = post(&router, &chat("pd", &format!("request {n}"))).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-switchyard-prefill"], "P2");
        response.bytes().await.unwrap();
    }
    let rooms = |requests: Vec<Value>| -> Vec<u64> {
        requests
            .iter()
            .map(|r| r["bootstrap_room"].as_u64().unwrap())
            .collect()
    };
    let (refused, served) = (
        rooms(recent_requests(&p1).await),
        rooms(recent_requests(&p2).await),
    );
    let decoded = rooms(recent_requests(&d1).await);
    assert!(!refused.is_empty(), "round robin offered P1");
    assert_eq!(served.len(), 4);
    assert!(
        refused.iter().all(|room| !served.contains(room)),
        "a retry never reuses a room: {refused:?} {served:?}"
    );
    assert!(
        served.iter().all(|room| decoded.contains(room)),
        "each decode leg that was answered had the prefill's room"
    );
    assert_eq!(
        metric(
            &router,
            "switchyard_retries_total",
            &[r#"reason="status_503""#]
        )
        .await,
        refused.len() as f64
    );
    router.shutdown().await;
}

#[tokio::test]
async fn the_budget_holds_when_every_engine_refuses() {
    let (a, b) = (sim(failing(503)).await, sim(failing(503)).await);
    let mut config = steady(plain(&[("A", &a), ("B", &b)]));
    config.retries = RetryConfig {
        max_attempts: 3,
        budget_ratio: 0.5,
        budget_floor: 0,
        budget_window_ms: 86_400_000,
    };
    let router = router(config).await;
    for n in 0..20 {
        let response = post(&router, &chat("m", &format!("storm {n}"))).await;
        assert_eq!(response.status(), 502);
        response.bytes().await.unwrap();
    }
    assert_eq!(
        (
            metric(&router, "switchyard_retries_total", &[]).await,
            metric(&router, "switchyard_retries_refused_total", &[]).await,
        ),
        (10.0, 10.0),
        "half as many retries as requests; the other half refused"
    );
    assert_eq!(a.visits().answered + b.visits().answered, 30);
    router.shutdown().await;
}

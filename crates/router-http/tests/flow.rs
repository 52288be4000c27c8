//! Flow control end to end, through the router to simulated engines: a burst waits
//! its turn in the model's queue instead of being refused, tenants share a saturated
//! model by weight, the urgent band waits least, and every refusal says when to come
//! back.

use crate::common::{self, TempDir, chat, config, engine, router, sim, url};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use engine_sim::RunningEngine;
use router_config::{DecisionsConfig, EngineRole, ModelConfig, RouterConfig};
use router_http::RunningRouter;
use serde_json::{Value, json};

/// The longest a test waits for the router or an engine to get somewhere.
const GUARD: Duration = Duration::from_secs(20);

/// A model served by `engines` with round robin capped at `cap` requests in flight
/// per engine, and the flow section `flow`.
fn model(engines: &[&RunningEngine], cap: u64, flow: Value) -> ModelConfig {
    let members = engines
        .iter()
        .enumerate()
        .map(|(i, e)| engine(&format!("E{i}"), e, EngineRole::Plain))
        .collect();
    let mut model = ModelConfig::new("m", members);
    model.policies.plain = Some(
        serde_json::from_value(json!({
            "type": "round_robin",
            "admission": {"max_inflight_requests": cap}
        }))
        .unwrap(),
    );
    model.flow = serde_json::from_value(flow).unwrap();
    model
}

/// Sets an engine's faults.
async fn faults(engine: &RunningEngine, faults: Value) {
    let reply = reqwest::Client::new()
        .post(format!("{}/admin/faults", engine.url()))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
}

/// Waits until `model`'s queue holds `n` requests in all.
async fn queued(router: &RunningRouter, n: usize) {
    let depth = || {
        router
            .context()
            .queue_depth("m")
            .expect("the model has a queue")
            .iter()
            .sum::<usize>()
    };
    tokio::time::timeout(GUARD, async {
        while depth() != n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} queued, not {n}", depth()));
}

/// Sends a chat request with `headers`, and returns its status and `Retry-After`.
async fn send(
    client: &reqwest::Client,
    router: &RunningRouter,
    body: &Value,
    headers: &[(&str, String)],
) -> (u16, Option<String>) {
    let mut request = client.post(url(router, "/v1/chat/completions")).json(body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    response.bytes().await.unwrap();
    (status, retry_after)
}

/// A chat of `tokens` output tokens.
fn short(tokens: u64) -> Value {
    let mut body = chat("m", "flow");
    body["max_tokens"] = tokens.into();
    body
}

// Four engines' worth of slots times four arrive at once: without a queue, all but
// four would get 503. With one, every request is served as soon as the slots the
// requests queued before it take have freed: wave by wave, in the order they queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_four_times_the_slots_waits_its_turn_and_none_is_refused() {
    const SLOTS: usize = 4;
    const BURST: usize = 4 * SLOTS;
    // 10 tokens at 100 a second: each request takes 100 ms once released.
    let a = sim(|c| c.decode_tokens_per_sec = 100.0).await;
    faults(&a, json!({"hold_after_chunks": 0})).await;
    let flow = json!({"queue": {"max_wait_ms": 2000}});
    let router = router(config(vec![model(&[&a], SLOTS as u64, flow)])).await;
    let client = reqwest::Client::new();
    let mut requests = Vec::new();
    for i in 0..BURST {
        let (client, body) = (client.clone(), short(10));
        let id = format!("burst-{i:02}");
        let target = url(&router, "/v1/chat/completions");
        requests.push(tokio::spawn(async move {
            let response = client
                .post(target)
                .header("x-request-id", id)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            response.bytes().await.unwrap();
            status
        }));
        if i < SLOTS {
            tokio::time::timeout(GUARD, a.visits_until(|v| v.open == i as u64 + 1))
                .await
                .expect("the engine holds the first requests");
        } else {
            queued(&router, i + 1 - SLOTS).await;
        }
    }
    faults(&a, json!({})).await;
    for request in requests {
        assert_eq!(
            request.await.unwrap(),
            200,
            "no request of the burst is refused"
        );
    }
    assert!(a.engine().peak_requests() <= SLOTS as u64);
    let seen: Vec<String> = reqwest::get(format!("{}/admin/requests", a.url()))
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .collect();
    // Requests admitted together (as one wave's slots free) may reach the engine in
    // any order; a wave never holds a request queued after the next wave's.
    for (wave, arrived) in seen.chunks(SLOTS).enumerate().skip(1) {
        let mut arrived = arrived.to_vec();
        arrived.sort();
        let expected: Vec<String> = (wave * SLOTS..(wave + 1) * SLOTS)
            .map(|i| format!("burst-{i:02}"))
            .collect();
        assert_eq!(arrived, expected, "wave {wave} is the next {SLOTS} queued");
    }
    router.shutdown().await;
    a.shutdown().await;
}

// One tenant: a long prompt waits for the one engine of the `long` bucket, held by
// another long prompt. A short prompt queued behind it goes to the idle `short` engine
// at once: the head of a tenant's queue that no engine can take does not hold back
// the requests behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_engine_can_take_does_not_hold_back_those_behind_it() {
    let (s, l) = (sim(|_| {}).await, sim(|_| {}).await);
    faults(&l, json!({"hold_after_chunks": 0})).await;
    let capped = json!({"type": "round_robin", "admission": {"max_inflight_requests": 1}});
    let model: ModelConfig = serde_json::from_value(json!({
        "id": "m",
        "engines": [
            {"id": "S", "url": s.url(), "role": "plain"},
            {"id": "L", "url": l.url(), "role": "plain"},
        ],
        "buckets": [
            {"id": "short", "limits": {"max": 64}, "groups": {"plain": {"engine_ids": ["S"], "policy": capped}}},
            {"id": "long", "groups": {"plain": {"engine_ids": ["L"], "policy": capped}}},
        ],
        "flow": {"queue": {"max_wait_ms": 60000}},
    }))
    .unwrap();
    let router = router(config(vec![model])).await;
    let client = reqwest::Client::new();
    let long = chat("m", &"a long question ".repeat(100));
    let held = tokio::spawn({
        let (client, target, body) = (
            client.clone(),
            url(&router, "/v1/chat/completions"),
            long.clone(),
        );
        async move {
            client
                .post(target)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    tokio::time::timeout(GUARD, l.visits_until(|v| v.open == 1))
        .await
        .expect("the long engine holds the first long request");
    let waiting = tokio::spawn({
        let (client, target) = (client.clone(), url(&router, "/v1/chat/completions"));
        async move {
            client
                .post(target)
                .json(&long)
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    queued(&router, 1).await;
    let (status, _) = tokio::time::timeout(GUARD, send(&client, &router, &chat("m", "hi"), &[]))
        .await
        .expect("the short request is not held back");
    assert_eq!(status, 200);
    assert_eq!(s.visits().answered, 1, "the short engine answered it");
    queued(&router, 1).await;
    faults(&l, json!({})).await;
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(waiting.await.unwrap(), 200);
    router.shutdown().await;
    s.shutdown().await;
    l.shutdown().await;
}

/// Runs `clients[t]` closed-loop clients for each tenant of `tenants` (each sends its
/// next request as soon as its last is answered) until `count` requests are answered
/// after the first `skip`, and returns how many of those each tenant had.
async fn closed_loops(
    router: &RunningRouter,
    tenants: &[(&str, usize)],
    skip: u64,
    count: u64,
) -> HashMap<String, u64> {
    let answered = Arc::new(AtomicU64::new(0));
    let counts: Arc<HashMap<String, AtomicU64>> = Arc::new(
        tenants
            .iter()
            .map(|(t, _)| ((*t).to_owned(), AtomicU64::new(0)))
            .collect(),
    );
    let done = Arc::new(tokio::sync::Notify::new());
    let stop = Arc::new(AtomicBool::new(false));
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (tenant, clients) in tenants {
        for _ in 0..*clients {
            let (client, target) = (client.clone(), url(router, "/v1/chat/completions"));
            let (answered, counts, done, stop) = (
                Arc::clone(&answered),
                Arc::clone(&counts),
                Arc::clone(&done),
                Arc::clone(&stop),
            );
            let tenant = (*tenant).to_owned();
            tasks.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let response = client
                        .post(&target)
                        .header("x-tenant", &tenant)
                        .json(&short(2))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(
                        response.status(),
                        200,
                        "{tenant}: {}",
                        response.text().await.unwrap()
                    );
                    response.bytes().await.unwrap();
                    let n = answered.fetch_add(1, Ordering::SeqCst);
                    if n >= skip && n < skip + count {
                        counts[&tenant].fetch_add(1, Ordering::SeqCst);
                    }
                    if n + 1 == skip + count {
                        stop.store(true, Ordering::SeqCst);
                        done.notify_one();
                    }
                }
            });
        }
    }
    tokio::time::timeout(Duration::from_secs(120), done.notified())
        .await
        .expect("the clients get their answers");
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    counts
        .iter()
        .map(|(t, n)| (t.clone(), n.load(Ordering::SeqCst)))
        .collect()
}

async fn shares(weights: Value) -> f64 {
    // 2 tokens at 100 a second: 20 ms a request; 4 slots.
    let a = sim(|c| c.decode_tokens_per_sec = 100.0).await;
    let flow = json!({
        "queue": {"max_wait_ms": 60000},
        "tenants": {"header": "x-tenant", "weights": weights},
    });
    let router = router(config(vec![model(&[&a], 4, flow)])).await;
    // `a` offers ten times `b`'s load: 40 clients to 4, both always waiting.
    let counts = closed_loops(&router, &[("a", 40), ("b", 4)], 40, 400).await;
    router.shutdown().await;
    a.shutdown().await;
    counts["a"] as f64 / (counts["a"] + counts["b"]) as f64
}

// Without fair share, `a` would get its 91% of the offered load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlogged_tenants_share_a_saturated_model_by_weight() {
    let equal = shares(json!({})).await;
    assert!(
        (0.45..=0.55).contains(&equal),
        "equal weights: a had {equal:.3}"
    );
    let three_to_one = shares(json!({"a": 3, "b": 1})).await;
    assert!(
        (0.70..=0.80).contains(&three_to_one),
        "weights 3:1: a had {three_to_one:.3}"
    );
}

fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

// One urgent client and ten ordinary ones, all one tenant, share two slots: the
// urgent request goes to the next slot that frees, the others queue behind each other
// (in arrival order, the urgent one would wait as long as they do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_urgent_band_waits_less_than_the_median_ordinary_request() {
    let dir = TempDir::new("flow-priority");
    let a = sim(|c| c.decode_tokens_per_sec = 100.0).await;
    let flow = json!({
        "queue": {"max_wait_ms": 60000},
        "priority": {"header": "x-priority", "bands": [10]},
    });
    let mut config: RouterConfig = config(vec![model(&[&a], 2, flow)]);
    let records = dir.path().join("decisions.jsonl");
    config.decisions = Some(DecisionsConfig::new(records.clone(), 1.0));
    let router = router(config).await;
    let urgent = tokio::spawn({
        let (client, target) = (reqwest::Client::new(), url(&router, "/v1/chat/completions"));
        async move {
            for _ in 0..60 {
                let response = client
                    .post(&target)
                    .header("x-priority", "10")
                    .json(&short(2))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                response.bytes().await.unwrap();
            }
        }
    });
    let ordinary = tokio::spawn({
        let router_url = url(&router, "/v1/chat/completions");
        async move {
            let client = reqwest::Client::new();
            let mut loops = tokio::task::JoinSet::new();
            for _ in 0..10 {
                let (client, target) = (client.clone(), router_url.clone());
                loops.spawn(async move {
                    loop {
                        let response = client.post(&target).json(&short(2)).send().await.unwrap();
                        response.bytes().await.unwrap();
                    }
                });
            }
            loops.join_next().await;
        }
    });
    tokio::time::timeout(Duration::from_secs(120), urgent)
        .await
        .expect("the urgent client is served")
        .unwrap();
    ordinary.abort();
    drop(ordinary.await);
    let written: u64 = common::metrics(&router)
        .await
        .lines()
        .find_map(|l| {
            l.strip_prefix("switchyard_decision_records_total{outcome=\"written\"} ")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    let records = common::decision_records(&router, &records, written).await;
    let waits = |band: u64| -> Vec<f64> {
        records
            .iter()
            .filter(|r| r["flow"]["band"] == band && r["flow"]["refused"].is_null())
            .map(|r| r["flow"]["waited_ms"].as_f64().unwrap_or(0.0))
            .collect()
    };
    let (urgent, ordinary) = (waits(0), waits(1));
    assert!(
        urgent.len() >= 60 && ordinary.len() >= 60,
        "{} and {}",
        urgent.len(),
        ordinary.len()
    );
    let (urgent_p99, ordinary_p50) = (percentile(urgent, 0.99), percentile(ordinary, 0.5));
    assert!(
        urgent_p99 <= ordinary_p50,
        "urgent p99 {urgent_p99:.1} ms, ordinary p50 {ordinary_p50:.1} ms"
    );
    router.shutdown().await;
    a.shutdown().await;
    dir.remove();
}

// A tenant at its cap gets 429 while another is served; a full queue and a request
// waited past its deadline get 503, each with Retry-After; a client that leaves while
// queued is gone from the queue at once; a priority the header gave reaches the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_say_when_to_come_back_and_a_client_that_leaves_is_gone() {
    let a = sim(|c| c.decode_tokens_per_sec = 100.0).await;
    faults(&a, json!({"hold_after_chunks": 0})).await;
    let flow = json!({
        "queue": {"max_wait_ms": 300, "max_queued": 1},
        "priority": {"header": "x-priority", "forward": true},
        "tenants": {"header": "x-tenant", "max_inflight": {"capped": 1}},
    });
    let router = router(config(vec![model(&[&a], 1, flow)])).await;
    let client = reqwest::Client::new();
    let held = tokio::spawn({
        let (client, target) = (client.clone(), url(&router, "/v1/chat/completions"));
        async move {
            client
                .post(target)
                .header("x-tenant", "capped")
                .header("x-priority", "7")
                .json(&short(2))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    tokio::time::timeout(GUARD, a.visits_until(|v| v.open == 1))
        .await
        .expect("the engine holds the first request");
    let tenant = |t: &str| vec![("x-tenant", t.to_owned())];

    let (status, retry) = send(&client, &router, &short(2), &tenant("capped")).await;
    assert_eq!(
        (status, retry.as_deref()),
        (429, Some("1")),
        "the tenant is at its cap"
    );

    let leaving = tokio::spawn({
        let (client, router_url) = (client.clone(), url(&router, "/v1/chat/completions"));
        async move { client.post(router_url).json(&short(2)).send().await }
    });
    queued(&router, 1).await;
    let (status, retry) = send(&client, &router, &short(2), &tenant("other")).await;
    assert_eq!(status, 503, "the queue holds its one request");
    assert!(retry.is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
    leaving.abort();
    drop(leaving.await);
    queued(&router, 0).await;

    let (status, retry) = send(&client, &router, &short(2), &tenant("other")).await;
    assert_eq!(status, 503, "no slot freed within max_wait_ms");
    assert!(retry.is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
    let scraped = common::metrics(&router).await;
    for line in [
        "switchyard_queue_refusals_total{model=\"m\",band=\"0\",reason=\"full\"} 1",
        "switchyard_queue_refusals_total{model=\"m\",band=\"0\",reason=\"timeout\"} 1",
        "switchyard_tenant_requests_total{model=\"m\",tenant=\"capped\",outcome=\"refused\"} 1",
        "switchyard_queue_depth{model=\"m\",band=\"0\"} 0",
    ] {
        assert!(scraped.contains(line), "{line} in\n{scraped}");
    }

    faults(&a, json!({})).await;
    assert_eq!(held.await.unwrap(), 200);
    let seen = reqwest::get(format!("{}/admin/requests", a.url()))
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let requests = seen["requests"].as_array().unwrap();
    assert_eq!(
        requests.len(),
        1,
        "the client that left never reached the engine"
    );
    assert_eq!(
        requests[0]["priority"], 7,
        "the header's priority is forwarded"
    );
    router.shutdown().await;
    a.shutdown().await;
}

// A reload that leaves a model's flow section as it was keeps its queue: a request
// waiting in it keeps its place, and is served once the engine has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_queue_of_an_unchanged_flow_section() {
    let a = sim(|c| c.decode_tokens_per_sec = 100.0).await;
    faults(&a, json!({"hold_after_chunks": 0})).await;
    let flow = json!({"queue": {"max_wait_ms": 60000}});
    let config = config(vec![model(&[&a], 1, flow.clone())]);
    let router = router(config.clone()).await;
    let client = reqwest::Client::new();
    let held = tokio::spawn(send_owned(
        client.clone(),
        url(&router, "/v1/chat/completions"),
    ));
    tokio::time::timeout(GUARD, a.visits_until(|v| v.open == 1))
        .await
        .expect("the engine holds the first request");
    let waiting = tokio::spawn(send_owned(client, url(&router, "/v1/chat/completions")));
    queued(&router, 1).await;
    let mut changed = config.clone();
    changed.models[0].block_size = 32;
    router.context().reload(changed).await.expect("applied");
    queued(&router, 1).await;
    faults(&a, json!({})).await;
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(waiting.await.unwrap(), 200, "the waiting request is served");
    queued(&router, 0).await;
    router.shutdown().await;
    a.shutdown().await;
}

async fn send_owned(client: reqwest::Client, target: String) -> u16 {
    let response = client.post(target).json(&short(2)).send().await.unwrap();
    let status = response.status().as_u16();
    response.bytes().await.unwrap();
    status
}

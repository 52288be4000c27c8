//! Switchyard as the endpoint picker of a real Envoy (deploy/envoy/envoy.yaml):
//! clients talk to Envoy, Envoy asks the router's `ext_proc` service which engine
//! serves each request and sends it there, simulated engines answer.

mod envoy;
mod protocol;

use std::net::SocketAddr;
use std::time::Duration;

use engine_sim::{RunningEngine, Visits};
use futures_util::StreamExt;
use router_config::RouterConfig;
use router_http::{AppContext, RunningRouter};
use serde_json::{Value, json};

use crate::common::{self, byte_tokenizer, kv_caught_up, metrics, sim};
use envoy::{Envoy, Failure};

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A router of model `m` on `engines` (plain, `E0`, `E1`, ...) with `policy`, serving
/// the picker on `picker` (port 0: any).
fn config(engines: &[RunningEngine], policy: Value, picker: SocketAddr) -> RouterConfig {
    let members: Vec<Value> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"id": format!("E{i}"), "url": e.url(), "role": "plain"}))
        .collect();
    let text = json!({
        "listen": "127.0.0.1:0",
        "models": [{
            "id": "m",
            "tokenizer": byte_tokenizer(),
            "block_size": 16,
            "engines": members,
            "policies": {"plain": policy},
        }],
        "health": {"interval_ms": 50, "timeout_ms": 5000, "failure_threshold": 3, "success_threshold": 1},
        "picker": {"listen": picker, "max_streams": 64, "token": envoy::token()},
    })
    .to_string();
    RouterConfig::from_yaml(&text).expect("a configuration")
}

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A router serving the picker, and Envoy in front of it.
async fn gateway(
    engines: &[RunningEngine],
    policy: Value,
    failure: Failure,
) -> (RunningRouter, Envoy) {
    let router = common::router(config(engines, policy, any_port())).await;
    let picker = router.picker_addr().expect("the picker listens");
    let envoy = Envoy::start(picker, &addresses(engines), failure).await;
    (router, envoy)
}

fn addresses(engines: &[RunningEngine]) -> Vec<SocketAddr> {
    engines
        .iter()
        .map(|e| {
            e.url()
                .trim_start_matches("http://")
                .parse()
                .expect("an engine at ip:port")
        })
        .collect()
}

fn chat(prompt: &str) -> Value {
    common::chat("m", prompt)
}

async fn post(envoy: &Envoy, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(envoy.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("Envoy answers: {e}\n{}", envoy.log()))
}

/// The engine (`E0`, ...) whose count of answered requests went up from `before`.
fn served(engines: &[RunningEngine], before: &[Visits]) -> Vec<String> {
    engines
        .iter()
        .zip(before)
        .enumerate()
        .filter(|(_, (e, b))| e.visits().answered > b.answered)
        .map(|(i, _)| format!("E{i}"))
        .collect()
}

fn visits(engines: &[RunningEngine]) -> Vec<Visits> {
    engines.iter().map(RunningEngine::visits).collect()
}

/// The router's in-flight count of `engines`, summed.
fn in_flight(ctx: &AppContext, engines: &[&str]) -> u64 {
    engines
        .iter()
        .map(|id| ctx.fleet().load().in_flight(&(*id).into()))
        .sum()
}

/// Waits until the router's `/metrics` has `line` (a stream is counted as it ends,
/// which its client may see first).
async fn counted(router: &RunningRouter, line: &str) {
    within(line, async {
        while !common::has_line(&metrics(router).await, line) {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Waits until the router counts nothing in flight on `engines`.
async fn released(ctx: &AppContext, engines: &[&str]) {
    within("the engines' slots released", async {
        while in_flight(ctx, engines) > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sharing_a_prefix_reach_the_engine_holding_it_through_envoy() {
    let engines = common::kv_sims(3).await;
    let policy = json!({"type": "cache_aware", "min_matched_tokens": 64});
    let (router, envoy) = gateway(&engines, policy, Failure::Closed).await;
    for conversation in 0..4 {
        let system = format!("conversation {conversation}: ").repeat(40);
        let first = format!("{system} first question");
        let before = visits(&engines);
        let response = post(&envoy, &chat(&first)).await;
        assert_eq!(response.status(), 200, "{}", envoy.log());
        let named = response.headers()["x-switchyard-engine"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            served(&engines, &before),
            std::slice::from_ref(&named),
            "Envoy sent it to the engine named"
        );
        response.json::<Value>().await.expect("an answer");
        kv_caught_up(&router, &engines).await;
        let before = visits(&engines);
        let response = post(&envoy, &chat(&format!("{first} and a follow-up"))).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-switchyard-engine"], named.as_str());
        assert_eq!(response.headers()["x-switchyard-reason"], "cache_hit");
        let answer: Value = response.json().await.expect("an answer");
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            cached >= 400,
            "the holder served the prefix from cache: {answer}"
        );
        assert_eq!(
            served(&engines, &before),
            [named],
            "the follow-up reached the holder"
        );
    }
    counted(
        &router,
        r#"switchyard_picker_streams_total{outcome="routed"} 8"#,
    )
    .await;
    let text = metrics(&router).await;
    assert!(
        common::has_line(
            &text,
            r#"switchyard_requests_total{model="m",outcome="ok",code="ok"} 8"#
        ),
        "{text}"
    );
    let compared: f64 = text
        .lines()
        .filter(|l| l.starts_with("switchyard_engine_compared_answers_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        compared, 8.0,
        "every answer compared with its pick's prediction: {text}"
    );
    released(router.context(), &["E0", "E1", "E2"]).await;
    drop(envoy);
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answers_and_large_bodies_pass_whole() {
    let engine = sim(|c| {
        c.model = "m".into();
        c.tokenizer = Some(byte_tokenizer());
    })
    .await;
    let engines = [engine];
    let records = crate::common::TempDir::new("picker-records");
    let file = records.path().join("decisions.jsonl");
    let mut recorded = config(&engines, json!({"type": "round_robin"}), any_port());
    recorded.decisions = Some(
        serde_json::from_value(json!({"path": file, "sample_ratio": 1.0})).expect("a section"),
    );
    let router = common::router(recorded).await;
    let picker = router.picker_addr().expect("the picker listens");
    let envoy = Envoy::start(picker, &addresses(&engines), Failure::Closed).await;
    // A prompt of several of the picker's body chunks, whose length the engine counts.
    let prompt = "0123456789abcdef".repeat(10_000);
    let mut body = chat(&prompt);
    body["max_tokens"] = 40.into();
    let direct: Value = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", engines[0].url()))
        .json(&body)
        .send()
        .await
        .expect("the engine answers")
        .json()
        .await
        .expect("an answer");
    let routed = post(&envoy, &body).await;
    let ids = vec![
        routed.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned(),
    ];
    let routed: Value = routed.json().await.expect("an answer");
    assert_eq!(
        routed["usage"]["prompt_tokens"], direct["usage"]["prompt_tokens"],
        "the whole prompt reached the engine"
    );
    body["stream"] = true.into();
    body["stream_options"] = json!({"include_usage": true});
    let response = post(&envoy, &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut ids = ids;
    ids.push(
        response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned(),
    );
    let text = response.text().await.expect("the whole stream");
    let events: Vec<&str> = text.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    let usage: Value = serde_json::from_str(&events[events.len() - 2]["data: ".len()..]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 40, "{text}");
    let tokens = events.iter().filter(|e| e.contains("\"content\"")).count();
    assert!(tokens >= 40, "every token's event: {text}");
    released(router.context(), &["E0"]).await;
    let text = metrics(&router).await;
    assert!(
        common::has_line(
            &text,
            r#"switchyard_requests_total{model="m",outcome="ok",code="ok"} 2"#
        ),
        "{text}"
    );
    assert!(
        common::has_line(
            &text,
            r#"switchyard_time_to_first_token_seconds_count{model="m"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"switchyard_reported_prompt_tokens_total{model="m",stage="plain"}"#),
        "usage is counted from the answer the gateway streamed: {text}"
    );
    let written = common::decision_records(&router, &file, 2).await;
    let mut recorded: Vec<&str> = written
        .iter()
        .filter_map(|r| r["request_id"].as_str())
        .collect();
    recorded.sort_unstable();
    ids.sort_unstable();
    assert_eq!(recorded, ids, "the ids the clients got through Envoy");
    for record in &written {
        assert_eq!(record["pick"]["engines"]["plain"]["engine"], "E0");
        let result = &record["result"];
        assert_eq!(
            (&result["status"], &result["outcome"], &result["code"]),
            (&json!(200), &json!("ok"), &json!("ok")),
            "{record}"
        );
        assert!(result["first_byte_ms"].is_number(), "{record}");
    }
    assert_eq!(
        written[1]["result"]["completion_tokens"], 40,
        "{}",
        written[1]
    );
    drop(envoy);
    router.shutdown().await;
    records.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancelling_mid_stream_releases_the_engine_at_the_picker() {
    let engine = sim(|c| {
        c.model = "m".into();
        c.decode_tokens_per_sec = 20.0;
    })
    .await;
    let engines = [engine];
    let (router, envoy) = gateway(&engines, json!({"type": "round_robin"}), Failure::Closed).await;
    let mut body = chat("a long answer");
    body["stream"] = true.into();
    body["max_tokens"] = 1000.into();
    let response = post(&envoy, &body).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    within("the first event", stream.next())
        .await
        .expect("an event")
        .expect("bytes");
    assert_eq!(
        in_flight(router.context(), &["E0"]),
        1,
        "held while streaming"
    );
    drop(stream);
    released(router.context(), &["E0"]).await;
    let ended = within(
        "the engine ending it",
        engines[0].visits_until(|v| v.open == 0),
    )
    .await;
    assert_eq!(
        ended.abandoned, 1,
        "the engine's request was closed: {ended:?}"
    );
    let text = metrics(&router).await;
    assert!(
        text.contains(
            r#"switchyard_requests_total{model="m",outcome="cancelled",code="client_disconnected"} 1"#
        ),
        "{text}"
    );
    counted(
        &router,
        r#"switchyard_picker_streams_total{outcome="cancelled"} 1"#,
    )
    .await;
    drop(envoy);
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_caps_hold_through_the_gateway() {
    let engine = sim(|c| {
        c.model = "m".into();
        c.decode_tokens_per_sec = 20.0;
    })
    .await;
    let engines = [engine];
    let capped = json!({"type": "round_robin", "admission": {"max_inflight_requests": 1}});
    let (router, envoy) = gateway(&engines, capped, Failure::Closed).await;
    let mut long = chat("hold the slot");
    long["stream"] = true.into();
    long["max_tokens"] = 1000.into();
    let holding = post(&envoy, &long).await;
    assert_eq!(holding.status(), 200);
    let mut stream = holding.bytes_stream();
    within("the first event", stream.next()).await;
    let refused = post(&envoy, &chat("no room")).await;
    assert_eq!(
        refused.status(),
        503,
        "the picker's refusal, answered by the gateway"
    );
    assert!(refused.headers().contains_key("x-request-id"));
    let error: Value = refused.json().await.expect("the router's error body");
    assert_eq!(error["error"]["code"], "at_capacity", "{error}");
    assert_eq!(
        engines[0].visits().answered + engines[0].visits().open,
        1,
        "the engine saw one"
    );
    drop(stream);
    released(router.context(), &["E0"]).await;
    let admitted = post(&envoy, &chat("room again")).await;
    assert_eq!(admitted.status(), 200);
    drop(envoy);
    router.shutdown().await;
}

/// A request through `envoy` while the picker is down, its status and which engines
/// answered it.
async fn while_down(
    envoy: &Envoy,
    engines: &[RunningEngine],
    headers: &[(&str, String)],
) -> (u16, Vec<String>) {
    let before = visits(engines);
    let mut request = reqwest::Client::new()
        .post(envoy.url("/v1/chat/completions"))
        .json(&chat("while the picker is down"));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.expect("Envoy answers");
    let status = response.status().as_u16();
    drop(response.bytes().await);
    (status, served(engines, &before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_picker_stopped_under_traffic_fails_closed_and_serves_again_once_restarted() {
    let engines = [
        sim(|c| c.model = "m".into()).await,
        sim(|c| {
            c.model = "m".into();
            c.decode_tokens_per_sec = 20.0;
        })
        .await,
    ];
    let policy = json!({"type": "round_robin"});
    // Outside the ephemeral range, so no other test's `bind(0)` takes the address
    // while the picker is down.
    let [port] = engine_sim::free_port_ranges([1]);
    let mut first = config(
        &engines,
        policy.clone(),
        SocketAddr::from(([127, 0, 0, 1], port)),
    );
    // Past its grace, the stream in flight is cut.
    first.shutdown_grace_ms = 100;
    let router = common::router(first).await;
    let envoy = Envoy::start(
        router.picker_addr().expect("the picker listens"),
        &addresses(&engines),
        Failure::Closed,
    )
    .await;
    let picker = router.picker_addr().expect("the picker listens");
    assert_eq!(post(&envoy, &chat("before")).await.status(), 200);
    // A stream in flight when the picker goes.
    let mut long = chat("in flight");
    long["stream"] = true.into();
    long["max_tokens"] = 1000.into();
    let response = post(&envoy, &long).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    within("the first event", stream.next()).await;
    within("the router's shutdown", router.shutdown()).await;
    let rest = within("the stream's end", async {
        let mut broken = false;
        while let Some(chunk) = stream.next().await {
            broken |= chunk.is_err();
        }
        broken
    })
    .await;
    assert!(rest, "the stream in flight is cut when its picker goes");
    envoy.picker_healthy(false).await;
    let (status, served) = while_down(&envoy, &engines, &[]).await;
    assert_eq!(
        (status, served),
        (500, vec![]),
        "fail closed: refused, no engine reached"
    );
    // The picker back on its address: once Envoy's health checks find it again,
    // requests are routed; until then they are refused, never sent anywhere.
    let router = common::router(config(&engines, policy, picker)).await;
    envoy.picker_healthy(true).await;
    within("a request served again", async {
        loop {
            let (status, served) = while_down(&envoy, &engines, &[]).await;
            if status == 200 {
                assert_eq!(served.len(), 1, "{served:?}");
                return;
            }
            assert_eq!(
                (status, served),
                (500, vec![]),
                "refused until the picker is back"
            );
        }
    })
    .await;
    drop(envoy);
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_picker_stopped_fails_open_to_the_pool_and_no_client_names_an_engine() {
    let engines = [
        sim(|c| c.model = "m".into()).await,
        sim(|c| c.model = "m".into()).await,
    ];
    // Outside the ephemeral range, so no other test's `bind(0)` takes the address
    // once the picker has closed it.
    let [port] = engine_sim::free_port_ranges([1]);
    let picker = SocketAddr::from(([127, 0, 0, 1], port));
    let router = common::router(config(&engines, json!({"type": "round_robin"}), picker)).await;
    // The pool of a failing-open gateway holds E0 only.
    let envoy = Envoy::start(picker, &addresses(&engines[..1]), Failure::Open).await;
    let other = addresses(&engines)[1].to_string();
    let before = visits(&engines);
    let response = reqwest::Client::new()
        .post(envoy.url("/v1/chat/completions"))
        .header("x-gateway-destination-endpoint", &other)
        .json(&chat("routed by the picker"))
        .send()
        .await
        .expect("Envoy answers");
    assert_eq!(response.status(), 200);
    let named = response.headers()["x-switchyard-engine"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        served(&engines, &before),
        [named],
        "the picker's choice, not the client's"
    );
    router.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(picker).await.is_err(),
        "the picker's listener is closed"
    );
    // Envoy fails open only before a request's body went to the picker: once its
    // health checks find the picker gone.
    envoy.picker_healthy(false).await;
    for _ in 0..3 {
        let header = [("x-gateway-destination-endpoint", other.clone())];
        let (status, served) = while_down(&envoy, &engines, &header).await;
        assert_eq!(
            (status, served),
            (200, vec!["E0".to_owned()]),
            "fail open: the pool serves it, whatever engine the client names\n{}",
            envoy.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_picker_is_found_down_by_its_health_checks_and_the_gateway_fails_open() {
    let engines = [sim(|c| c.model = "m".into()).await];
    // A picker whose process froze: the kernel still completes connections to its
    // listener, but nothing answers on them.
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let picker = frozen.local_addr().expect("its address");
    let envoy =
        Envoy::start_finding_the_picker_down(picker, &addresses(&engines), Failure::Open).await;
    for _ in 0..3 {
        let (status, served) = within("the pool's answer", while_down(&envoy, &engines, &[])).await;
        assert_eq!(
            (status, served),
            (200, vec!["E0".to_owned()]),
            "fail open: the pool serves it\n{}",
            envoy.log()
        );
    }
    drop(frozen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_serves_tls_with_a_certificate_it_made() {
    let engines = [sim(|c| c.model = "m".into()).await];
    let mut tls = config(&engines, json!({"type": "round_robin"}), any_port());
    tls.picker.as_mut().expect("a picker").tls = Some(router_config::PickerTls::default());
    let router = common::router(tls).await;
    let picker = router.picker_addr().expect("the picker listens");
    let envoy = Envoy::over_tls(picker, &addresses(&engines)).await;
    let response = post(&envoy, &chat("over TLS")).await;
    assert_eq!(response.status(), 200, "{}", envoy.log());
    assert_eq!(response.headers()["x-switchyard-engine"], "E0");
    // A gateway speaking plain HTTP/2 to it finds it down and is not served.
    let plain =
        Envoy::start_finding_the_picker_down(picker, &addresses(&engines), Failure::Closed).await;
    assert_eq!(post(&plain, &chat("in the clear")).await.status(), 500);
    assert_eq!(
        engines[0].visits().answered,
        1,
        "only the request over TLS reached the engine"
    );
    counted(
        &router,
        r#"switchyard_picker_streams_total{outcome="routed"} 1"#,
    )
    .await;
    drop(envoy);
    drop(plain);
    router.shutdown().await;
}

//! Every failure path end to end, over real sockets against simulated engines: what
//! the client gets (a status, or a stream that ends with an error), what each engine
//! saw (an answer it finished, or a request abandoned by the router), and the
//! router's in-flight counts back to 0. Engines are stopped at known points with the
//! hold fault and released into the failure under test; every wait is on a state,
//! and only the timeouts under test (idle, grace, cool-down) take their time.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use engine_sim::{RunningEngine, SimConfig, Visits};
use futures_util::StreamExt;
use router_config::{EngineRole, ModelConfig, RouterConfig};
use router_fleet::Breaker;
use router_http::{AppContext, RunningRouter};
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Replaces an engine's fault set.
async fn set_faults(sim: &RunningEngine, faults: Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/admin/faults", sim.url()))
        .json(&faults)
        .send()
        .await
        .expect("the engine answers");
    assert_eq!(response.status(), 200);
}

/// Waits until an engine has ended every request it received, and returns the counts.
async fn settled(sim: &RunningEngine) -> Visits {
    within(
        "the engine ending its requests",
        sim.visits_until(|v| v.open == 0),
    )
    .await
}

fn answered(n: u64) -> Visits {
    Visits {
        open: 0,
        answered: n,
        abandoned: 0,
    }
}

fn abandoned(n: u64) -> Visits {
    Visits {
        open: 0,
        answered: 0,
        abandoned: n,
    }
}

/// The router's in-flight count of every engine, summed.
fn in_flight(ctx: &AppContext, engines: &[&str]) -> u64 {
    engines
        .iter()
        .map(|id| ctx.fleet().load().in_flight(&(*id).into()))
        .sum()
}

async fn holding(
    role: engine_sim::EngineRole,
    configure: impl FnOnce(&mut SimConfig),
) -> RunningEngine {
    sim(|c| {
        c.role = role;
        if role == engine_sim::EngineRole::Prefill {
            c.bootstrap_port = Some(0);
        }
        // A decode engine waits for a held prefill as long as the test may take.
        c.bootstrap_timeout_ms = 2 * GUARD.as_millis() as u64;
        configure(c);
    })
    .await
}

/// A router over one prefill and one decode engine.
async fn pd_router(prefill: &RunningEngine, decode: &RunningEngine) -> RunningRouter {
    let model = ModelConfig::new(
        "m",
        vec![
            engine("P1", prefill, EngineRole::Prefill),
            engine("D1", decode, EngineRole::Decode),
        ],
    );
    router(config(vec![model])).await
}

fn streamed(prompt: &str, max_tokens: u64) -> Value {
    let mut body = chat("m", prompt);
    body["stream"] = true.into();
    body["max_tokens"] = max_tokens.into();
    body
}

/// Sends a request from a task of its own, so the test can abandon it.
fn send(router: &RunningRouter, body: Value) -> tokio::task::JoinHandle<reqwest::Response> {
    let url = url(router, "/v1/chat/completions");
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("the router answers")
    })
}

/// Reads a stream to its end and returns what came and the error that ended it;
/// panics when it ends cleanly.
async fn broken(response: reqwest::Response) -> (String, reqwest::Error) {
    let mut text = String::new();
    let error = broken_on(&mut response.bytes_stream(), &mut text).await;
    (text, error)
}

/// Reads the rest of a stream onto `text` and returns the error that ended it;
/// panics when it ends cleanly.
async fn broken_on(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    text: &mut String,
) -> reqwest::Error {
    loop {
        match within("the next chunk", body.next()).await {
            Some(Ok(bytes)) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Some(Err(e)) => return e,
            None => panic!("the stream ended cleanly: {text}"),
        }
    }
}

/// Asserts the router counted its one request, with `outcome` and `code`.
async fn counted_only(router: &RunningRouter, outcome: &str, code: &str) {
    let text = metrics(router).await;
    let line =
        format!(r#"switchyard_requests_total{{model="m",outcome="{outcome}",code="{code}"}} 1"#);
    assert!(text.contains(&line), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("switchyard_requests_total{"))
            .count(),
        1,
        "one request, counted once: {text}"
    );
}

/// Waits until the router's metrics have `line`.
async fn until_metric(router: &RunningRouter, line: &str) {
    within(line, async {
        while !common::has_line(&metrics(router).await, line) {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_prefill_failing_before_the_decode_answers_is_a_502_and_the_decode_leg_is_aborted() {
    let prefill = holding(engine_sim::EngineRole::Prefill, |c| {
        c.faults.hold_after_chunks = Some(0);
    })
    .await;
    let decode = holding(engine_sim::EngineRole::Decode, |_| {}).await;
    let router = pd_router(&prefill, &decode).await;
    let request = send(&router, streamed("fail the prefill", 8));
    // Both legs are at their engines: the prefill held, the decode waiting for the
    // prefill's KV.
    within("the prefill leg", prefill.visits_until(|v| v.open == 1)).await;
    within("the decode leg", decode.visits_until(|v| v.open == 1)).await;
    set_faults(&prefill, json!({"error_rate": 1.0})).await;
    let response = within("the answer", request).await.unwrap();
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prefill engine P1 failed with status 500"),
        "{body}"
    );
    assert_eq!(settled(&prefill).await, answered(1));
    assert_eq!(
        settled(&decode).await,
        abandoned(1),
        "the decode leg is cancelled, not left waiting for a prefill that failed"
    );
    assert_eq!(in_flight(router.context(), &["P1", "D1"]), 0);
    counted_only(&router, "server_error", "upstream_error").await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_decode_failing_is_a_502_and_the_prefill_leg_is_aborted() {
    let hold = |c: &mut SimConfig| c.faults.hold_after_chunks = Some(0);
    let prefill = holding(engine_sim::EngineRole::Prefill, hold).await;
    let decode = holding(engine_sim::EngineRole::Decode, hold).await;
    let router = pd_router(&prefill, &decode).await;
    let request = send(&router, streamed("fail the decode", 8));
    within("the prefill leg", prefill.visits_until(|v| v.open == 1)).await;
    within("the decode leg", decode.visits_until(|v| v.open == 1)).await;
    set_faults(&decode, json!({"error_rate": 1.0})).await;
    let response = within("the answer", request).await.unwrap();
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("decode engine D1 failed with status 500"),
        "{body}"
    );
    assert_eq!(settled(&decode).await, answered(1));
    assert_eq!(
        settled(&prefill).await,
        abandoned(1),
        "the prefill leg is cancelled"
    );
    assert_eq!(in_flight(router.context(), &["P1", "D1"]), 0);
    counted_only(&router, "server_error", "upstream_error").await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_while_the_prefill_computes_aborts_both_legs() {
    // A prefill that takes 1,000 s a token is still computing whatever the test's
    // pace; its stream's head is sent before it computes, as on a real engine.
    let prefill = holding(engine_sim::EngineRole::Prefill, |c| {
        c.prefill_tokens_per_sec = 0.001;
    })
    .await;
    let decode = holding(engine_sim::EngineRole::Decode, |_| {}).await;
    let router = pd_router(&prefill, &decode).await;
    let request = send(&router, streamed("never mind", 8));
    // The router holds the prefill's head and waits for the decode's.
    until_metric(
        &router,
        r#"switchyard_upstream_latency_seconds_count{stage="prefill"} 1"#,
    )
    .await;
    within("the decode leg", decode.visits_until(|v| v.open == 1)).await;
    assert_eq!(prefill.visits().open, 1);
    request.abort();
    assert_eq!(settled(&prefill).await, abandoned(1));
    assert_eq!(settled(&decode).await, abandoned(1));
    let load = prefill.engine().load();
    assert_eq!(
        load.running_requests + load.waiting_requests,
        0,
        "the prefill engine let go of the computation"
    );
    assert_eq!(in_flight(router.context(), &["P1", "D1"]), 0);
    counted_only(&router, "cancelled", "client_disconnected").await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_prefill_breaking_after_the_decode_stream_began_ends_the_clients_stream_with_an_error() {
    // The prefill leg sends its head and first event (the prompt is computed and
    // handed over), then holds: it is still open while the decode leg streams.
    let prefill = holding(engine_sim::EngineRole::Prefill, |c| {
        c.faults.hold_after_chunks = Some(1);
    })
    .await;
    let decode = holding(engine_sim::EngineRole::Decode, |c| {
        c.decode_tokens_per_sec = 50.0;
    })
    .await;
    let router = pd_router(&prefill, &decode).await;
    let response = post(&router, &streamed("break the prefill", 1000)).await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = within("the decode stream", body.next())
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data: "));
    set_faults(&prefill, json!({"disconnect_after_chunks": 1})).await;
    let mut text = String::from_utf8_lossy(&first).into_owned();
    let error = broken_on(&mut body, &mut text).await;
    assert!(error.is_body() || error.is_decode(), "{error:?}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert_eq!(
        settled(&prefill).await,
        answered(1),
        "the prefill engine cut it"
    );
    assert_eq!(
        settled(&decode).await,
        abandoned(1),
        "the decode stream is aborted with the prefill"
    );
    assert_eq!(in_flight(router.context(), &["P1", "D1"]), 0);
    counted_only(&router, "server_error", "prefill_failed").await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_client_closing_mid_stream_aborts_both_pd_legs_and_releases_in_flight() {
    // The prefill leg stays open (held after its first event) while decode streams,
    // so the close must reach both.
    let prefill = holding(engine_sim::EngineRole::Prefill, |c| {
        c.faults.hold_after_chunks = Some(1);
    })
    .await;
    let decode = holding(engine_sim::EngineRole::Decode, |c| {
        c.decode_tokens_per_sec = 20.0;
    })
    .await;
    let router = pd_router(&prefill, &decode).await;
    let response = post(&router, &streamed("a long answer", 1000)).await;
    let mut stream = response.bytes_stream();
    within("the decode stream", stream.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(prefill.visits().open, 1, "the prefill leg is still open");
    drop(stream);
    assert_eq!(settled(&prefill).await, abandoned(1));
    assert_eq!(settled(&decode).await, abandoned(1));
    assert_eq!(in_flight(router.context(), &["P1", "D1"]), 0);
    counted_only(&router, "cancelled", "client_disconnected").await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_stream_the_engine_stops_feeding_is_ended_by_the_idle_timeout() {
    let silent = sim(|c| c.faults.hold_after_chunks = Some(1)).await;
    let model = ModelConfig::new("m", vec![engine("A", &silent, EngineRole::Plain)]);
    let mut config = config(vec![model]);
    config.timeouts.idle_ms = 500;
    let router = router(config).await;
    let response = post(&router, &streamed("go quiet", 8)).await;
    assert_eq!(response.status(), 200);
    let (text, error) = broken(response).await;
    assert!(error.is_body() || error.is_decode(), "{error:?}");
    // One event, or none when a stalled machine let the timeout pass before it.
    assert!(text.matches("data: ").count() <= 1, "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert_eq!(
        settled(&silent).await,
        abandoned(1),
        "the silent stream is closed"
    );
    assert_eq!(in_flight(router.context(), &["A"]), 0);
    counted_only(&router, "server_error", "upstream_timeout").await;
    router.shutdown().await;
}

#[tokio::test]
async fn shutdown_past_its_grace_period_ends_the_streams_still_running() {
    let stuck = sim(|c| c.faults.hold_after_chunks = Some(1)).await;
    let model = ModelConfig::new("m", vec![engine("A", &stuck, EngineRole::Plain)]);
    let mut config = config(vec![model]);
    config.shutdown_grace_ms = 200;
    let router = router(config).await;
    let (addr, ctx) = (router.addr(), Arc::clone(router.context()));
    let response = post(&router, &streamed("outlive the grace", 8)).await;
    let mut body = response.bytes_stream();
    let first = within("the first event", body.next())
        .await
        .unwrap()
        .unwrap();
    within("the shutdown", router.shutdown()).await;
    let mut text = String::from_utf8_lossy(&first).into_owned();
    let ended = broken_on(&mut body, &mut text).await;
    assert!(ended.is_body() || ended.is_decode(), "{ended:?}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert_eq!(settled(&stuck).await, abandoned(1));
    assert_eq!(in_flight(&ctx, &["A"]), 0);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

/// A router whose engines are probed once at startup and then only when the test
/// calls `probe_all`: one failed probe makes an engine unhealthy, one passed probe
/// healthy again.
fn probed_by_hand(models: Vec<ModelConfig>) -> RouterConfig {
    let mut config = config(models);
    config.health.interval_ms = 86_400_000;
    config.health.failure_threshold = 1;
    config.health.success_threshold = 1;
    config
}

async fn ready(router: &RunningRouter) -> (u16, String) {
    let response = reqwest::get(url(router, "/ready")).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn ready_is_503_while_every_engine_is_down_and_200_once_one_is_back() {
    let down = |c: &mut SimConfig| c.faults.fail_health = true;
    let (a, b) = (sim(down).await, sim(down).await);
    let model = ModelConfig::new(
        "m",
        vec![
            engine("A", &a, EngineRole::Plain),
            engine("B", &b, EngineRole::Plain),
        ],
    );
    let router = router(probed_by_hand(vec![model])).await;
    router.context().fleet().probe_all().await;
    assert_eq!(
        ready(&router).await,
        (503, "no engine is routable\n".to_owned())
    );
    let response = post(&router, &chat("m", "anyone?")).await;
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_engine_available");
    assert_eq!(
        (a.visits(), b.visits()),
        (Visits::default(), Visits::default())
    );
    set_faults(&b, json!({})).await;
    router.context().fleet().probe_all().await;
    assert_eq!(ready(&router).await.0, 200);
    let response = post(&router, &chat("m", "anyone?")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-switchyard-engine"], "B");
    response.bytes().await.unwrap();
    assert_eq!((a.visits(), b.visits()), (Visits::default(), answered(1)));
    assert_eq!(in_flight(router.context(), &["A", "B"]), 0);
    router.shutdown().await;
}

fn breaker_line(engine: &str, open: bool) -> String {
    format!(
        r#"switchyard_engine_breaker_open{{engine="{engine}"}} {}"#,
        u8::from(open)
    )
}

/// Waits until the end of an engine's open breaker's cool-down.
async fn cooled_down(router: &RunningRouter, engine: &str) {
    let breaker = router.context().fleet().breaker(&engine.into());
    let Some(Breaker::Open { until }) = breaker else {
        panic!("{engine}'s breaker is not open: {breaker:?}");
    };
    tokio::time::sleep_until(until).await;
}

/// A router over plain engines A and B, probed by hand, whose breakers open after
/// two dispatches without an answer and stay open 300 ms.
async fn breaker_router(a: &RunningEngine, b: &RunningEngine, percent: u8) -> RunningRouter {
    let model = ModelConfig::new(
        "m",
        vec![
            engine("A", a, EngineRole::Plain),
            engine("B", b, EngineRole::Plain),
        ],
    );
    let mut config = probed_by_hand(vec![model]);
    config.health.breaker_failures = 2;
    config.health.breaker_cooldown_ms = 300;
    config.health.max_ejected_percent = percent;
    config.timeouts.first_byte_ms = 300;
    router(config).await
}

/// The status of a streamed chat and the engine that served it.
async fn served(router: &RunningRouter, prompt: &str) -> (u16, String) {
    let response = post(router, &streamed(prompt, 2)).await;
    let status = response.status().as_u16();
    let engine = response
        .headers()
        .get("x-switchyard-engine")
        .map(|e| e.to_str().unwrap().to_owned());
    response.bytes().await.unwrap();
    (status, engine.unwrap_or_default())
}

/// Every request the engine received, ended or not.
fn received(sim: &RunningEngine) -> u64 {
    let v = sim.visits();
    v.open + v.answered + v.abandoned
}

#[tokio::test]
async fn answers_of_any_status_never_open_a_breaker() {
    let failing = |c: &mut SimConfig| c.faults.error_rate = 1.0;
    let (a, b) = (sim(failing).await, sim(failing).await);
    // Every breaker may open: only what counts against one is under test.
    let router = breaker_router(&a, &b, 100).await;
    for _ in 0..10 {
        assert_eq!(served(&router, "a body the engines fail").await.0, 502);
    }
    let text = metrics(&router).await;
    for engine in ["A", "B"] {
        assert!(text.contains(&breaker_line(engine, false)), "{text}");
    }
    set_faults(&a, json!({})).await;
    set_faults(&b, json!({})).await;
    assert_eq!(served(&router, "anyone else").await.0, 200);
    assert_eq!(in_flight(router.context(), &["A", "B"]), 0);
    router.shutdown().await;
}

#[tokio::test]
async fn an_unanswering_engines_breaker_opens_and_its_next_dispatch_is_the_trial() {
    let (a, b) = (sim(|_| {}).await, sim(|_| {}).await);
    let router = breaker_router(&a, &b, 50).await;
    // A takes requests but never answers them: each is a first-byte timeout.
    set_faults(&a, json!({"hang_before_first_byte": true})).await;
    within("A's breaker opening", async {
        while !metrics(&router).await.contains(&breaker_line("A", true)) {
            let answer = served(&router, "open it").await;
            assert!(
                answer == (504, String::new()) || answer == (200, "B".to_owned()),
                "{answer:?}"
            );
        }
    })
    .await;
    assert_eq!(received(&a), 2);
    // Open: A is out of the candidates.
    for _ in 0..4 {
        assert_eq!(served(&router, "kept out").await, (200, "B".to_owned()));
    }
    assert_eq!(received(&a), 2, "no request reached A while open");
    // After the cool-down, a (passing) probe half-opens it: the next dispatch to A
    // is the trial, and without an answer it opens the breaker again.
    cooled_down(&router, "A").await;
    router.context().fleet().probe_all().await;
    assert!(metrics(&router).await.contains(&breaker_line("A", false)));
    within("A's trial", async {
        while received(&a) == 2 {
            served(&router, "trial").await;
        }
    })
    .await;
    assert!(metrics(&router).await.contains(&breaker_line("A", true)));
    assert_eq!(received(&a), 3, "one trial");
    // Answering, the next trial closes it and A serves again.
    set_faults(&a, json!({})).await;
    cooled_down(&router, "A").await;
    router.context().fleet().probe_all().await;
    within("A answering its trial", async {
        while served(&router, "back").await != (200, "A".to_owned()) {}
    })
    .await;
    assert!(metrics(&router).await.contains(&breaker_line("A", false)));
    assert_eq!(settled(&a).await.answered, 1);
    assert_eq!(in_flight(router.context(), &["A", "B"]), 0);
    router.shutdown().await;
}

#[tokio::test]
async fn breakers_never_hold_out_more_than_their_share_of_a_pool() {
    let (a, b) = (sim(|_| {}).await, sim(|_| {}).await);
    let router = breaker_router(&a, &b, 50).await;
    for sim in [&a, &b] {
        set_faults(sim, json!({"hang_before_first_byte": true})).await;
    }
    // Requests with no answer from either engine: one breaker opens, the other is
    // held closed, so the model keeps an engine to try.
    for _ in 0..8 {
        assert_eq!(served(&router, "nobody answers").await.0, 504);
    }
    let text = metrics(&router).await;
    let open = ["A", "B"]
        .iter()
        .filter(|e| text.contains(&breaker_line(e, true)))
        .count();
    assert_eq!(open, 1, "{text}");
    let held: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("switchyard_breakers_held_closed_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_default();
    assert!(held >= 1, "the other breaker was held closed: {text}");
    router.shutdown().await;
}

#[tokio::test]
async fn an_engine_starting_after_the_router_joins_once_it_answers() {
    // The port stays bound (not listening, so connections are refused) until the
    // engine binds it, so nothing else can take it meanwhile.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.set_reuseaddr(true).unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = reserved.local_addr().unwrap().port();
    let late_url = format!("http://127.0.0.1:{port}");
    let model = ModelConfig::new(
        "m",
        vec![router_config::EngineConfig {
            role: Some(EngineRole::Plain),
            ..router_config::EngineConfig::new("L", &late_url)
        }],
    );
    let router = router(probed_by_hand(vec![model])).await;
    assert_eq!(ready(&router).await.0, 503, "nothing answers yet");
    let response = post(&router, &chat("m", "too early")).await;
    assert_eq!(response.status(), 503);
    let late = sim(|c| {
        c.port = port;
        c.kv_port = Some(0);
        c.load_port = Some(0);
    })
    .await;
    drop(reserved);
    router.context().fleet().probe_all().await;
    assert_eq!(ready(&router).await.0, 200);
    let response = post(&router, &chat("m", "now")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-switchyard-engine"], "L");
    response.bytes().await.unwrap();
    // Its /server_info was read once it answered: the router follows its load feed.
    let fleet = router.context().fleet();
    within("a load report from the late engine", async {
        let mut seen = 0;
        while fleet
            .load()
            .snapshot()
            .observe(&"L".into())
            .reported
            .is_none()
        {
            seen = fleet.feed_stats().applied_after(seen).await;
        }
    })
    .await;
    assert_eq!(late.visits(), answered(1));
    assert_eq!(in_flight(router.context(), &["L"]), 0);
    router.shutdown().await;
}

#[tokio::test]
async fn bodies_past_the_memory_budget_are_refused_until_the_held_ones_are_answered() {
    let a = sim(|c| c.faults.hold_after_chunks = Some(0)).await;
    let model = ModelConfig::new("m", vec![engine("A", &a, EngineRole::Plain)]);
    let mut config = config(vec![model]);
    config.limits.body_memory_bytes = 64 << 20;
    let router = router(config).await;
    // 20 MiB, charged twice: one fits in 64 MiB, two do not.
    let large = chat("m", &"x".repeat(20 << 20));
    let held = send(&router, large.clone());
    within(
        "the first body reaching the engine",
        a.visits_until(|v| v.open == 1),
    )
    .await;
    let refused = post(&router, &large).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    let small = send(&router, chat("m", "a small body still fits"));
    within(
        "the small body reaching the engine",
        a.visits_until(|v| v.open == 2),
    )
    .await;
    set_faults(&a, json!({})).await;
    assert_eq!(held.await.unwrap().status(), 200);
    assert_eq!(small.await.unwrap().status(), 200);
    assert_eq!(
        post(&router, &large).await.status(),
        200,
        "the budget is back"
    );
    router.shutdown().await;
}

#[tokio::test]
async fn a_prefill_leg_still_running_when_the_decode_answer_is_sent_runs_to_its_end() {
    let prefill = holding(engine_sim::EngineRole::Prefill, |_| {}).await;
    let decode = holding(engine_sim::EngineRole::Decode, |_| {}).await;
    let router = pd_router(&prefill, &decode).await;
    // The prefill engine holds its answer (the KV goes to the decode engine
    // meanwhile); the decode engine answers whole.
    set_faults(&prefill, json!({"hold_whole_answers": true})).await;
    let mut body = streamed("whole answer", 2);
    body["stream"] = false.into();
    let response = post(&router, &body).await;
    let status = response.status();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(settled(&decode).await, answered(1));
    assert_eq!(prefill.visits().open, 1, "the prefill leg is not cut");
    assert_eq!(in_flight(router.context(), &["P1"]), 1, "and still counted");
    assert_eq!(
        in_flight(router.context(), &["D1"]),
        0,
        "the decode engine's answer is whole"
    );
    set_faults(&prefill, json!({})).await;
    assert_eq!(settled(&prefill).await, answered(1));
    within("the prefill's in-flight count released", async {
        while in_flight(router.context(), &["P1", "D1"]) > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    counted_only(&router, "ok", "ok").await;
    router.shutdown().await;
}

/// The `x-switchyard-*` headers of an answer.
fn routing_headers(response: &reqwest::Response) -> Vec<String> {
    let mut names: Vec<String> = response
        .headers()
        .keys()
        .map(|name| name.as_str().to_owned())
        .filter(|name| name.starts_with("x-switchyard-"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn answers_and_errors_tell_clients_what_routing_headers_allows() {
    use router_config::RoutingHeaders;
    let a = sim(|_| {}).await;
    let all = ["bucket", "engine", "prompt-tokens", "reason"];
    let without_engines = ["bucket", "prompt-tokens", "reason"];
    for (setting, shown, failed) in [
        (
            RoutingHeaders::All,
            &all[..],
            "plain engine A failed with status 500 Internal Server Error",
        ),
        (
            RoutingHeaders::WithoutEngines,
            &without_engines[..],
            "the plain engine failed with status 500 Internal Server Error",
        ),
        (
            RoutingHeaders::None,
            &[][..],
            "the plain engine failed with status 500 Internal Server Error",
        ),
    ] {
        let mut config = config(vec![ModelConfig::new(
            "m",
            vec![engine("A", &a, EngineRole::Plain)],
        )]);
        config.routing_headers = setting;
        let router = router(config).await;
        let served = post(&router, &chat("m", "hello")).await;
        assert_eq!(served.status(), 200);
        let expected: Vec<String> = shown.iter().map(|h| format!("x-switchyard-{h}")).collect();
        assert_eq!(routing_headers(&served), expected, "{setting:?}");
        assert!(served.headers().contains_key("x-request-id"));
        served.bytes().await.unwrap();

        set_faults(&a, json!({"error_rate": 1.0})).await;
        let refused = post(&router, &chat("m", "hello")).await;
        assert_eq!(refused.status(), 502);
        let body: Value = refused.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert_eq!(message, failed, "{setting:?}");
        set_faults(&a, json!({})).await;
        router.shutdown().await;
    }
}

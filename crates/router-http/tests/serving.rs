//! The serving path against in-process simulated engines over real sockets.

use crate::common;

use common::*;
use router_config::{EngineRole, ModelConfig};
use serde_json::Value;

#[tokio::test]
async fn plain_chat_is_relayed_with_routing_headers_and_counted() {
    let (a, b) = (sim(|_| {}).await, sim(|_| {}).await);
    let model = ModelConfig::new(
        "m",
        vec![
            engine("A", &a, EngineRole::Plain),
            engine("B", &b, EngineRole::Plain),
        ],
    );
    let router = router(config(vec![model])).await;
    let response = post(&router, &chat("m", "hello")).await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers["x-switchyard-bucket"], "default");
    assert_eq!(
        headers["x-switchyard-engine"], "A",
        "round-robin starts with the first engine by id"
    );
    assert!(!headers["x-request-id"].is_empty());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["usage"]["completion_tokens"], 4);
    let second = post(&router, &chat("m", "again")).await;
    assert_eq!(second.headers()["x-switchyard-engine"], "B");
    second.bytes().await.unwrap();
    let text = metrics(&router).await;
    assert!(
        text.contains(r#"switchyard_requests_total{model="m",outcome="ok",code="ok"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"switchyard_engine_in_flight{engine="A"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"switchyard_selection_seconds_count{model="m"} 2"#),
        "each selection is timed: {text}"
    );
    assert!(
        text.contains("# TYPE switchyard_load_feed_messages_total counter")
            && text.contains(r#"switchyard_load_feed_messages_total{outcome="applied"} "#),
        "a count since start is a counter (Prometheus text names it with _total): {text}"
    );
    let scrape = |accept: Option<&'static str>| {
        let mut request = reqwest::Client::new().get(url(&router, "/metrics"));
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        request.send()
    };
    let plain = scrape(None).await.unwrap();
    assert_eq!(
        plain.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8",
        "a scraper that asks for nothing gets Prometheus text"
    );
    assert!(!plain.text().await.unwrap().contains("# EOF"));
    let openmetrics = scrape(Some("application/openmetrics-text; version=1.0.0"))
        .await
        .unwrap();
    assert_eq!(
        openmetrics.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = openmetrics.text().await.unwrap();
    assert!(
        text.contains("# TYPE switchyard_load_feed_messages counter\n")
            && text.ends_with("# EOF\n"),
        "{text}"
    );
    router.shutdown().await;
}

#[tokio::test]
async fn pd_legs_share_one_room_and_the_prefill_bootstrap_address() {
    let (prefill, decode) = (prefill_sim().await, decode_sim().await);
    let model = ModelConfig::new(
        "m",
        vec![
            engine("P1", &prefill, EngineRole::Prefill),
            engine("D1", &decode, EngineRole::Decode),
        ],
    );
    let router = router(config(vec![model])).await;
    for stream in [false, true] {
        let mut body = chat("m", "pd please");
        body["stream"] = stream.into();
        let response = post(&router, &body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            (
                response.headers()["x-switchyard-prefill"].to_str().unwrap(),
                response.headers()["x-switchyard-decode"].to_str().unwrap()
            ),
            ("P1", "D1")
        );
        let text = response.text().await.unwrap();
        assert!(
            if stream {
                text.ends_with("data: [DONE]\n\n")
            } else {
                text.contains("\"completion_tokens\":4")
            },
            "{text}"
        );
    }
    let (p, d) = (
        recent_requests(&prefill).await,
        recent_requests(&decode).await,
    );
    assert_eq!(
        (p.len(), d.len()),
        (2, 2),
        "both legs of both requests arrived"
    );
    for (p, d) in p.iter().zip(&d) {
        assert_eq!(
            p["bootstrap_room"], d["bootstrap_room"],
            "both legs carry one room"
        );
        assert_eq!(d["bootstrap_host"], "127.0.0.1");
        assert_eq!(
            d["bootstrap_port"],
            prefill.ports().bootstrap.unwrap(),
            "introspected from the prefill engine"
        );
        assert_eq!(
            p["request_id"], d["request_id"],
            "one request id for both legs"
        );
    }
    assert_ne!(
        p[0]["bootstrap_room"], p[1]["bootstrap_room"],
        "a fresh room per request"
    );
    router.shutdown().await;
}

#[tokio::test]
async fn graceful_shutdown_completes_an_in_flight_stream() {
    let engine_a = sim(|c| c.decode_tokens_per_sec = 50.0).await;
    let model = ModelConfig::new("m", vec![engine("A", &engine_a, EngineRole::Plain)]);
    let router = router(config(vec![model])).await;
    let addr = router.addr();
    let mut body = chat("m", "finish me");
    body["stream"] = true.into();
    body["max_tokens"] = 10.into();
    let response = post(&router, &body).await;
    let mut stream = response.bytes_stream();
    let first = futures_util::StreamExt::next(&mut stream)
        .await
        .unwrap()
        .unwrap();
    let shutdown = tokio::spawn(router.shutdown());
    let mut text = String::from_utf8(first.to_vec()).unwrap();
    while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream ran to its end: {text}"
    );
    shutdown.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn a_client_request_id_is_kept_only_when_short_and_visible_ascii() {
    let a = sim(|_| {}).await;
    let router = router(config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]))
    .await;
    let id_of = |sent: Vec<u8>| {
        let router = &router;
        async move {
            let response = reqwest::Client::new()
                .post(url(router, "/v1/chat/completions"))
                .header("x-request-id", sent)
                .json(&chat("m", "hi"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.headers()["x-request-id"].as_bytes().to_vec()
        }
    };
    assert_eq!(id_of(b"req-42".to_vec()).await, b"req-42", "echoed");
    for hostile in [vec![b'a'; 129], b"a b".to_vec(), vec![0xFF; 60]] {
        let replaced = id_of(hostile.clone()).await;
        assert_ne!(replaced, hostile);
        assert_eq!(replaced.len(), 16, "a generated id");
        assert!(replaced.iter().all(u8::is_ascii_hexdigit));
    }
    router.shutdown().await;
}

#[tokio::test]
async fn a_long_generation_is_not_held_against_the_engine_but_a_silent_stream_is() {
    let a = sim(|c| c.faults.hang_before_first_byte = true).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.timeouts.first_byte_ms = 300;
    config.health.breaker_failures = 1;
    // A lone engine: its breaker may hold out the whole pool.
    config.health.max_ejected_percent = 100;
    let router = router(config).await;
    let breaker_open = || async {
        metrics(&router)
            .await
            .contains(r#"switchyard_engine_breaker_open{engine="A"} 1"#)
    };
    let whole = post(&router, &chat("m", "a long answer")).await;
    assert_eq!(whole.status(), 504);
    assert!(
        !breaker_open().await,
        "a whole answer's first-byte timeout is a long generation"
    );
    let mut streamed = chat("m", "a stream");
    streamed["stream"] = true.into();
    assert_eq!(post(&router, &streamed).await.status(), 504);
    assert!(
        breaker_open().await,
        "a stream whose head never comes is the engine's fault"
    );
    router.shutdown().await;
}

/// Streams from an engine that cuts each after `events` events, read raw by a client
/// to the connection's close, 20 times: each must hold the 200 head and exactly the
/// events the engine sent.
async fn cut_streams_reach_the_client_whole(events: u32) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let a = sim(|c| c.faults.disconnect_after_chunks = Some(events)).await;
    let model = ModelConfig::new("m", vec![engine("A", &a, EngineRole::Plain)]);
    let router = router(config(vec![model])).await;
    let body = r#"{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    for attempt in 0..20 {
        let mut socket = tokio::net::TcpStream::connect(router.addr()).await.unwrap();
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        let read = socket.read_to_end(&mut received);
        tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("the router ends the cut stream")
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&received);
        assert!(
            text.starts_with("HTTP/1.1 200"),
            "attempt {attempt}: {text}"
        );
        assert_eq!(
            text.matches("data: ").count(),
            events as usize,
            "attempt {attempt}: the events the engine sent: {text}"
        );
        assert!(!text.contains("[DONE]"), "the cut shows: {text}");
    }
    router.shutdown().await;
}

// The router used to drop what it had last handed the server when the error behind it
// closed the connection: most cut streams lost their last event, some their head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_an_engine_sent_before_cutting_its_stream_reaches_the_client() {
    cut_streams_reach_the_client_whole(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_right_after_its_head_still_gives_the_client_the_head() {
    cut_streams_reach_the_client_whole(0).await;
}

// Admission reserves the engine's slot in the step that checks its cap, so parallel
// picks on every worker thread cannot both take the last one. Without the reservation
// the engine held five requests at once in every run of this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admission_never_lets_more_than_its_cap_reach_the_engine() {
    const CAP: u64 = 4;
    const ROUNDS: usize = 50;
    const STREAMS: usize = 256;
    let a = sim(|c| c.decode_tokens_per_sec = 2000.0).await;
    let mut model = ModelConfig::new("m", vec![engine("A", &a, EngineRole::Plain)]);
    model.policies.plain = Some(
        serde_json::from_value::<router_policy::PolicyConfig>(serde_json::json!({
            "type": "round_robin",
            "admission": {"max_inflight_requests": CAP}
        }))
        .unwrap(),
    );
    let router = router(config(vec![model])).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(STREAMS)
        .build()
        .unwrap();
    let mut body = chat("m", "at once");
    body["stream"] = true.into();
    body["max_tokens"] = 20.into();
    for round in 0..ROUNDS {
        let streams = (0..STREAMS).map(|_| {
            let request = client
                .post(url(&router, "/v1/chat/completions"))
                .json(&body);
            tokio::spawn(async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                response.bytes().await.unwrap();
                status
            })
        });
        let statuses: Vec<u16> = futures_util::future::join_all(streams)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let served = statuses.iter().filter(|s| **s == 200).count() as u64;
        assert!(
            statuses.iter().all(|s| *s == 200 || *s == 503),
            "round {round}: {statuses:?}"
        );
        assert!(
            served >= CAP,
            "round {round}: at least the cap's worth is served"
        );
        let peak = a.engine().peak_requests();
        assert!(
            (1..=CAP).contains(&peak),
            "round {round}: the engine held {peak} requests at once"
        );
    }
    router.shutdown().await;
}

#[tokio::test]
async fn a_taken_address_is_refused_with_its_cause_said_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = router_config::RouterConfig::new(vec![ModelConfig::new(
        "m",
        vec![router_config::EngineConfig {
            role: Some(EngineRole::Plain),
            ..router_config::EngineConfig::new("A1", "http://127.0.0.1:1")
        }],
    )]);
    config.listen = taken.local_addr().unwrap();
    let error = router_http::start(config).await.unwrap_err();
    let said = error.to_string();
    assert!(
        said.starts_with(&format!("binding {}: ", taken.local_addr().unwrap())),
        "{said}"
    );
    // The binary prints an error with its chain of sources: the cause, said in the
    // message, is no source too.
    assert!(std::error::Error::source(&error).is_none(), "{said}");
}

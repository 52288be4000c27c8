//! Cancellation, and every fault doing what it says.

use crate::common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Sets the fault set through the admin port when there is one, else the main port.
async fn set_faults(engine: &engine_sim::RunningEngine, faults: Value) {
    let base = engine
        .ports()
        .admin
        .map_or_else(|| engine.url(), |a| format!("http://{a}"));
    let response = client()
        .post(format!("{base}/admin/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
}

fn streaming(prompt: &str, max_tokens: u64) -> Value {
    let mut body = chat_body(prompt);
    body["stream"] = json!(true);
    body["max_tokens"] = json!(max_tokens);
    body
}

/// Waits until the load feed reports `running` running requests.
async fn running_becomes(load: &mut zeromq::SubSocket, running: u64) {
    while next_load(load).await[0] != running {}
}

#[tokio::test]
async fn a_disconnecting_client_frees_its_slot() {
    let mut config = config();
    config.decode_tokens_per_sec = 20.0;
    let engine = engine(config).await;
    let mut load = subscribe(engine.ports().load[0], "").await;
    let response = client()
        .post(format!("{}/v1/chat/completions", engine.url()))
        .json(&streaming("a long answer please", 1000))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    within("the first chunk", body.next())
        .await
        .unwrap()
        .unwrap();
    running_becomes(&mut load, 1).await;
    drop(body);
    running_becomes(&mut load, 0).await;
    engine.shutdown().await;
}

#[tokio::test]
async fn the_error_rate_fault_answers_500() {
    let engine = engine(config()).await;
    set_faults(&engine, json!({"error_rate": 1.0})).await;
    let (status, body) = chat(&engine, &chat_body("hi")).await;
    assert_eq!(status, 500);
    assert_eq!(body["error"]["message"], "simulated engine failure");
    set_faults(&engine, json!({})).await;
    assert_eq!(
        chat(&engine, &chat_body("hi")).await.0,
        200,
        "an empty fault set turns it off"
    );
    let response = client()
        .post(format!("{}/admin/faults", engine.url()))
        .json(&json!({"error_rate": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "rates above 1 are refused");
    engine.shutdown().await;
}

#[tokio::test]
async fn the_hang_fault_never_sends_a_byte() {
    let engine = engine(config()).await;
    set_faults(&engine, json!({"hang_before_first_byte": true})).await;
    let url = format!("{}/v1/chat/completions", engine.url());
    let hung = tokio::spawn(async move { client().post(url).json(&chat_body("hi")).send().await });
    // The fault is cleared only once the engine holds the request, so the request
    // is caught by it (clearing it sooner would race the request).
    within(
        "the engine receiving the request",
        engine.visits_until(|v| v.open == 1),
    )
    .await;
    set_faults(&engine, json!({})).await;
    assert_eq!(
        chat(&engine, &chat_body("after")).await.0,
        200,
        "later requests are served"
    );
    assert!(
        !hung.is_finished(),
        "the request caught by the fault is still waiting for its first byte"
    );
    hung.abort();
    engine.shutdown().await;
}

#[tokio::test]
async fn the_disconnect_fault_cuts_a_stream_after_n_chunks() {
    let engine = engine(config()).await;
    set_faults(&engine, json!({"disconnect_after_chunks": 2})).await;
    let response = client()
        .post(format!("{}/v1/chat/completions", engine.url()))
        .json(&streaming("cut me", 10))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut received = Vec::new();
    let error = loop {
        match within("the next chunk", body.next()).await {
            Some(Ok(bytes)) => received.extend_from_slice(&bytes),
            Some(Err(e)) => break e,
            None => panic!("the stream ended cleanly instead of being cut"),
        }
    };
    assert!(
        error.is_body() || error.is_decode(),
        "the body ends without its terminating chunk: {error:?}"
    );
    let text = String::from_utf8(received).unwrap();
    assert_eq!(
        text.matches("data: ").count(),
        2,
        "exactly two events before the cut: {text}"
    );
    assert!(!text.contains("[DONE]"));
    engine.shutdown().await;
}

#[tokio::test]
async fn the_hold_fault_stops_an_answer_until_it_is_released() {
    let engine = engine(config()).await;
    set_faults(&engine, json!({"hold_after_chunks": 0})).await;
    let held = tokio::spawn({
        let url = format!("{}/v1/chat/completions", engine.url());
        async move { client().post(url).json(&chat_body("hold me")).send().await }
    });
    within("the held request", engine.visits_until(|v| v.open == 1)).await;
    set_faults(&engine, json!({"error_rate": 1.0})).await;
    let response = within("the released answer", held).await.unwrap().unwrap();
    assert_eq!(
        response.status(),
        500,
        "a released request meets the faults in force then"
    );
    let visits = engine.visits_until(|v| v.open == 0).await;
    assert_eq!((visits.answered, visits.abandoned), (1, 0));
    engine.shutdown().await;
}

#[tokio::test]
async fn a_held_stream_goes_on_into_a_cut_set_after_it_began() {
    let engine = engine(config()).await;
    set_faults(&engine, json!({"hold_after_chunks": 1})).await;
    let response = client()
        .post(format!("{}/v1/chat/completions", engine.url()))
        .json(&streaming("hold me mid-stream", 10))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let first = within("the first chunk", body.next())
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains(r#""role":"assistant""#));
    set_faults(&engine, json!({"disconnect_after_chunks": 1})).await;
    let mut rest = Vec::new();
    let ended = loop {
        match within("the next chunk", body.next()).await {
            Some(Ok(bytes)) => rest.extend_from_slice(&bytes),
            Some(Err(e)) => break e,
            None => panic!("the stream ended cleanly instead of being cut"),
        }
    };
    assert!(ended.is_body() || ended.is_decode(), "{ended:?}");
    assert!(rest.is_empty(), "nothing after the held chunk: {rest:?}");
    let visits = engine.visits_until(|v| v.open == 0).await;
    assert_eq!(
        (visits.answered, visits.abandoned),
        (1, 0),
        "the engine cut it"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_a_held_request_is_counted_as_abandoned() {
    let engine = engine(config()).await;
    set_faults(&engine, json!({"hold_after_chunks": 0})).await;
    let held = tokio::spawn({
        let url = format!("{}/v1/chat/completions", engine.url());
        async move { client().post(url).json(&chat_body("leave me")).send().await }
    });
    within("the held request", engine.visits_until(|v| v.open == 1)).await;
    held.abort();
    let visits = within("the engine noticing", engine.visits_until(|v| v.open == 0)).await;
    assert_eq!((visits.answered, visits.abandoned), (0, 1));
    let seen = get_json(format!("{}/admin/requests", engine.url())).await;
    assert_eq!(
        seen["visits"],
        json!({"open": 0, "answered": 0, "abandoned": 1})
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn the_slow_start_fault_delays_the_first_byte() {
    let engine = engine(config()).await;
    set_faults(&engine, json!({"slow_start_ms": 300})).await;
    let started = tokio::time::Instant::now();
    let (status, _) = chat(&engine, &chat_body("hi")).await;
    assert_eq!(status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "the answer waited at least the slow start"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn the_health_fault_fails_health_checks() {
    let engine = engine(config()).await;
    let health = || async {
        client()
            .get(format!("{}/health", engine.url()))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(health().await, 200);
    set_faults(&engine, json!({"fail_health": true})).await;
    assert_eq!(health().await, 503);
    engine.shutdown().await;
}

#[tokio::test]
async fn the_refuse_fault_closes_the_listener_until_cleared() {
    let mut config = config();
    config.admin_port = Some(0);
    let engine = engine(config).await;
    set_faults(&engine, json!({"refuse_connections": true})).await;
    let addr = engine.ports().http;
    let refused = async {
        loop {
            match tokio::net::TcpStream::connect(addr).await {
                Err(e) => break e,
                Ok(_) => tokio::task::yield_now().await,
            }
        }
    };
    let refused = within("the listener closing", refused).await;
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    set_faults(&engine, json!({})).await;
    let reopened = async {
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            tokio::task::yield_now().await;
        }
    };
    within("the listener opening again", reopened).await;
    assert_eq!(chat(&engine, &chat_body("back")).await.0, 200);
    engine.shutdown().await;
}

//! What a client connection may hold: a request head and a body each arrive within
//! their timeouts, or the connection is closed or answered 408.

use crate::common;

use std::time::Duration;

use common::{config, engine, router, sim};
use router_config::{EngineRole, ModelConfig};
use router_http::RunningRouter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn impatient_router() -> (RunningRouter, engine_sim::RunningEngine) {
    timed_router(200, 60_000).await
}

/// A router with head (and body) timeout `head_ms` and idle timeout `idle_ms`.
async fn timed_router(head_ms: u64, idle_ms: u64) -> (RunningRouter, engine_sim::RunningEngine) {
    let a = sim(|_| {}).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.timeouts.client_header_ms = head_ms;
    config.timeouts.client_body_ms = head_ms;
    config.timeouts.client_idle_ms = idle_ms;
    (router(config).await, a)
}

/// Sends `GET /health` on a kept-alive connection and returns the answer's status
/// line once the whole answer has arrived.
async fn health(socket: &mut TcpStream) -> String {
    socket
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    let mut chunk = [0_u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&received).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .expect("a sized answer")
                .parse()
                .unwrap();
            if body.len() >= length {
                return head.lines().next().unwrap_or_default().to_owned();
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(30), socket.read(&mut chunk))
            .await
            .expect("the router answers")
            .unwrap();
        assert!(n > 0, "the connection closed mid-answer: {text}");
        received.extend_from_slice(&chunk[..n]);
    }
}

/// Opens a connection, sends half a head and waits until the router closes it: one
/// head timeout after the send.
async fn one_head_timeout(router: &RunningRouter) {
    let mut half = TcpStream::connect(router.addr()).await.unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
    assert_eq!(read_to_close(&mut half).await, b"");
}

/// Everything the server sends until it closes the connection; the guard only keeps
/// a broken server from hanging the test.
async fn read_to_close(socket: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut received))
        .await
        .expect("the router closes the connection")
        .unwrap_or_default();
    received
}

#[tokio::test]
async fn a_half_sent_head_or_an_idle_connection_is_closed() {
    let (router, _a) = impatient_router().await;
    let mut half = TcpStream::connect(router.addr()).await.unwrap();
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let answered = read_to_close(&mut half).await;
    assert!(
        !answered.starts_with(b"HTTP/1.1 2"),
        "no request was served: {answered:?}"
    );
    let mut idle = TcpStream::connect(router.addr()).await.unwrap();
    assert_eq!(
        read_to_close(&mut idle).await,
        b"",
        "an idle connection is closed"
    );
    router.shutdown().await;
}

#[tokio::test]
async fn a_kept_alive_connection_may_idle_longer_than_the_head_timeout() {
    let (router, _a) = timed_router(200, 60_000).await;
    let mut kept = TcpStream::connect(router.addr()).await.unwrap();
    assert_eq!(health(&mut kept).await, "HTTP/1.1 200 OK");
    // Two head timeouts pass, one after the other, while `kept` idles.
    one_head_timeout(&router).await;
    one_head_timeout(&router).await;
    assert_eq!(
        health(&mut kept).await,
        "HTTP/1.1 200 OK",
        "the idle connection is still served"
    );
    router.shutdown().await;
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let (router, _a) = timed_router(60_000, 200).await;
    let mut kept = TcpStream::connect(router.addr()).await.unwrap();
    assert_eq!(health(&mut kept).await, "HTTP/1.1 200 OK");
    assert_eq!(read_to_close(&mut kept).await, b"", "closed once idle");
    router.shutdown().await;
}

#[tokio::test]
async fn a_head_begun_after_an_idle_spell_must_end_within_the_head_timeout() {
    let (router, _a) = timed_router(200, 60_000).await;
    let mut kept = TcpStream::connect(router.addr()).await.unwrap();
    assert_eq!(health(&mut kept).await, "HTTP/1.1 200 OK");
    kept.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
    assert_eq!(read_to_close(&mut kept).await, b"", "closed mid-head");
    router.shutdown().await;
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408() {
    let (router, _a) = impatient_router().await;
    let mut socket = TcpStream::connect(router.addr()).await.unwrap();
    socket
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":",
        )
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&read_to_close(&mut socket).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"body_timeout""#), "{answer}");
    router.shutdown().await;
}

/// Starts a stream of tens of megabytes (far more than any socket buffers) on a router
/// whose client write timeout is 300 ms, reads the answer's status line, and then
/// reads nothing until the router has given up on the client and released the
/// engine. Returns what the router had written into the socket by then: everything
/// the client can still read.
async fn unread_stream(send_buffer: usize) -> usize {
    let a = sim(|c| c.decode_tokens_per_sec = 0.0).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.timeouts.client_write_ms = 300;
    config.limits.client_send_buffer_bytes = send_buffer;
    let router = router(config).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut client = socket.connect(router.addr()).await.unwrap();
    let body = r#"{"model":"m","stream":true,"max_tokens":400000,"messages":[{"role":"user","content":"go"}]}"#;
    client
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0_u8; 12];
    client.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // The client reads nothing more; within the write timeout the router gives up.
    let engine = router_state::EngineId::from("A");
    let released = async {
        while router.context().fleet().load().in_flight(&engine) > 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), released)
        .await
        .expect("the engine's in-flight slot is released");
    let written = head.len() + read_to_close(&mut client).await.len();
    router.shutdown().await;
    a.shutdown().await;
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_stream_releases_its_engine_after_a_bounded_buffer() {
    // Linux doubles the size asked for its bookkeeping; what a client holds besides
    // is its own receive buffer (4 KiB here).
    let send_buffer = 128 << 10;
    let written = unread_stream(send_buffer).await;
    assert!(
        written <= 2 * send_buffer + (64 << 10),
        "{written} bytes were written to a client that read none"
    );
}

/// A router of at most 4 connections over one engine that holds every answer.
async fn crowded_router() -> (RunningRouter, engine_sim::RunningEngine) {
    let a = sim(|c| c.faults.hold_after_chunks = Some(0)).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.limits.max_connections = 4;
    (router(config).await, a)
}

#[tokio::test]
async fn idle_connections_give_their_slots_to_new_ones() {
    let (router, a) = crowded_router().await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut socket = TcpStream::connect(router.addr()).await.unwrap();
        assert_eq!(health(&mut socket).await, "HTTP/1.1 200 OK");
        idle.push(socket);
    }
    // Every slot is held by a kept-alive connection between requests: a new one
    // closes the oldest and is answered.
    let mut probe = TcpStream::connect(router.addr()).await.unwrap();
    assert_eq!(health(&mut probe).await, "HTTP/1.1 200 OK");
    assert!(
        read_to_close(&mut idle[0]).await.is_empty(),
        "the oldest idle connection was closed, with nothing sent"
    );
    assert_eq!(
        health(&mut idle[1]).await,
        "HTTP/1.1 200 OK",
        "the others stay"
    );
    drop(a);
    router.shutdown().await;
}

#[tokio::test]
async fn probes_are_answered_while_every_slot_serves_a_request() {
    let (router, a) = crowded_router().await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{chat}",
        chat.len()
    );
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut socket = TcpStream::connect(router.addr()).await.unwrap();
        socket.write_all(request.as_bytes()).await.unwrap();
        busy.push(socket);
    }
    tokio::time::timeout(Duration::from_secs(30), a.visits_until(|v| v.open == 4))
        .await
        .expect("four requests held at the engine");
    let mut probe = TcpStream::connect(router.addr()).await.unwrap();
    assert_eq!(health(&mut probe).await, "HTTP/1.1 200 OK");
    let mut other = TcpStream::connect(router.addr()).await.unwrap();
    other.write_all(request.as_bytes()).await.unwrap();
    let answer = String::from_utf8_lossy(&read_to_close(&mut other).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("overloaded"), "{answer}");
    drop(busy);
    router.shutdown().await;
}

#[tokio::test]
async fn a_connection_waiting_for_a_slot_takes_the_one_a_finished_request_leaves_idle() {
    let a = sim(|c| c.faults.hold_after_chunks = Some(0)).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.limits.max_connections = 1;
    let router = router(config).await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{chat}",
        chat.len()
    );
    // The one slot serves a held request; the probe slots hold silent connections.
    let mut busy = TcpStream::connect(router.addr()).await.unwrap();
    busy.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), a.visits_until(|v| v.open == 1))
        .await
        .expect("the request held at the engine");
    let mut silent = Vec::new();
    for _ in 0..router_http::PROBE_SLOTS {
        silent.push(TcpStream::connect(router.addr()).await.unwrap());
    }
    let waiting = tokio::spawn({
        let addr = router.addr();
        async move {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            health(&mut socket).await
        }
    });
    // The held request ends; its connection stays open, kept alive and idle.
    let release = reqwest::Client::new()
        .post(format!("{}/admin/faults", a.url()))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(release.status(), 200);
    let mut head = [0_u8; 12];
    busy.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let answered = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("answered long before the idle connection's own timeout (60 s)")
        .unwrap();
    assert_eq!(answered, "HTTP/1.1 200 OK");
    drop(silent);
    router.shutdown().await;
}

//! Helpers for socket-level tests of the simulated engine.

use std::time::Duration;

use bytes::Bytes;
use engine_sim::{RunningEngine, SimConfig, start};
use serde_json::{Value, json};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// Longest wait for something that should happen; only a hang reaches it.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(20);

/// A plain engine with every ZeroMQ socket on an OS-chosen port and no delays.
pub(crate) fn config() -> SimConfig {
    let mut config = SimConfig::for_tests();
    config.kv_port = Some(0);
    config.replay_port = Some(0);
    config.load_port = Some(0);
    config
}

pub(crate) async fn engine(config: SimConfig) -> RunningEngine {
    start(config).await.expect("the engine starts")
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// A chat body with one user message.
pub(crate) fn chat_body(prompt: &str) -> Value {
    json!({"model": "sim-model", "messages": [{"role": "user", "content": prompt}]})
}

/// Posts a chat request and returns the status and JSON body.
/// `GET url`, answered with JSON.
pub(crate) async fn get_json(url: String) -> Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub(crate) async fn chat(engine: &RunningEngine, body: &Value) -> (reqwest::StatusCode, Value) {
    let response = client()
        .post(format!("{}/v1/chat/completions", engine.url()))
        .json(body)
        .send()
        .await
        .expect("the engine answers");
    let status = response.status();
    (status, response.json().await.expect("a JSON body"))
}

/// `n` words, distinct per `salt`.
pub(crate) fn words(n: usize, salt: &str) -> String {
    (0..n)
        .map(|i| format!("{salt}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {HANG_GUARD:?}"))
}

pub(crate) async fn subscribe(port: u16, topic: &str) -> SubSocket {
    let mut sub = SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .expect("connects");
    sub.subscribe(topic).await.expect("subscribes");
    sub
}

/// One live message as `(topic, seq, payload)`; asserts the three-frame envelope.
pub(crate) async fn recv(sub: &mut SubSocket) -> (Bytes, u64, Bytes) {
    let message = within("a published message", sub.recv())
        .await
        .expect("receives");
    envelope(message)
}

pub(crate) fn envelope(message: ZmqMessage) -> (Bytes, u64, Bytes) {
    let frames = message.into_vec();
    assert_eq!(
        frames.len(),
        3,
        "a live message is exactly three frames: {frames:?}"
    );
    let seq: [u8; 8] = frames[1]
        .as_ref()
        .try_into()
        .expect("the sequence frame is 8 bytes");
    (
        frames[0].clone(),
        u64::from_be_bytes(seq),
        frames[2].clone(),
    )
}

/// Sends chats until the subscriber receives a KV-event batch (the PUB socket drops
/// messages until the subscription has arrived). Returns how many batches were
/// published, so the caller knows the next sequence number.
pub(crate) async fn await_kv_subscription(engine: &RunningEngine, sub: &mut SubSocket) -> u64 {
    for probe in 0..200u64 {
        let (status, _) = chat(engine, &chat_body(&words(40, &format!("probe{probe}x")))).await;
        assert_eq!(status, 200);
        if let Ok(message) = tokio::time::timeout(Duration::from_millis(50), sub.recv()).await {
            envelope(message.expect("receives"));
            return probe + 1;
        }
    }
    panic!("the KV-event subscription never became live");
}

/// Receives until a batch with sequence at least `from` arrives.
pub(crate) async fn recv_from(sub: &mut SubSocket, from: u64) -> (Bytes, u64, Bytes) {
    loop {
        let message = recv(sub).await;
        if message.1 >= from {
            return message;
        }
    }
}

/// Asks the replay socket for batches from `start` on; returns `(seq, payload)` per
/// batch and checks the end marker.
pub(crate) async fn replay(port: u16, start: u64) -> Vec<(u64, Bytes)> {
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .expect("connects");
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&start.to_be_bytes()),
    ])
    .expect("frames");
    dealer.send(request).await.expect("sends");
    let mut batches = Vec::new();
    loop {
        let frames = within("a replay reply", dealer.recv())
            .await
            .expect("receives")
            .into_vec();
        assert_eq!(frames.len(), 4, "[empty, topic, seq, payload]: {frames:?}");
        assert!(frames[0].is_empty());
        if frames[2].as_ref() == [0xFF; 8] {
            assert!(
                frames[1].is_empty() && frames[3].is_empty(),
                "the end marker has an empty topic and payload"
            );
            return batches;
        }
        let seq: [u8; 8] = frames[2].as_ref().try_into().expect("8-byte sequence");
        batches.push((u64::from_be_bytes(seq), frames[3].clone()));
    }
}

pub(crate) fn msgpack(payload: &[u8]) -> rmpv::Value {
    rmpv::decode::read_value(&mut &payload[..]).expect("valid msgpack")
}

/// The events of a KV batch `[ts, events, rank]`, and its rank.
pub(crate) fn batch_events(payload: &[u8]) -> (Vec<rmpv::Value>, i64) {
    let batch = msgpack(payload);
    let items = batch.as_array().expect("a batch is an array");
    assert_eq!(items.len(), 3, "[ts, events, attn_dp_rank]");
    assert!(items[0].is_f64(), "ts is a float");
    let rank = items[2].as_i64().expect("the rank is set");
    (items[1].as_array().expect("events").clone(), rank)
}

/// A map event's field.
pub(crate) fn field<'a>(event: &'a rmpv::Value, name: &str) -> &'a rmpv::Value {
    event
        .as_map()
        .expect("a map event")
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("field {name} in {event}"))
}

/// Waits for the next `LoadStat` from a load subscriber and returns its fields after
/// the tag.
pub(crate) async fn next_load(sub: &mut SubSocket) -> Vec<u64> {
    let (topic, _, payload) = recv(sub).await;
    assert_eq!(topic.as_ref(), b"load");
    let value = msgpack(&payload);
    let items = value.as_array().expect("an array");
    assert_eq!(items[0].as_str(), Some("LoadStat"));
    items[1..]
        .iter()
        .map(|v| v.as_u64().unwrap_or(u64::MAX))
        .collect()
}

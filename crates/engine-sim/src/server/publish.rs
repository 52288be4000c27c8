//! The engine's ZeroMQ sockets: KV events on a PUB per rank with a ROUTER for replay,
//! and the `LoadStat` gauge on a PUB per rank.
//!
//! Live messages are three frames: topic, an 8-byte big-endian sequence that starts at
//! 0 when the publisher starts and grows by one per batch, and the msgpack payload.
//! A replay request `[empty, start]` is answered with `[empty, topic, seq, payload]`
//! for every buffered batch from `start` on, then `[empty, empty, 0xFF x 8, empty]`.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior, interval};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::faults::Faults;
use crate::engine::{LoadSample, PublisherMsg, Rank};
use crate::events::{EventForm, encode_batch};
use crate::load_stat::{
    LOAD_REPUBLISH, LOAD_TICK, LoadForm, encode_basic_load_stat, encode_load_stat,
};

/// The sequence frame of a replay's end marker (-1).
pub(crate) const END_SEQ: [u8; 8] = [0xFF; 8];

/// Topic of the load feed, as SGLang advertises it.
pub(crate) const LOAD_TOPIC: &str = "load";

/// Why a socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding {what} on {host}:{port}: {source}")]
pub struct BindError {
    what: &'static str,
    host: IpAddr,
    port: u16,
    source: zeromq::ZmqError,
}

fn endpoint(host: IpAddr, port: u16) -> String {
    match host {
        IpAddr::V4(v4) => format!("tcp://{v4}:{port}"),
        IpAddr::V6(v6) => format!("tcp://[{v6}]:{port}"),
    }
}

fn bound_port(endpoint: &zeromq::Endpoint) -> u16 {
    match endpoint {
        zeromq::Endpoint::Tcp(_, port) => *port,
        _ => 0,
    }
}

/// Binds a socket of type `S` on `host:port` and returns it with its bound port.
pub(crate) async fn bind<S: Socket>(
    what: &'static str,
    host: IpAddr,
    port: u16,
) -> Result<(S, u16), BindError> {
    let mut socket = S::new();
    let bound = socket
        .bind(&endpoint(host, port))
        .await
        .map_err(|source| BindError {
            what,
            host,
            port,
            source,
        })?;
    Ok((socket, bound_port(&bound)))
}

/// Settings shared by a rank's KV publisher.
#[derive(Debug, Clone)]
pub(crate) struct KvPublisherSettings {
    pub(crate) topic: Bytes,
    pub(crate) form: EventForm,
    pub(crate) replay_capacity: usize,
}

/// Publishes one rank's KV-event batches and answers replay requests.
pub(crate) async fn run_kv_publisher(
    mut live: PubSocket,
    mut replay: Option<RouterSocket>,
    mut batches: mpsc::UnboundedReceiver<PublisherMsg>,
    rank: u32,
    settings: KvPublisherSettings,
    faults: Arc<Faults>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut seq: u64 = 0;
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    loop {
        tokio::select! {
            // Batches first: a replay request must see every batch emitted before it.
            biased;
            message = batches.recv() => match message {
                Some(PublisherMsg::Batch(events)) => {
                    let stamp = unix_seconds() - faults.event_clock_behind().as_secs_f64();
                    let payload = Bytes::from(encode_batch(stamp, &events, rank, settings.form));
                    if !faults.take_dropped_batch() {
                        send_or_log(&mut live, frames([settings.topic.clone(), seq_frame(seq), payload.clone()])).await;
                    }
                    if buffer.len() == settings.replay_capacity {
                        buffer.pop_front();
                    }
                    if settings.replay_capacity > 0 {
                        buffer.push_back((seq, payload));
                    }
                    seq += 1;
                }
                Some(PublisherMsg::Restart) => {
                    seq = 0;
                    buffer.clear();
                }
                None => return,
            },
            request = recv_replay(&mut replay) => {
                let Some(socket) = replay.as_mut() else { continue };
                match request {
                    Ok(request) => answer_replay(socket, request, &settings.topic, &buffer).await,
                    Err(e) => tracing::warn!(rank, error = %e, "replay socket failed"),
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

async fn recv_replay(replay: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match replay {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

async fn answer_replay(
    socket: &mut RouterSocket,
    request: ZmqMessage,
    topic: &Bytes,
    buffer: &VecDeque<(u64, Bytes)>,
) {
    let frames_in = request.into_vec();
    let [identity, empty, start] = frames_in.as_slice() else {
        tracing::warn!(
            frames = frames_in.len(),
            "replay request must be [empty, start sequence]"
        );
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        tracing::warn!("replay start sequence must be 8 bytes");
        return;
    };
    let start = u64::from_be_bytes(start);
    for (seq, payload) in buffer.iter().filter(|(seq, _)| *seq >= start) {
        let reply = [
            identity.clone(),
            empty.clone(),
            topic.clone(),
            seq_frame(*seq),
            payload.clone(),
        ];
        send_or_log(socket, frames(reply)).await;
    }
    let end = [
        identity.clone(),
        Bytes::new(),
        Bytes::new(),
        Bytes::from_static(&END_SEQ),
        Bytes::new(),
    ];
    send_or_log(socket, frames(end)).await;
}

/// Publishes one rank's `LoadStat` whenever it changes, and at least every
/// [`LOAD_REPUBLISH`], looking every [`LOAD_TICK`].
pub(crate) async fn run_load_publisher(
    mut socket: PubSocket,
    rank: Weak<Rank>,
    form: LoadForm,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = interval(LOAD_TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut seq: u64 = 0;
    let mut last: Option<(LoadSample, Instant)> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(rank) = rank.upgrade() else { return };
        let sample = rank.load();
        let now = Instant::now();
        if last.is_some_and(|(previous, at)| {
            previous == sample && now.duration_since(at) < LOAD_REPUBLISH
        }) {
            continue;
        }
        let payload = match form {
            LoadForm::Native => encode_load_stat(&sample, Some(rank.index())),
            LoadForm::Basic => encode_basic_load_stat(&sample, Some(rank.index())),
        };
        let message = frames([
            Bytes::from_static(LOAD_TOPIC.as_bytes()),
            seq_frame(seq),
            Bytes::from(payload),
        ]);
        send_or_log(&mut socket, message).await;
        seq += 1;
        last = Some((sample, now));
    }
}

fn seq_frame(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

fn frames<const N: usize>(parts: [Bytes; N]) -> ZmqMessage {
    ZmqMessage::try_from(Vec::from(parts)).expect("at least one frame")
}

async fn send_or_log(socket: &mut impl SocketSend, message: ZmqMessage) {
    if let Err(e) = socket.send(message).await {
        tracing::warn!(error = %e, "zmq send failed");
    }
}

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

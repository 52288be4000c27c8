//! A publisher that announces a message larger than the limit: the subscriber closes
//! the connection before reading it (nothing is allocated for it, the process
//! lives), and subscribes again.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use router_state::{
    EngineId, EngineReportedLoadTable, FeedMemory, FeedStats, LoadFeedSource, spawn_load_subscriber,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// The ZMTP 3.0 greeting of a NULL-mechanism peer that is not the server.
fn greeting() -> Vec<u8> {
    let mut greeting = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 0];
    greeting.extend_from_slice(b"NULL");
    greeting.resize(64, 0);
    greeting
}

/// The READY command of a PUB socket.
fn ready() -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&3_u32.to_be_bytes());
    body.extend_from_slice(b"PUB");
    let mut frame = vec![0x04, u8::try_from(body.len()).unwrap()];
    frame.extend_from_slice(&body);
    frame
}

/// Completes the handshake, announces one frame of `declared` bytes, and reports how
/// many bytes the subscriber sent before it closed the connection.
async fn announce(mut socket: TcpStream, declared: u64) -> usize {
    socket.write_all(&greeting()).await.unwrap();
    socket.write_all(&ready()).await.unwrap();
    let mut theirs = vec![0_u8; 64];
    socket.read_exact(&mut theirs).await.unwrap();
    let mut header = vec![0x02];
    header.extend_from_slice(&declared.to_be_bytes());
    socket.write_all(&header).await.unwrap();
    let mut rest = Vec::new();
    drop(socket.read_to_end(&mut rest).await);
    64 + rest.len()
}

/// A load-feed subscriber of `endpoint` that accepts messages of up to 1 MiB, and its
/// counters.
fn subscribe(endpoint: String) -> (router_state::FeedHandle, Arc<FeedStats>) {
    subscribe_within(endpoint, FeedMemory::default())
}

/// A load-feed subscriber of `endpoint` charging what it receives to `memory`.
fn subscribe_within(
    endpoint: String,
    memory: FeedMemory,
) -> (router_state::FeedHandle, Arc<FeedStats>) {
    let table = Arc::new(EngineReportedLoadTable::default());
    let id = EngineId::from("E1");
    table.register(&id, NonZeroU32::MIN);
    let source = LoadFeedSource {
        engine: id,
        rank: 0,
        endpoint,
        topic: "load".into(),
        max_message_bytes: 1 << 20,
        memory,
    };
    let stats = Arc::new(FeedStats::default());
    (
        spawn_load_subscriber(table, source, Arc::clone(&stats)),
        stats,
    )
}

/// The count of `label` among a load feed's counters.
fn count(stats: &FeedStats, label: &str) -> u64 {
    stats
        .counts()
        .into_iter()
        .find(|(l, _)| *l == label)
        .map_or(0, |(_, n)| n)
}

/// A publisher that announces a 16 TiB message (reserving it would abort the process)
/// on every connection: its endpoint, the bytes each closed connection received, and
/// its task.
async fn oversized_publisher() -> (
    String,
    mpsc::UnboundedReceiver<usize>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let (closed, closures) = mpsc::unbounded_channel();
    let publisher = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let closed = closed.clone();
            tokio::spawn(async move {
                let _ = closed.send(announce(socket, 1 << 44).await);
            });
        }
    });
    (endpoint, closures, publisher)
}

/// Waits until the subscriber closes its `connection`-th connection; what it sent.
async fn closed(closures: &mut mpsc::UnboundedReceiver<usize>, connection: usize) -> usize {
    tokio::time::timeout(Duration::from_secs(30), closures.recv())
        .await
        .unwrap_or_else(|_| panic!("connection {connection} is closed by the subscriber"))
        .expect("the publisher runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_announced_past_the_limit_closes_the_connection_and_the_feed_resubscribes() {
    let (endpoint, mut closures, publisher) = oversized_publisher().await;
    let (feed, stats) = subscribe(endpoint);
    for connection in 1..=2 {
        let sent = closed(&mut closures, connection).await;
        assert!(sent >= 64, "the subscriber completed its greeting first");
    }
    // The first connection's refusal was counted before the second connection began.
    assert!(count(&stats, "dropped_oversized") >= 1);
    assert_eq!(count(&stats, "applied"), 0);
    drop(feed);
    publisher.abort();
}

/// A KV feed whose replay socket answers with a batch every `gap` from 0 on and never
/// the end marker: a subscriber to it, its counters and index, and what to drop.
async fn endless_replay(
    gap: Duration,
) -> (
    router_state::FeedHandle,
    Arc<router_state::kv_events::KvFeedStats>,
    Arc<router_state::kv_events::PrefixIndex>,
    (tokio::task::JoinHandle<()>, zeromq::PubSocket),
) {
    use bytes::Bytes;
    use router_state::kv_events::{
        IndexConfig, KvFeedStats, KvSource, PrefixIndex, spawn_kv_subscriber,
    };
    use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

    let mut live = PubSocket::new();
    let live_endpoint = live.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let mut replay = RouterSocket::new();
    let replay_endpoint = replay.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let server = tokio::spawn(async move {
        let request = replay.recv().await.expect("a replay request");
        let peer = request.get(0).expect("the requester's identity").clone();
        for seq in 0_u64.. {
            let frames = vec![
                peer.clone(),
                Bytes::new(),
                Bytes::from_static(b"kv"),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from_static(b"\x93\x00\x90\xc0"),
            ];
            if replay
                .send(ZmqMessage::try_from(frames).unwrap())
                .await
                .is_err()
            {
                return;
            }
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
        }
    });
    let index = Arc::new(PrefixIndex::new(IndexConfig::default()));
    let stats = Arc::new(KvFeedStats::default());
    let source = KvSource {
        engine: EngineId::from("E1"),
        rank: 0,
        endpoint: live_endpoint,
        replay_endpoint: Some(replay_endpoint),
        topic: "kv".into(),
        max_message_bytes: 1 << 20,
        memory: FeedMemory::default(),
    };
    let feed = spawn_kv_subscriber(Arc::clone(&index), source, Arc::clone(&stats));
    (feed, stats, index, (server, live))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_never_ends_is_given_up_at_its_bound() {
    let (feed, stats, index, rest) = endless_replay(Duration::ZERO).await;
    tokio::time::timeout(Duration::from_secs(60), stats.steps_after(0))
        .await
        .expect("the bootstrap replay ends");
    assert_eq!(
        stats.dropped(),
        [("replay_too_large", 1)],
        "the replay was given up at its bound"
    );
    assert_eq!(index.size().entries, 0, "its batches held no event");
    drop(feed);
    rest.0.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_empty_frames_is_bounded_like_any_message() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let (closed, mut closures) = mpsc::unbounded_channel();
    let publisher = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.write_all(&greeting()).await.unwrap();
        socket.write_all(&ready()).await.unwrap();
        let mut theirs = vec![0_u8; 64];
        socket.read_exact(&mut theirs).await.unwrap();
        // Empty frames, each saying more follow: no payload, unbounded count.
        let flood = [0x01_u8, 0x00].repeat(4096);
        let mut sent = 0_usize;
        while socket.write_all(&flood).await.is_ok() {
            sent += flood.len();
        }
        let _ = closed.send(sent);
    });
    let (feed, _stats) = subscribe(endpoint);
    let sent = tokio::time::timeout(Duration::from_secs(60), closures.recv())
        .await
        .expect("the subscriber closes the connection")
        .expect("the publisher runs");
    // 1 MiB at 64 bytes a frame is 16,384 frames: the connection closes after about
    // that many, not after whatever the publisher could push.
    assert!(sent < 64 << 20, "closed after {sent} bytes");
    drop(feed);
    publisher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_kv_event_message_is_counted_and_the_feed_reconnects() {
    use router_state::kv_events::{
        IndexConfig, KvFeedStats, KvSource, PrefixIndex, spawn_kv_subscriber,
    };

    let (endpoint, mut closures, publisher) = oversized_publisher().await;
    let stats = Arc::new(KvFeedStats::default());
    let source = KvSource {
        engine: EngineId::from("E1"),
        rank: 0,
        endpoint,
        replay_endpoint: None,
        topic: "kv".into(),
        max_message_bytes: 1 << 20,
        memory: router_state::FeedMemory::default(),
    };
    let index = Arc::new(PrefixIndex::new(IndexConfig::default()));
    let feed = spawn_kv_subscriber(index, source, Arc::clone(&stats));
    for connection in 1..=2 {
        closed(&mut closures, connection).await;
    }
    let oversized = stats
        .dropped()
        .into_iter()
        .find(|(reason, _)| *reason == "oversized")
        .map_or(0, |(_, n)| n);
    assert!(oversized >= 1, "{:?}", stats.dropped());
    drop(feed);
    publisher.abort();
}

/// Waits (yielding) until `memory` holds `bytes`.
async fn holding(memory: &FeedMemory, bytes: usize) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while memory.in_use() != bytes {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the feeds hold {bytes} bytes, not {}", memory.in_use()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feeds_share_one_memory_budget_and_a_frame_past_it_closes_its_connection() {
    // Feeds accepting messages of 1 MiB share 1 MiB; each message's first 64 KiB is
    // not charged.
    let memory = FeedMemory::new(1 << 20);
    let uncharged = 64 << 10;
    // The first publisher announces a frame of the largest size and sends no more.
    let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let first_endpoint = format!("tcp://{}", first.local_addr().unwrap());
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let stalling = tokio::spawn(async move {
        let (mut socket, _) = first.accept().await.unwrap();
        socket.write_all(&greeting()).await.unwrap();
        socket.write_all(&ready()).await.unwrap();
        let mut theirs = vec![0_u8; 64];
        socket.read_exact(&mut theirs).await.unwrap();
        let mut header = vec![0x02];
        header.extend_from_slice(&((1_u64 << 20) - 64).to_be_bytes());
        socket.write_all(&header).await.unwrap();
        drop(released.await);
    });
    let (first_feed, first_stats) = subscribe_within(first_endpoint, memory.clone());
    holding(&memory, (1 << 20) - uncharged).await;
    // The second announces 512 KiB, within its own limit but past what is left; it
    // takes one connection only, so the feed's reconnects find nothing.
    let second = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second_endpoint = format!("tcp://{}", second.local_addr().unwrap());
    let (closed_tx, mut closures) = mpsc::unbounded_channel();
    let refused = tokio::spawn(async move {
        let (socket, _) = second.accept().await.unwrap();
        drop(second);
        let _ = closed_tx.send(announce(socket, 512 << 10).await);
    });
    let (second_feed, second_stats) = subscribe_within(second_endpoint, memory.clone());
    closed(&mut closures, 1).await;
    // The connection closes before the feed's task hears why: wait for its count.
    tokio::time::timeout(Duration::from_secs(30), async {
        while count(&second_stats, "dropped_over_budget") == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the refusal is counted");
    assert_eq!(count(&second_stats, "dropped_over_budget"), 1);
    assert_eq!(count(&second_stats, "dropped_oversized"), 0);
    assert_eq!(memory.refused(), 1);
    assert_eq!(count(&first_stats, "dropped_over_budget"), 0);
    // An engine's ordinary reports still get through the spent budget.
    let mut config = engine_sim::SimConfig::for_tests();
    config.kv_port = Some(0);
    config.load_port = Some(0);
    let engine = engine_sim::start(config).await.expect("the engine starts");
    let endpoint = format!("tcp://127.0.0.1:{}", engine.ports().load[0]);
    let (third_feed, third_stats) = subscribe_within(endpoint, memory.clone());
    tokio::time::timeout(Duration::from_secs(30), third_stats.applied_after(0))
        .await
        .expect("a report is applied");
    assert_eq!(memory.in_use(), (1 << 20) - uncharged);
    // The stalled frame is given back when its connection closes.
    release.send(()).unwrap();
    holding(&memory, 0).await;
    drop((first_feed, second_feed, third_feed));
    engine.shutdown().await;
    stalling.await.unwrap();
    refused.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_inside_a_message_closes_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let (closed_tx, mut closures) = mpsc::unbounded_channel();
    let publisher = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        drop(listener);
        socket.write_all(&greeting()).await.unwrap();
        socket.write_all(&ready()).await.unwrap();
        let mut theirs = vec![0_u8; 64];
        socket.read_exact(&mut theirs).await.unwrap();
        // One byte of a message saying more frames follow, then READY commands: each
        // would stay charged until the message ended.
        socket.write_all(&[0x01, 1, b'x']).await.unwrap();
        for _ in 0..4 {
            if socket.write_all(&ready()).await.is_err() {
                break;
            }
        }
        let mut rest = Vec::new();
        drop(socket.read_to_end(&mut rest).await);
        let _ = closed_tx.send(rest.len());
    });
    let memory = FeedMemory::new(1 << 20);
    let (feed, _stats) = subscribe_within(endpoint, memory.clone());
    closed(&mut closures, 1).await;
    holding(&memory, 0).await;
    drop(feed);
    publisher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_message_leaves_the_connections_read_buffer_with_it() {
    use zeromq::{Socket, SocketRecv, SubSocket};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let publisher = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.write_all(&greeting()).await.unwrap();
        socket.write_all(&ready()).await.unwrap();
        let mut theirs = vec![0_u8; 64];
        socket.read_exact(&mut theirs).await.unwrap();
        // One message of one 4 MiB frame, then the connection stays open.
        let mut message = vec![0x02];
        message.extend_from_slice(&(4_u64 << 20).to_be_bytes());
        message.resize(9 + (4 << 20), 7);
        socket.write_all(&message).await.unwrap();
        drop(released.await);
    });
    let mut options = zeromq::SocketOptions::default();
    options.max_message_size(16 << 20);
    let mut subscriber = SubSocket::with_options(options);
    subscriber.connect(&endpoint).await.unwrap();
    subscriber.subscribe("").await.unwrap();
    let received = tokio::time::timeout(Duration::from_secs(30), subscriber.recv())
        .await
        .expect("the message arrives")
        .expect("a message");
    let frame = received.into_vec().pop().unwrap();
    assert_eq!(frame.len(), 4 << 20);
    // Nothing else holds the frame's allocation: the connection reads into another.
    assert!(
        frame.is_unique(),
        "the read buffer still shares the frame's allocation"
    );
    release.send(()).unwrap();
    publisher.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_message_stalled_half_received_gives_its_memory_back_within_two_stall_timeouts() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let (closed_tx, mut closures) = mpsc::unbounded_channel();
    let publisher = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        drop(listener);
        // Announces 512 KiB and sends none of it, holding the connection open.
        let _ = closed_tx.send(announce(socket, 512 << 10).await);
    });
    let memory = FeedMemory::new(1 << 20);
    let (feed, stats) = subscribe_within(endpoint, memory.clone());
    holding(&memory, (512 << 10) + 64 - (64 << 10)).await;
    let held_at = tokio::time::Instant::now();
    closed(&mut closures, 1).await;
    // Checks run every 10 s from the connection's start: the stall is seen at the
    // second check that finds it (the closing itself takes a few ms of the clock).
    let waited = held_at.elapsed();
    assert!(
        (Duration::from_secs(10)..=Duration::from_secs(21)).contains(&waited),
        "closed after {waited:?} of the paused clock"
    );
    assert_eq!(count(&stats, "dropped_stalled"), 1);
    holding(&memory, 0).await;
    drop(feed);
    publisher.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_replay_that_trickles_is_given_up_at_its_deadline() {
    let started = tokio::time::Instant::now();
    // A batch every 1.9 s, each within the 2 s a batch may take.
    let (feed, stats, _index, rest) = endless_replay(Duration::from_millis(1900)).await;
    tokio::time::timeout(Duration::from_secs(600), stats.steps_after(0))
        .await
        .expect("the bootstrap replay ends");
    let took = started.elapsed();
    assert_eq!(stats.dropped(), [("replay_too_slow", 1)]);
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(32)).contains(&took),
        "given up after {took:?} of the paused clock"
    );
    drop(feed);
    rest.0.abort();
}

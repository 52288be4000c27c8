//! The catch-up replay against a simulated engine's real replay socket, with no live
//! stream at all: what a subscriber sees when every live batch is lost to ZeroMQ's
//! slow joiner.

use super::*;
use crate::kv_events::IndexConfig;
use engine_sim::{RunningEngine, SimConfig};

const PAGE: u32 = 16;

async fn engine(replay_buffer: usize) -> RunningEngine {
    let mut config = SimConfig::for_tests();
    config.page_size = PAGE;
    config.kv_port = Some(0);
    config.replay_port = Some(0);
    config.replay_buffer = replay_buffer;
    engine_sim::start(config).await.expect("the engine starts")
}

fn source(engine: &RunningEngine) -> KvSource {
    let ports = engine.ports();
    KvSource {
        engine: EngineId::from("E1"),
        rank: 0,
        endpoint: format!("tcp://127.0.0.1:{}", ports.kv[0]),
        replay_endpoint: Some(format!("tcp://127.0.0.1:{}", ports.replay[0])),
        topic: String::new(),
        max_message_bytes: crate::DEFAULT_MAX_FEED_MESSAGE_BYTES,
        memory: FeedMemory::default(),
    }
}

fn prompt(seed: u32, pages: u32) -> Vec<u32> {
    (0..pages * PAGE).map(|i| seed * 100_000 + i).collect()
}

/// Pages of `prompt` the index says engine `E1` holds.
fn held(index: &PrefixIndex, prompt: &[u32]) -> usize {
    index
        .lookup(&index.request_hashes(None, prompt))
        .blocks_of(&EngineId::from("E1"))
}

fn counter(stats: &KvFeedStats, name: &str) -> u64 {
    stats
        .counters()
        .into_iter()
        .find_map(|(n, v)| (n == name).then_some(v))
        .expect("a known counter")
}

/// Runs `steps` against a fresh stream of a fresh engine keeping `replay_buffer`
/// batches.
struct Fixture {
    engine: RunningEngine,
    index: PrefixIndex,
    stats: KvFeedStats,
    source: KvSource,
}

impl Fixture {
    async fn start(replay_buffer: usize) -> Self {
        let engine = engine(replay_buffer).await;
        let source = source(&engine);
        Self {
            engine,
            index: PrefixIndex::new(IndexConfig {
                block_size: PAGE,
                ..IndexConfig::default()
            }),
            stats: KvFeedStats::default(),
            source,
        }
    }

    fn stream(&self) -> Stream<'_> {
        Stream {
            index: &self.index,
            source: &self.source,
            stats: &self.stats,
            next: None,
            last: None,
            replayed: VecDeque::new(),
        }
    }

    /// Serves `prompt`: its batch is in the publisher's queue before any replay
    /// request that follows (the publisher takes batches first).
    async fn serve(&self, prompt: &[u32]) {
        self.engine.engine().serve(prompt.to_vec(), 1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_finds_a_restart_the_live_stream_missed() {
    let f = Fixture::start(64).await;
    let old = [prompt(1, 4), prompt(4, 1)];
    for prompt in &old {
        f.serve(prompt).await;
    }
    let mut stream = f.stream();
    stream.bootstrap().await;
    assert_eq!((held(&f.index, &old[0]), stream.next), (4, Some(2)));

    f.engine.engine().restart_publishers();
    let new = prompt(2, 2);
    f.serve(&new).await;
    stream.catch_up().await;
    assert_eq!(
        (held(&f.index, &old[0]), held(&f.index, &old[1])),
        (0, 0),
        "the old incarnation's pages are gone, though nothing comes from the number asked for on"
    );
    assert_eq!(
        held(&f.index, &new),
        2,
        "the new incarnation's history is applied"
    );
    assert_eq!(counter(&f.stats, "restarts"), 1);
    assert_eq!(stream.next, Some(1));

    let newer = prompt(3, 1);
    f.serve(&newer).await;
    stream.catch_up().await;
    assert_eq!(
        (held(&f.index, &new), held(&f.index, &newer)),
        (2, 1),
        "the same incarnation is caught up, not started over"
    );
    assert_eq!(counter(&f.stats, "restarts"), 1);
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_published_as_far_is_told_by_its_batch() {
    let f = Fixture::start(64).await;
    let old = prompt(1, 4);
    f.serve(&old).await;
    let mut stream = f.stream();
    stream.bootstrap().await;
    f.engine.engine().restart_publishers();
    let new = prompt(2, 2);
    f.serve(&new).await;
    stream.catch_up().await;
    assert_eq!(
        (held(&f.index, &old), held(&f.index, &new)),
        (0, 2),
        "batch 0 again, but another payload: a new incarnation"
    );
    assert_eq!(counter(&f.stats, "restarts"), 1);
    f.engine.shutdown().await;
}

/// The buffer no longer holds the last batch applied: it left the buffer, or a
/// restarted engine published past it; the replay cannot tell which, so the rank
/// starts over from what is buffered rather than lay new batches over old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_whose_last_batch_left_the_buffer_starts_over() {
    let f = Fixture::start(2).await;
    let first = prompt(1, 1);
    f.serve(&first).await;
    let mut stream = f.stream();
    stream.bootstrap().await;
    let missed = [prompt(2, 1), prompt(3, 1)];
    for prompt in &missed {
        f.serve(prompt).await;
    }
    stream.catch_up().await;
    assert_eq!(
        [&first, &missed[0], &missed[1]].map(|p| held(&f.index, p)),
        [0, 1, 1]
    );
    assert_eq!(
        (
            counter(&f.stats, "replay_failures"),
            counter(&f.stats, "catch_ups")
        ),
        (1, 0)
    );
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_applies_only_what_was_missed() {
    let f = Fixture::start(64).await;
    let first = prompt(1, 2);
    f.serve(&first).await;
    let mut stream = f.stream();
    stream.bootstrap().await;
    assert_eq!(f.stats.applied(), 1);

    stream.catch_up().await;
    assert_eq!(f.stats.applied(), 1, "the batch held is not applied again");
    assert_eq!(counter(&f.stats, "catch_ups"), 0, "nothing was missed");

    let second = prompt(2, 3);
    f.serve(&second).await;
    stream.catch_up().await;
    assert_eq!(f.stats.applied(), 2);
    assert_eq!((held(&f.index, &first), held(&f.index, &second)), (2, 3));
    assert_eq!(counter(&f.stats, "catch_ups"), 1);
    assert_eq!(
        (counter(&f.stats, "restarts"), counter(&f.stats, "clears")),
        (0, 0)
    );
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_past_what_the_buffer_keeps_starts_over_from_it() {
    let f = Fixture::start(2).await;
    let first = prompt(1, 1);
    f.serve(&first).await;
    let mut stream = f.stream();
    stream.bootstrap().await;
    let missed: Vec<Vec<u32>> = (2..5).map(|seed| prompt(seed, 1)).collect();
    for prompt in &missed {
        f.serve(prompt).await;
    }
    stream.catch_up().await;
    assert_eq!(
        held(&f.index, &first),
        0,
        "history with a hole is forgotten"
    );
    assert_eq!(
        missed.iter().map(|p| held(&f.index, p)).collect::<Vec<_>>(),
        [0, 1, 1],
        "what the buffer still keeps is applied"
    );
    assert_eq!(
        (
            counter(&f.stats, "replay_failures"),
            counter(&f.stats, "restarts")
        ),
        (1, 0)
    );
    f.engine.shutdown().await;
}

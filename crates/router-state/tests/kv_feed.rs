//! The KV-event subscriber against a simulated engine's real ZeroMQ feed: the index
//! must predict exactly the prefix the engine then reports as cached.

use std::sync::Arc;
use std::time::Duration;

use engine_sim::{RunningEngine, SimConfig};
use router_state::EngineId;
use router_state::kv_events::{
    IndexConfig, KvFeedStats, KvSource, PrefixIndex, spawn_kv_subscriber,
};

const PAGE: u32 = 16;
/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);

struct Fixture {
    engine: RunningEngine,
    index: Arc<PrefixIndex>,
    stats: Arc<KvFeedStats>,
    id: EngineId,
    markers: u32,
}

impl Fixture {
    async fn start(replay: bool, capacity_pages: u64) -> Self {
        let mut config = SimConfig::for_tests();
        config.page_size = PAGE;
        config.kv_port = Some(0);
        config.replay_port = replay.then_some(0);
        config.kv_capacity_tokens = capacity_pages * u64::from(PAGE);
        let engine = engine_sim::start(config).await.expect("the engine starts");
        let index = Arc::new(PrefixIndex::new(IndexConfig {
            block_size: PAGE,
            ..IndexConfig::default()
        }));
        Self {
            engine,
            index,
            stats: Arc::new(KvFeedStats::default()),
            id: EngineId::from("E1"),
            markers: 0,
        }
    }

    fn source(&self) -> KvSource {
        let ports = self.engine.ports();
        KvSource {
            engine: self.id.clone(),
            rank: 0,
            endpoint: format!("tcp://127.0.0.1:{}", ports.kv[0]),
            replay_endpoint: ports.replay.first().map(|p| format!("tcp://127.0.0.1:{p}")),
            topic: String::new(),
            max_message_bytes: router_state::DEFAULT_MAX_FEED_MESSAGE_BYTES,
            memory: router_state::FeedMemory::default(),
        }
    }

    fn subscribe(&self) -> router_state::FeedHandle {
        spawn_kv_subscriber(
            Arc::clone(&self.index),
            self.source(),
            Arc::clone(&self.stats),
        )
    }

    /// Tokens the index predicts the engine holds for `prompt`.
    fn predicted(&self, prompt: &[u32]) -> u64 {
        let chain = self.index.request_hashes(None, prompt);
        (self.index.lookup(&chain).blocks_of(&self.id) as u64) * u64::from(PAGE)
    }

    async fn serve(&self, prompt: &[u32]) -> u64 {
        self.engine
            .engine()
            .serve(prompt.to_vec(), 1)
            .await
            .cached_tokens
    }

    /// Serves a fresh one-page prompt and waits until the index holds it: every batch
    /// the engine published before it has then been applied.
    async fn settle(&mut self) {
        self.markers += 1;
        let marker = prompt(1_000 + self.markers, 1);
        self.serve(&marker).await;
        self.wait_until(|f| f.predicted(&marker) == u64::from(PAGE))
            .await;
    }

    /// Without a replay socket, batches published before the subscription reached the
    /// engine are gone for good (ZeroMQ's slow joiner): publishes fresh markers until
    /// one arrives. The retry interval only paces the attempts.
    async fn prime(&mut self) {
        for _ in 0..100 {
            self.markers += 1;
            let marker = prompt(1_000 + self.markers, 1);
            self.serve(&marker).await;
            let arrived = async {
                while self.predicted(&marker) == 0 {
                    let seen = self.stats.steps();
                    if self.predicted(&marker) > 0 {
                        break;
                    }
                    self.stats.steps_after(seen).await;
                }
            };
            if tokio::time::timeout(Duration::from_millis(200), arrived)
                .await
                .is_ok()
            {
                return;
            }
        }
        panic!("no batch ever arrived: {:?}", self.stats.counters());
    }

    async fn wait_until(&self, done: impl Fn(&Self) -> bool) {
        let wait = async {
            loop {
                let seen = self.stats.steps();
                if done(self) {
                    return;
                }
                self.stats.steps_after(seen).await;
            }
        };
        if tokio::time::timeout(GUARD, wait).await.is_err() {
            panic!(
                "the index never caught up with the engine: {} batches applied, {:?}, dropped {:?}",
                self.stats.applied(),
                self.stats.counters(),
                self.stats.dropped()
            );
        }
    }

    fn counter(&self, name: &str) -> u64 {
        self.stats
            .counters()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .expect("a known counter")
    }

    async fn set_faults(&self, faults: serde_json::Value) {
        let status = reqwest::Client::new()
            .post(format!("{}/admin/faults", self.engine.url()))
            .json(&faults)
            .send()
            .await
            .expect("the admin endpoint answers")
            .status();
        assert!(status.is_success(), "faults accepted: {status}");
    }
}

/// `pages` full pages of tokens unique to `seed`.
fn prompt(seed: u32, pages: u32) -> Vec<u32> {
    (0..pages * PAGE).map(|i| seed * 1_000 + i).collect()
}

/// A prompt that shares `shared` pages of `base` and continues with its own.
fn branch(base: &[u32], shared: u32, seed: u32, pages: u32) -> Vec<u32> {
    let mut tokens = base[..(shared * PAGE) as usize].to_vec();
    tokens.extend(prompt(seed, pages));
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_predicts_exactly_what_the_engine_then_finds_cached() {
    let mut f = Fixture::start(true, 12).await;
    let a = prompt(1, 4);
    // History published before the router subscribes arrives through replay.
    f.serve(&a).await;
    let _feed = f.subscribe();
    f.settle().await;
    assert_eq!(f.predicted(&a), 4 * u64::from(PAGE));
    assert!(f.counter("replays") >= 1, "bootstrapped by replay");

    let b = branch(&a, 2, 2, 3);
    let c = prompt(3, 4);
    f.serve(&b).await;
    f.serve(&c).await;
    // 12 pages of capacity: the 4 + 3 + 4 stored pages and the marker fit.
    f.settle().await;
    for p in [&a, &b, &c] {
        let predicted = f.predicted(p);
        assert_eq!(
            predicted,
            f.serve(p).await,
            "prediction == engine's cache hit"
        );
    }

    // More than the capacity: the engine evicts least recently used leaves.
    let d = prompt(4, 6);
    f.serve(&d).await;
    f.settle().await;
    assert!(f.predicted(&a) + f.predicted(&b) + f.predicted(&c) < 11 * u64::from(PAGE));
    for p in [&d, &c, &b, &a] {
        let predicted = f.predicted(p);
        let cached = f.serve(p).await;
        assert_eq!(predicted, cached, "removals are tracked too");
        f.settle().await;
    }
    assert_eq!(f.counter("gaps"), 0);
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_batch_is_repaired_by_replay() {
    let mut f = Fixture::start(true, 64).await;
    let _feed = f.subscribe();
    f.settle().await;
    f.set_faults(serde_json::json!({"drop_event_batches": 1}))
        .await;
    let lost = prompt(1, 3);
    f.serve(&lost).await;
    f.settle().await;
    assert_eq!(
        f.predicted(&lost),
        3 * u64::from(PAGE),
        "replay filled the gap"
    );
    assert_eq!((f.counter("gaps"), f.counter("replay_failures")), (1, 0));
    assert_eq!(f.counter("degraded_sources"), 0);
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replay_a_gap_clears_the_source_rather_than_trust_it() {
    let mut f = Fixture::start(false, 64).await;
    let _feed = f.subscribe();
    f.prime().await;
    let kept = prompt(1, 2);
    f.serve(&kept).await;
    f.settle().await;
    assert_eq!(f.predicted(&kept), 2 * u64::from(PAGE));
    f.set_faults(serde_json::json!({"drop_event_batches": 1}))
        .await;
    f.serve(&prompt(2, 2)).await;
    f.settle().await;
    assert_eq!(f.predicted(&kept), 0, "unverifiable history is forgotten");
    assert_eq!((f.counter("gaps"), f.counter("replay_failures")), (1, 1));
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_flush_and_removal_drop_the_engines_entries() {
    let mut f = Fixture::start(true, 64).await;
    let _feed = f.subscribe();
    let a = prompt(1, 4);
    f.serve(&a).await;
    f.settle().await;
    assert_eq!(f.predicted(&a), 4 * u64::from(PAGE));

    f.engine.engine().restart_publishers();
    f.settle().await;
    assert_eq!(f.predicted(&a), 0, "a new incarnation holds nothing");
    assert_eq!(f.counter("restarts"), 1);
    assert_eq!(f.serve(&a).await, 0, "and the engine agrees");
    f.settle().await;
    assert_eq!(f.predicted(&a), 4 * u64::from(PAGE));

    f.engine.engine().flush_cache();
    f.settle().await;
    assert_eq!(f.predicted(&a), 0, "AllBlocksCleared empties the source");

    f.serve(&a).await;
    f.settle().await;
    f.index.remove_engine(&f.id);
    assert_eq!(f.predicted(&a), 0);
    assert_eq!(f.index.size().entries, 0, "nothing of the engine is left");
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matches_carry_how_far_behind_the_engines_feed_was() {
    let mut f = Fixture::start(true, 64).await;
    let _feed = f.subscribe();
    let a = prompt(1, 2);
    f.serve(&a).await;
    f.settle().await;
    let age = |f: &Fixture| {
        let found = f.index.lookup(&f.index.request_hashes(None, &a));
        assert_eq!(found.engines.len(), 1, "{found:?}");
        found.engines[0].feed_age
    };
    assert!(
        age(&f) < Duration::from_secs(60),
        "a batch stamped as it is published is fresh: {:?}",
        age(&f)
    );
    f.set_faults(serde_json::json!({"event_clock_behind_ms": 120_000}))
        .await;
    f.settle().await;
    assert!(
        age(&f) >= Duration::from_secs(120),
        "stamped two minutes before it was published: {:?}",
        age(&f)
    );
    f.set_faults(serde_json::json!({})).await;
    f.settle().await;
    assert!(
        age(&f) < Duration::from_secs(60),
        "caught up: {:?}",
        age(&f)
    );
    f.engine.shutdown().await;
}

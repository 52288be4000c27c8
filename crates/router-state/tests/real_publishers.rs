//! The KV-event subscriber against the real SGLang and vLLM publishers: their own
//! `ZmqEventPublisher` code, run unmodified by `tests/python/kv_publisher.py`, publishes
//! stores, removals, clears, a lost batch, an unreplayable gap and a restart, and the
//! index must end holding what the engine holds.
//!
//! Needs the Python venv and the unpacked wheels that `cargo xtask python-env` installs
//! into the cache; the first test to need them runs it.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use router_state::EngineId;
use router_state::kv_events::{
    IndexConfig, KvFeedStats, KvSource, PrefixIndex, spawn_kv_subscriber,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::python_env;

const BLOCK: u32 = 16;
/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
enum Engine {
    Sglang,
    Vllm,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::Vllm => "vllm",
        }
    }

    /// The engine's hash for block `n`, in the encoding it publishes: SGLang's are
    /// signed, vLLM's unsigned 64-bit, with a 32-byte digest now and then.
    fn hash(self, n: u64) -> Value {
        match self {
            Self::Sglang => json!(-1_000 - i64::try_from(n).expect("small")),
            Self::Vllm if n.is_multiple_of(5) => json!({"bin": format!("{n:064x}")}),
            Self::Vllm => json!(u64::MAX - n),
        }
    }
}

struct Publisher {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Publisher {
    async fn start(engine: Engine) -> (Self, String, String) {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cache = python_env::ensure();
        let mut child = Command::new(cache.join("venv/bin/python"))
            .arg(root.join("tests/python/kv_publisher.py"))
            .arg(engine.name())
            .arg(&cache)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the publisher script starts");
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut publisher = Self {
            child,
            stdin,
            stdout,
        };
        let ready = publisher.reply().await;
        let endpoint = |key: &str| ready[key].as_str().expect("an endpoint").to_owned();
        let (live, replay) = (endpoint("pub"), endpoint("replay"));
        (publisher, live, replay)
    }

    async fn reply(&mut self) -> Value {
        let line = tokio::time::timeout(GUARD, self.stdout.next_line())
            .await
            .expect("the publisher answers")
            .expect("its stdout is readable")
            .expect("it is still running");
        serde_json::from_str(&line).expect("a JSON reply")
    }

    async fn send(&mut self, command: Value) {
        let line = format!("{command}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("the publisher reads commands");
        let reply = self.reply().await;
        assert_eq!(reply["done"], command["op"], "{reply}");
    }

    async fn stop(mut self) {
        drop(self.stdin);
        let status = tokio::time::timeout(GUARD, self.child.wait())
            .await
            .expect("the publisher exits at end of input")
            .expect("it was running");
        assert!(status.success(), "the publisher failed: {status}");
    }
}

struct Harness {
    engine: Engine,
    publisher: Publisher,
    index: Arc<PrefixIndex>,
    stats: Arc<KvFeedStats>,
    id: EngineId,
    next_block: u64,
}

impl Harness {
    /// Stores `tokens` as blocks that continue `parent`'s; returns the last block's
    /// engine hash.
    async fn store(&mut self, tokens: &[u32], parent: Option<Value>) -> Value {
        let blocks = tokens.len() as u64 / u64::from(BLOCK);
        let hashes: Vec<Value> = (0..blocks)
            .map(|i| self.engine.hash(self.next_block + i))
            .collect();
        self.next_block += blocks;
        let last = hashes.last().cloned().expect("at least one block");
        self.publisher
            .send(json!({"op": "store", "hashes": hashes, "parent": parent, "tokens": tokens, "block_size": BLOCK}))
            .await;
        last
    }

    /// Blocks of `prompt` the index says the engine holds.
    fn depth(&self, prompt: &[u32]) -> usize {
        self.depth_in(None, prompt)
    }

    /// Blocks of `prompt` the engine holds in `namespace` (a LoRA adapter's).
    fn depth_in(&self, namespace: Option<&str>, prompt: &[u32]) -> usize {
        self.index
            .lookup(&self.index.request_hashes(namespace, prompt))
            .blocks_of(&self.id)
    }

    /// Stores a fresh one-block marker and waits until the index holds it: every
    /// batch published before it has then been applied.
    async fn settle(&mut self) {
        let marker = tokens(900 + u32::try_from(self.next_block).expect("small"), 1);
        self.store(&marker, None).await;
        let wait = async {
            loop {
                let seen = self.stats.steps();
                if self.depth(&marker) == 1 {
                    return;
                }
                self.stats.steps_after(seen).await;
            }
        };
        if tokio::time::timeout(GUARD, wait).await.is_err() {
            panic!(
                "the index never caught up: {:?}, dropped {:?}",
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
}

/// `blocks` full blocks of tokens unique to `seed`.
fn tokens(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BLOCK).map(|i| seed * 1_000 + i).collect()
}

async fn the_index_follows(engine: Engine) {
    let (publisher, live, replay) = Publisher::start(engine).await;
    let index = Arc::new(PrefixIndex::new(IndexConfig {
        block_size: BLOCK,
        ..IndexConfig::default()
    }));
    let stats = Arc::new(KvFeedStats::default());
    let id = EngineId::from("E1");
    let source = KvSource {
        engine: id.clone(),
        rank: 0,
        endpoint: live,
        replay_endpoint: Some(replay),
        topic: "kv".into(),
        max_message_bytes: router_state::DEFAULT_MAX_FEED_MESSAGE_BYTES,
        memory: router_state::FeedMemory::default(),
    };
    let feed = spawn_kv_subscriber(Arc::clone(&index), source, Arc::clone(&stats));
    let mut h = Harness {
        engine,
        publisher,
        index,
        stats,
        id,
        next_block: 1,
    };

    // Stores, a branch off the second block, a removal of a leaf.
    let a = tokens(1, 4);
    h.store(&a[..32], None).await;
    let a2 = h.engine.hash(2);
    h.store(&a[32..], Some(a2.clone())).await;
    let b_own = tokens(2, 2);
    h.store(&b_own, Some(a2)).await;
    let b = [&a[..32], &b_own[..]].concat();
    h.settle().await;
    assert_eq!((h.depth(&a), h.depth(&b)), (4, 4));
    if matches!(h.engine, Engine::Vllm) {
        // An adapter's pages (vLLM names it in `lora_name`) are in its namespace
        // only; SGLang's events name no adapter.
        let lora = tokens(7, 2);
        let hashes: Vec<Value> = (0..2).map(|i| h.engine.hash(h.next_block + i)).collect();
        h.next_block += 2;
        h.publisher
            .send(json!({"op": "store", "hashes": hashes, "parent": null, "tokens": lora, "block_size": BLOCK, "lora": "sql-adapter"}))
            .await;
        h.settle().await;
        assert_eq!(
            (
                h.depth_in(Some("sql-adapter"), &lora),
                h.depth(&lora),
                h.depth_in(Some("other"), &lora)
            ),
            (2, 0, 0),
            "an adapter's pages match its requests only"
        );
    }
    // A salted request's pages are in the salt's namespace only: SGLang names the
    // salt, vLLM gives it as the first page's extra key.
    let salted = tokens(8, 2);
    let hashes: Vec<Value> = (0..2).map(|i| h.engine.hash(h.next_block + i)).collect();
    h.next_block += 2;
    h.publisher
        .send(json!({"op": "store", "hashes": hashes, "parent": null, "tokens": salted, "block_size": BLOCK, "salt": "tenant-7"}))
        .await;
    h.settle().await;
    let namespace = router_state::kv_events::cache_namespace(None, Some("tenant-7"));
    assert_eq!(
        (
            h.depth_in(namespace.as_deref(), &salted),
            h.depth(&salted),
            h.depth_in(Some("tenant-7"), &salted)
        ),
        (2, 0, 0),
        "a salted request's pages match requests with that salt only"
    );
    h.publisher
        .send(json!({"op": "remove", "hashes": [h.engine.hash(4)]}))
        .await;
    h.settle().await;
    assert_eq!(
        (h.depth(&a), h.depth(&b)),
        (3, 4),
        "only the removed leaf is gone"
    );

    // A batch lost in transit is replayed.
    h.publisher.send(json!({"op": "lose_next"})).await;
    let c = tokens(3, 2);
    h.store(&c, None).await;
    h.settle().await;
    assert_eq!(h.depth(&c), 2, "the lost batch was replayed");
    assert!(h.counter("gaps") >= 1);

    // A gap the engine cannot replay: the source is forgotten, then follows again.
    let failures = h.counter("replay_failures");
    h.publisher.send(json!({"op": "skip_seq"})).await;
    let d = tokens(4, 2);
    h.store(&d, None).await;
    h.settle().await;
    assert_eq!(h.counter("replay_failures"), failures + 1);
    assert_eq!(
        (h.depth(&a), h.depth(&b), h.depth(&c)),
        (0, 0, 0),
        "unverifiable history is dropped"
    );
    assert_eq!(h.depth(&d), 2);

    // AllBlocksCleared.
    h.publisher.send(json!({"op": "clear"})).await;
    h.settle().await;
    assert_eq!(h.depth(&d), 0);

    // A restart: nothing of the old incarnation survives, the new one is followed.
    let e = tokens(5, 2);
    h.store(&e, None).await;
    h.publisher.send(json!({"op": "restart"})).await;
    let f = tokens(6, 3);
    h.store(&f, None).await;
    h.settle().await;
    assert_eq!((h.depth(&e), h.depth(&f)), (0, 3));
    assert_eq!(
        h.index.size().entries,
        3 + 1,
        "f and the last marker, nothing else"
    );
    assert_eq!(h.stats.dropped(), vec![], "every batch decoded");

    h.index.remove_engine(&h.id);
    assert_eq!(h.index.size().entries, 0);
    drop(feed);
    h.publisher.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_follows_the_real_sglang_publisher() {
    the_index_follows(Engine::Sglang).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_follows_the_real_vllm_publisher() {
    the_index_follows(Engine::Vllm).await;
}

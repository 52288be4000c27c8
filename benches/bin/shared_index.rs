//! The two layouts of router replicas' prefix indexes, measured side by side: every
//! replica following the engines' KV events itself (`local`), or one
//! `switchyard indexer` the replicas ask (`indexer`).
//!
//! `cargo run --release -p switchyard-benches --bin shared_index [CONVERSATIONS]`
//! (default 200) starts eight simulated engines, three routers (and the indexer),
//! and runs each conversation: a first turn through one replica, then a follow-up
//! through each replica at once (before the engines' events can have arrived), then,
//! once every index applied them, a follow-up through each replica again. It prints,
//! per layout: the index memory of all processes, the latency of the settled
//! follow-ups (p50 and p99: the lookup is on their path), and the share of
//! conversations whose three follow-ups went to one engine, immediately and settled.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::path::PathBuf;
use std::sync::Arc;

use engine_sim::{RunningEngine, SimConfig};
use router_config::{PrefixIndexerConfig, RouterConfig};
use router_http::{RunningIndexer, RunningRouter};
use router_state::kv_events::KvFeedStats;
use serde_json::{Value, json};
use tokio::time::{Duration, Instant};

const REPLICAS: usize = 3;

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizer-bytes/tokenizer.json")
}

fn config(sims: &[RunningEngine], indexer: Option<PrefixIndexerConfig>) -> RouterConfig {
    let engines: Vec<Value> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": format!("E{i}"), "url": s.url(), "role": "plain"}))
        .collect();
    let text = json!({
        "listen": "127.0.0.1:0",
        "models": [{"id": "m", "tokenizer": tokenizer(), "block_size": 16, "engines": engines,
                    "policies": {"plain": {"type": "cache_aware", "min_matched_tokens": 64}}}],
    })
    .to_string();
    let mut config = RouterConfig::from_yaml(&text).expect("a configuration");
    config.prefix_indexer = indexer;
    config
}

async fn chat(
    client: &reqwest::Client,
    router: &RunningRouter,
    system: &str,
    user: &str,
) -> String {
    let response = client
        .post(format!("http://{}/v1/chat/completions", router.addr()))
        .json(&json!({"model": "m", "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": user}
        ], "max_tokens": 4}))
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200);
    let engine = response.headers()["x-switchyard-engine"]
        .to_str()
        .expect("ascii")
        .to_owned();
    response.bytes().await.expect("the body");
    engine
}

/// Waits until every feed in `stats` has applied all `sims` published.
async fn caught_up(stats: &[Arc<KvFeedStats>], sims: &[RunningEngine]) {
    let published: u64 = sims.iter().map(|s| s.engine().published_batches()).sum();
    for stats in stats {
        let mut seen = stats.steps();
        while stats.applied() < published {
            seen = stats.steps_after(seen).await;
        }
    }
}

struct Measured {
    index_bytes: usize,
    latencies: Vec<Duration>,
    immediate: usize,
    settled: usize,
}

async fn run(
    sims: &[RunningEngine],
    indexer: Option<&RunningIndexer>,
    conversations: usize,
) -> Measured {
    let asking = indexer.map(|i| PrefixIndexerConfig {
        timeout_ms: 1_000,
        ..PrefixIndexerConfig::new(format!("http://{}", i.addr()))
    });
    let mut routers = Vec::new();
    for _ in 0..REPLICAS {
        routers.push(
            router_http::start(config(sims, asking.clone()))
                .await
                .expect("a router"),
        );
    }
    let stats: Vec<Arc<KvFeedStats>> = match indexer {
        Some(indexer) => vec![Arc::clone(indexer.fleet().kv_stats())],
        None => routers
            .iter()
            .map(|r| Arc::clone(r.context().fleet().kv_stats()))
            .collect(),
    };
    let client = reqwest::Client::new();
    caught_up(&stats, sims).await;
    let mut measured = Measured {
        index_bytes: 0,
        latencies: Vec::new(),
        immediate: 0,
        settled: 0,
    };
    for c in 0..conversations {
        let system = format!(
            "Conversation {c}. {}",
            "Answer with care and precision. ".repeat(40)
        );
        chat(&client, &routers[c % REPLICAS], &system, "first").await;
        let mut now = Vec::new();
        for router in &routers {
            now.push(chat(&client, router, &system, "at once").await);
        }
        measured.immediate += usize::from(now.iter().all(|e| e == &now[0]));
        caught_up(&stats, sims).await;
        let mut later = Vec::new();
        for router in &routers {
            let started = Instant::now();
            later.push(chat(&client, router, &system, "settled").await);
            measured.latencies.push(started.elapsed());
        }
        measured.settled += usize::from(later.iter().all(|e| e == &later[0]));
        caught_up(&stats, sims).await;
    }
    measured.index_bytes = match indexer {
        Some(indexer) => indexer
            .fleet()
            .prefix_index("m")
            .map_or(0, |i| i.size().bytes),
        None => routers
            .iter()
            .filter_map(|r| r.context().fleet().prefix_index("m"))
            .map(|i| i.size().bytes)
            .sum(),
    };
    for router in routers {
        router.shutdown().await;
    }
    measured
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let conversations: usize = std::env::args()
        .nth(1)
        .map_or(200, |n| n.parse().expect("CONVERSATIONS is a number"));
    println!(
        "layout   index bytes (all processes)  settled p50  settled p99  agree at once  agree settled"
    );
    for layout in ["local", "indexer"] {
        let mut sims = Vec::new();
        for _ in 0..8 {
            let mut c = SimConfig::for_tests();
            c.model = "m".into();
            c.tokenizer = Some(tokenizer());
            c.page_size = 16;
            c.kv_port = Some(0);
            c.replay_port = Some(0);
            c.output_tokens = 4;
            sims.push(engine_sim::start(c).await.expect("an engine"));
        }
        let indexer = match layout {
            "indexer" => Some(
                router_http::start_indexer(
                    config(&sims, None),
                    "127.0.0.1:0".parse().expect("an address"),
                )
                .await
                .expect("the indexer"),
            ),
            _ => None,
        };
        let mut measured = run(&sims, indexer.as_ref(), conversations).await;
        measured.latencies.sort();
        println!(
            "{layout:<8} {:>28}  {:>11.2?}  {:>11.2?}  {:>12.1}%  {:>12.1}%",
            measured.index_bytes,
            percentile(&measured.latencies, 0.5),
            percentile(&measured.latencies, 0.99),
            100.0 * measured.immediate as f64 / conversations as f64,
            100.0 * measured.settled as f64 / conversations as f64,
        );
        if let Some(indexer) = indexer {
            indexer.shutdown().await;
        }
        for sim in sims {
            sim.shutdown().await;
        }
    }
}

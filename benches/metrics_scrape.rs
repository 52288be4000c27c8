//! `GET /metrics` of a router in front of 8, 256 and 1,024 engines, as
//! `cargo xtask bench-scale` configures it (one `cache_aware` model with the byte
//! tokenizer, one rank an engine), with the series its traffic leaves: each engine's
//! picks and regret, a fresh load report and a KV-event feed age. `render` is the
//! exposition alone; `scrape` is the request through the router's listener.
//!
//! The engines' address answers nothing, so they join unhealthy (with their declared
//! role) and no probe or feed reaches them; their load reports and feed ages are put
//! in the fleet directly, and the requests' series are counted by
//! `router_http::bench_kit`.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use router_config::RouterConfig;
use router_http::{AppContext, RunningRouter, bench_kit};
use router_state::kv_events::{BlockStored, KvBatch, KvEvent, Tier};
use router_state::test_util::basic_report;
use serde_json::json;

// The allocator the switchyard binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MODEL: &str = "sim-model";
const BLOCK: u32 = 16;

/// The fleet sizes.
const ENGINES: [usize; 3] = [8, 256, 1024];

/// A router of `engines` engines at an address nothing listens on. Reports stay
/// fresh for the bench's whole run and probes wait an hour, so the exposition does
/// not change under the measurement.
fn config(engines: usize) -> RouterConfig {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let url = format!("http://{}", closed.local_addr().expect("an address"));
    drop(closed);
    let tokenizer = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tokenizer-bytes/tokenizer.json");
    let configured: Vec<_> = (0..engines)
        .map(|i| json!({"id": format!("E{i:04}"), "url": url, "role": "plain"}))
        .collect();
    let text = json!({
        "listen": "127.0.0.1:0",
        "health": {"interval_ms": 3_600_000},
        "load": {"freshness_ms": 3_600_000},
        "models": [{
            "id": MODEL,
            "tokenizer": tokenizer,
            "block_size": BLOCK,
            "engines": configured,
            "policies": {"plain": {"type": "cache_aware"}},
        }],
    })
    .to_string();
    RouterConfig::from_yaml(&text).expect("a configuration")
}

/// One stored page of engine `i`.
fn stored(i: usize) -> KvBatch {
    KvBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: vec![i as u64 + 1],
            parent: None,
            tokens: (0..BLOCK).map(|t| t + i as u32).collect(),
            block_size: BLOCK,
            tier: Tier::Device,
            namespace: None,
            group_idx: None,
            group_kind: None,
        })],
        dp_rank: Some(0),
        dropped: Vec::new(),
    }
}

/// Puts in `ctx`'s fleet what its engines' feeds would: a load report and a feed age
/// for each; and counts ten answered requests through each.
fn fill(ctx: &AppContext) {
    let fleet = ctx.fleet();
    let index = fleet.prefix_index(MODEL).expect("the model's prefix index");
    let now = tokio::time::Instant::now();
    for (i, engine) in fleet.snapshot().engines().enumerate() {
        let n = i as u64;
        fleet
            .load()
            .ingest(
                engine.id(),
                0,
                basic_report(n % 7, n % 3, 1000 + n, 65_536),
                now,
            )
            .expect("a registered engine");
        index.apply(engine.id(), 0, &stored(i));
        index.set_feed_age(engine.id(), 0, Duration::from_micros(1500 + n));
    }
    bench_kit::count_answers(ctx, 10);
}

fn metrics_scrape(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let client = reqwest::Client::new();
    let mut group = c.benchmark_group("metrics_scrape");
    for engines in ENGINES {
        let router: RunningRouter = runtime
            .block_on(router_http::start(config(engines)))
            .expect("the router starts");
        let ctx: &Arc<AppContext> = router.context();
        assert_eq!(ctx.fleet().snapshot().len(), engines);
        fill(ctx);
        let bytes = bench_kit::exposition(ctx, false).len();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(format!("render_{engines}"), |b| {
            b.iter(|| black_box(bench_kit::exposition(black_box(ctx), false)));
        });
        let url = format!("http://{}/metrics", router.addr());
        group.bench_function(format!("scrape_{engines}"), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let body = client
                        .get(&url)
                        .send()
                        .await
                        .expect("an answer")
                        .bytes()
                        .await
                        .expect("a body");
                    black_box(body)
                })
            });
        });
        runtime.block_on(router.shutdown());
    }
    group.finish();
}

criterion_group!(benches, metrics_scrape);
criterion_main!(benches);

//! Prefix-cache hot paths: applying stored blocks from KV events, looking a long
//! prompt up over many engines, looking prompts up in a fleet-sized index, and
//! hashing a long prompt.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]
#![allow(
    clippy::print_stdout,
    clippy::disallowed_methods,
    reason = "the fleet lookup also prints percentiles of wall-clock lookup times"
)]

use std::hint::black_box;
use std::time::Instant;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use router_policy::PrefixHits;
use router_state::EngineId;
use router_state::kv_events::{BlockStored, IndexConfig, KvBatch, KvEvent, PrefixIndex, Tier};

mod fleet_index;
#[path = "bin/rss.rs"]
mod rss;

const BLOCK: u32 = 16;

fn config() -> IndexConfig {
    IndexConfig {
        block_size: BLOCK,
        ..IndexConfig::default()
    }
}

/// One batch storing `blocks` pages of `tokens`, continuing `parent`.
fn batch(first_hash: u64, blocks: usize, parent: Option<u64>, tokens: &[u32]) -> KvBatch {
    KvBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (first_hash..first_hash + blocks as u64).collect(),
            parent,
            tokens: tokens.to_vec(),
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

/// 512 conversations of 64 pages, announced 16 pages per batch as an engine
/// prefills them: 32,768 stored blocks.
fn conversations() -> Vec<KvBatch> {
    let mut batches = Vec::new();
    let mut next_hash = 1u64;
    for conversation in 0..512u32 {
        let tokens: Vec<u32> = (0..64 * BLOCK)
            .map(|i| conversation * 100_000 + i)
            .collect();
        let mut parent = None;
        for part in tokens.chunks(16 * BLOCK as usize) {
            batches.push(batch(next_hash, 16, parent, part));
            next_hash += 16;
            parent = Some(next_hash - 1);
        }
    }
    batches
}

fn apply(c: &mut Criterion) {
    let batches = conversations();
    let engine = EngineId::from("E0");
    let mut group = c.benchmark_group("prefix_index");
    group.throughput(Throughput::Elements(32_768));
    group.bench_function("apply_stored/32768_blocks", |b| {
        b.iter_batched(
            || PrefixIndex::new(config()),
            |index| {
                for batch in &batches {
                    index.apply(&engine, 0, batch);
                }
                index
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

fn lookup(c: &mut Criterion) {
    // One 2,048-page prompt; engine i holds its first 32 * (i + 1) pages.
    let tokens: Vec<u32> = (0..2048 * BLOCK).collect();
    let index = PrefixIndex::new(config());
    for i in 0..64u32 {
        let pages = 32 * (i as usize + 1);
        let engine = EngineId::from(format!("E{i:02}").as_str());
        let held = &tokens[..pages * BLOCK as usize];
        index.apply(&engine, 0, &batch(1, pages, None, held));
    }
    let chain = index.request_hashes(None, &tokens);
    let mut group = c.benchmark_group("prefix_index");
    group.bench_function("lookup/2048_blocks_64_engines", |b| {
        b.iter(|| black_box(index.lookup(black_box(&chain))));
    });
    group.finish();
}

fn hash(c: &mut Criterion) {
    let index = PrefixIndex::new(config());
    let tokens: Vec<u32> = (0..32_768u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut group = c.benchmark_group("prefix_index");
    group.throughput(Throughput::Elements(32_768));
    group.bench_function("hash/32768_tokens", |b| {
        b.iter(|| black_box(index.request_hashes(None, black_box(&tokens))));
    });
    group.finish();
}

/// Sources (engine ranks) of the fleet lookup.
const FLEET: usize = 1024;
/// Pages each of them stores (64 Mi pages in all; the default budget keeps 4 Mi).
const FLEET_PAGES: usize = 65_536;
/// Timed lookups for the percentiles.
const TIMED: usize = 20_000;

/// 1,024 sources each storing 65,536 pages (see `fleet_index`) into an index with the
/// default node budget, then lookups of 4,096-token prompts: a system prompt up to
/// 1,024 sources hold, then one source's recent conversation after it. `lookup` is
/// the index's walk; `of_chain` adds what the shared indexer and the local source
/// answer with. Prints p50, p99 and the longest of 20,000 timed lookups of each.
fn lookup_fleet(c: &mut Criterion) {
    let index = PrefixIndex::new(IndexConfig {
        block_size: fleet_index::BLOCK,
        ..IndexConfig::default()
    });
    let before = rss::rss();
    let start = Instant::now();
    // `FLEET_PAGES` may lower the pages per source for a quicker look.
    let pages = std::env::var("FLEET_PAGES")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(FLEET_PAGES);
    let conversations = fleet_index::fill(&index, &fleet_index::engines(FLEET), pages);
    let grown = rss::rss().saturating_sub(before);
    let size = index.size();
    println!(
        "fleet index: {FLEET} sources x {pages} pages stored in {:.1} s; kept {} nodes, {} entries; RSS +{:.1} MiB ({:.1} B per node, {:.1} B per entry); estimate {:.1} MiB ({:.1} B per node)",
        start.elapsed().as_secs_f64(),
        size.nodes,
        size.entries,
        grown as f64 / (1 << 20) as f64,
        grown as f64 / size.nodes.max(1) as f64,
        grown as f64 / size.entries.max(1) as f64,
        size.bytes as f64 / (1 << 20) as f64,
        size.bytes as f64 / size.nodes.max(1) as f64,
    );
    // The last eight rounds of conversations are still in the index.
    let chains: Vec<Vec<u64>> = (0..4096)
        .map(|k| {
            let tokens = fleet_index::conversation(k % FLEET, conversations - 1 - (k / FLEET) % 8);
            index.request_hashes(None, &tokens)
        })
        .collect();
    let holders = index.lookup(&chains[0]).engines.len();
    println!("fleet index: the first prompt's prefix is held by {holders} sources");
    let mut group = c.benchmark_group("prefix_index");
    let mut next = 0;
    group.bench_function("lookup/fleet_1024_sources", |b| {
        b.iter(|| {
            next = (next + 1) % chains.len();
            black_box(index.lookup(&chains[next]))
        });
    });
    group.bench_function("of_chain/fleet_1024_sources", |b| {
        b.iter(|| {
            next = (next + 1) % chains.len();
            black_box(PrefixHits::of_chain(&index, &chains[next], false))
        });
    });
    group.finish();
    percentiles("lookup", &chains, |chain| {
        black_box(index.lookup(chain));
    });
    percentiles("of_chain", &chains, |chain| {
        black_box(PrefixHits::of_chain(&index, chain, false));
    });
}

/// How many times this thread has been given a CPU (`/proc/thread-self/schedstat`):
/// a timing across which it changed includes time spent waiting for one.
fn timeslices() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(0)
}

/// Timed calls between two looks at whether the thread lost its CPU.
const BATCH: usize = 16;

/// Times `TIMED` calls of `f` over `chains` in turn and prints p50, p99 and the
/// longest; then again, leaving out the batches of [`BATCH`] calls during which the
/// thread lost its CPU (on a machine shared with other work, those time the wait
/// for the CPU; the thread looks once a batch, as a look costs a system call).
fn percentiles(name: &str, chains: &[Vec<u64>], f: impl Fn(&[u64])) {
    let report = |what: &str, mut nanos: Vec<u128>| {
        nanos.sort_unstable();
        let at = |q: f64| nanos[((nanos.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        println!(
            "fleet {name}{what}: p50 {:.1} us, p99 {:.1} us, max {:.1} us over {} lookups",
            at(0.5),
            at(0.99),
            at(1.0),
            nanos.len(),
        );
    };
    let time = |i: usize| {
        let start = Instant::now();
        f(&chains[i % chains.len()]);
        start.elapsed().as_nanos()
    };
    report("", (0..TIMED).map(time).collect());
    let mut on_cpu = Vec::with_capacity(TIMED);
    for batch in 0..TIMED / BATCH {
        let before = timeslices();
        let nanos: Vec<u128> = (batch * BATCH..(batch + 1) * BATCH).map(time).collect();
        if timeslices() == before {
            on_cpu.extend(nanos);
        }
    }
    report(" (on the CPU throughout)", on_cpu);
}

criterion_group!(benches, apply, lookup, lookup_fleet, hash);
criterion_main!(benches);

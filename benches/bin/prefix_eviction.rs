//! Lookup latency of the prefix index while eviction runs: one thread looks up
//! recently stored conversations as fast as it can, and keeps a set of hot prompts in
//! use, while another stores new conversations past the node budget, so the index
//! evicts continuously.
//!
//! `cargo run --release -p switchyard-benches --bin prefix_eviction [MAX_NODES]`
//! (default 4,194,304, the default budget) prints the lookup latency percentiles, the
//! writer's rate and the time its batches took to apply (eviction included), how many
//! pages were evicted and how many hot prompts still match in full at the end.

#![allow(
    clippy::print_stdout,
    clippy::disallowed_methods,
    reason = "a benchmark reports on stdout and measures wall-clock latency"
)]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use router_state::EngineId;
use router_state::kv_events::{BlockStored, IndexConfig, KvBatch, KvEvent, PrefixIndex, Tier};

const BLOCK: u32 = 16;
const PAGES: u64 = 64;
const PAGES_PER_BATCH: u64 = 16;
const ENGINES: u64 = 8;
const HOT: u64 = 256;

/// The tokens of conversation `c`: 64 pages no other conversation shares.
fn tokens(c: u64) -> Vec<u32> {
    (0..PAGES * u64::from(BLOCK))
        .map(|i| (c * 100_000 + i) as u32)
        .collect()
}

/// Stores conversation `c` on its engine, 16 pages per batch as a prefill announces
/// them, noting how long each batch took to apply (mostly the write lock's hold).
fn store(index: &PrefixIndex, c: u64, applies: &mut Vec<u32>) {
    let engine = EngineId::from(format!("E{}", c % ENGINES).as_str());
    let tokens = tokens(c);
    let first = c * PAGES;
    for part in 0..PAGES / PAGES_PER_BATCH {
        let from = first + part * PAGES_PER_BATCH;
        let span = (part * PAGES_PER_BATCH * u64::from(BLOCK)) as usize
            ..((part + 1) * PAGES_PER_BATCH * u64::from(BLOCK)) as usize;
        let batch = KvBatch {
            ts: 0.0,
            events: vec![KvEvent::Stored(BlockStored {
                block_hashes: (from..from + PAGES_PER_BATCH).collect(),
                parent: (part > 0).then(|| from - 1),
                tokens: tokens[span].to_vec(),
                block_size: BLOCK,
                tier: Tier::Device,
                namespace: None,
                group_idx: None,
                group_kind: None,
            })],
            dp_rank: Some(0),
            dropped: Vec::new(),
        };
        let start = Instant::now();
        index.apply(&engine, 0, &batch);
        applies.push(nanos(start));
    }
}

fn nanos(start: Instant) -> u32 {
    start.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[at]) / 1000.0
}

fn main() {
    let max_nodes: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(IndexConfig::default().max_nodes);
    let index = PrefixIndex::new(IndexConfig {
        block_size: BLOCK,
        max_nodes,
        ..IndexConfig::default()
    });
    // The hot prompts first, then the index filled to its budget.
    let budget_conversations = max_nodes as u64 / PAGES;
    let mut applies = Vec::new();
    for c in 0..budget_conversations {
        store(&index, c, &mut applies);
    }
    applies.clear();
    let hot: Vec<Vec<u64>> = (0..HOT)
        .map(|c| index.request_hashes(None, &tokens(c)))
        .collect();
    // Stores three budgets' worth of new pages while the reader runs.
    let new = 3 * budget_conversations;
    let done = AtomicBool::new(false);
    let latest = AtomicU64::new(budget_conversations - 1);
    let ((latencies, full), writer_secs) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 24);
            let mut full = 0usize;
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                // A hot prompt keeps being used; the timed lookup is of one of the
                // 64 conversations stored last, so it walks all its 64 pages.
                black_box(index.lookup(&hot[i % hot.len()]));
                let recent = latest.load(Ordering::Relaxed) - (i as u64 % 64);
                let chain = index.request_hashes(None, &tokens(recent));
                let start = Instant::now();
                let found = black_box(index.lookup(&chain));
                latencies.push(nanos(start));
                full +=
                    usize::from(found.engines.first().map(|m| m.blocks) == Some(PAGES as usize));
                i += 1;
            }
            (latencies, full)
        });
        let start = Instant::now();
        for c in budget_conversations..budget_conversations + new {
            store(&index, c, &mut applies);
            latest.store(c, Ordering::Relaxed);
        }
        let secs = start.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        (reader.join().expect("the reader runs"), secs)
    });
    let mut sorted = latencies;
    sorted.sort_unstable();
    let kept = hot
        .iter()
        .filter(|chain| {
            index.lookup(chain).engines.first().map(|m| m.blocks) == Some(PAGES as usize)
        })
        .count();
    println!(
        "budget {max_nodes} pages; {:.2} M pages stored in {writer_secs:.2} s ({:.2} M pages/s), {} evicted, {} nodes left",
        (new * PAGES) as f64 / 1e6,
        (new * PAGES) as f64 / 1e6 / writer_secs,
        index.evicted(),
        index.size().nodes,
    );
    println!(
        "lookups of the 64 conversations stored last, during eviction: {} lookups ({full} matched in full), p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, max {:.1} us",
        sorted.len(),
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        percentile(&sorted, 0.999),
        f64::from(*sorted.last().expect("at least one lookup")) / 1000.0,
    );
    applies.sort_unstable();
    println!(
        "batches applied meanwhile: {}, p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, max {:.1} us",
        applies.len(),
        percentile(&applies, 0.5),
        percentile(&applies, 0.99),
        percentile(&applies, 0.999),
        f64::from(*applies.last().expect("at least one batch")) / 1000.0,
    );
    println!("hot prompts still matched in full: {kept} of {HOT}");
}

//! Memory of the prefix index per (block, engine) entry, measured as the growth of
//! the process's resident set while the index fills.
//!
//! `cargo run --release -p switchyard-benches --bin prefix_memory [ENTRIES]`
//! (default 1,048,576) prints one line per layout:
//! - `distinct`: every engine holds its own conversations (one entry per block, the
//!   worst case);
//! - `shared`: eight engines hold the same conversations (eight entries per block).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

#[path = "rss.rs"]
mod rss;

use router_state::EngineId;
use router_state::kv_events::{BlockStored, IndexConfig, KvBatch, KvEvent, PrefixIndex, Tier};
use rss::rss;

const BLOCK: u32 = 16;
const PAGES_PER_CONVERSATION: u64 = 64;

/// Stores `conversations` conversations of 64 pages for each of `engines`, the same
/// token content for every engine when `shared`.
fn fill(index: &PrefixIndex, engines: u64, conversations: u64, shared: bool) {
    for e in 0..engines {
        let engine = EngineId::from(format!("E{e:03}").as_str());
        for c in 0..conversations {
            let content = if shared { c } else { e * conversations + c };
            let tokens: Vec<u32> = (0..PAGES_PER_CONVERSATION * u64::from(BLOCK))
                .map(|i| (content * 10_000 + i) as u32)
                .collect();
            let first = (e << 40) | (c * PAGES_PER_CONVERSATION);
            let batch = KvBatch {
                ts: 0.0,
                events: vec![KvEvent::Stored(BlockStored {
                    block_hashes: (first..first + PAGES_PER_CONVERSATION).collect(),
                    parent: None,
                    tokens,
                    block_size: BLOCK,
                    tier: Tier::Device,
                    namespace: None,
                    group_idx: None,
                    group_kind: None,
                })],
                dp_rank: Some(0),
                dropped: Vec::new(),
            };
            index.apply(&engine, 0, &batch);
        }
    }
}

fn measure(layout: &str, entries: u64, engines: u64, shared: bool) {
    let conversations = entries / engines / PAGES_PER_CONVERSATION;
    let before = rss();
    let index = PrefixIndex::new(IndexConfig {
        block_size: BLOCK,
        max_nodes: usize::MAX,
        max_entries: usize::MAX,
    });
    fill(&index, engines, conversations, shared);
    let grown = rss().saturating_sub(before);
    let size = index.size();
    println!(
        "{layout:>8}: {} entries over {} blocks and {engines} engines: {:.1} B per entry (RSS +{:.1} MiB; index estimate {:.1} B per entry)",
        size.entries,
        size.nodes,
        grown as f64 / size.entries as f64,
        grown as f64 / (1 << 20) as f64,
        size.bytes as f64 / size.entries as f64,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let entries: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(1 << 20);
    match args.next().as_deref() {
        Some("distinct") => measure("distinct", entries, 64, false),
        Some("shared") => measure("shared", entries, 8, true),
        _ => {
            // Each layout in a fresh process, so one's freed memory cannot hide the
            // other's growth.
            let me = std::env::current_exe().expect("the running binary");
            for layout in ["distinct", "shared"] {
                let status = std::process::Command::new(&me)
                    .arg(entries.to_string())
                    .arg(layout)
                    .status()
                    .expect("the measurement runs");
                assert!(status.success(), "{layout} failed: {status}");
            }
        }
    }
}

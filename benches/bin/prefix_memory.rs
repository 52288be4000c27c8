//! Memory of the prefix index, measured as the growth of the process's resident set
//! while the index fills, each layout in a fresh process.
//!
//! `cargo run --release -p switchyard-benches --bin prefix_memory [ENTRIES]`
//! (default 1,048,576) fills an index without budgets from 64 or 8 engines:
//! - `distinct`: every engine holds its own conversations (one entry per block, the
//!   worst case);
//! - `shared`: eight engines hold the same conversations (eight entries per block).
//!
//! `cargo run --release -p switchyard-benches --bin prefix_memory fleet [PAGES]`
//! feeds 1,024 ranks PAGES pages each (default 65,536, conversations of 128 pages
//! stored round by round across the fleet) into an index with the default budgets,
//! through `PrefixIndex::apply` as the KV-event feeds do:
//! - `fleet-distinct`: every rank its own conversations;
//! - `fleet-shared`: every rank the same conversations (the entry budget binds);
//! - `fleet-pairs`: ranks `r` and `1023 - r` the same conversations (every page
//!   shared by two ranks 64 or more apart);
//! - `fleet-tiered`: every rank its own conversations, each page on the device and
//!   the host.
//!
//! Each line gives the resident set's growth and its peak against the index's own
//! estimate and its stated bound (`IndexConfig::memory_bound`). Built with
//! `--features mimalloc`, the binary uses the router's allocator instead of the
//! system's.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

#[path = "rss.rs"]
mod rss;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use router_state::EngineId;
use router_state::kv_events::{BlockStored, IndexConfig, KvBatch, KvEvent, PrefixIndex, Tier};
use rss::rss;

const BLOCK: u32 = 16;
const PAGES_PER_CONVERSATION: u64 = 64;
/// Ranks of the fleet layouts.
const FLEET: u64 = 1_024;
/// Pages of a fleet layout's conversation.
const FLEET_CONVERSATION: u64 = 128;

/// The most the resident set has been, in bytes (`VmHWM` of `/proc/self/status`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("a peak resident set")
        * 1024
}

/// One batch storing `pages` pages from engine hash `first` on, with `tokens`.
fn stored(first: u64, pages: u64, tokens: Vec<u32>, tier: Tier) -> KvBatch {
    KvBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (first..first + pages).collect(),
            parent: None,
            tokens,
            block_size: BLOCK,
            tier,
            namespace: None,
            group_idx: None,
            group_kind: None,
        })],
        dp_rank: Some(0),
        dropped: Vec::new(),
    }
}

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
            let batch = stored(first, PAGES_PER_CONVERSATION, tokens, Tier::Device);
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

/// The tokens of a fleet conversation: its first two tokens name it, so no two
/// conversations share a page.
fn conversation_tokens(key: u64, c: u64) -> Vec<u32> {
    (0..FLEET_CONVERSATION * u64::from(BLOCK))
        .map(|i| match i {
            0 => key as u32,
            1 => c as u32,
            i => i as u32,
        })
        .collect()
}

/// Feeds `pages` pages to each of the fleet's ranks in `layout`.
fn fill_fleet(index: &PrefixIndex, layout: &str, pages: u64) {
    let engines: Vec<EngineId> = (0..FLEET)
        .map(|r| EngineId::from(format!("E{r:04}").as_str()))
        .collect();
    for c in 0..pages / FLEET_CONVERSATION {
        for (r, engine) in (0..FLEET).zip(&engines) {
            let key = match layout {
                "fleet-shared" => 0,
                "fleet-pairs" => r.min(FLEET - 1 - r),
                _ => r,
            };
            let tokens = conversation_tokens(key, c);
            let first = (r << 40) | (c * FLEET_CONVERSATION);
            if layout == "fleet-tiered" {
                let device = stored(first, FLEET_CONVERSATION, tokens.clone(), Tier::Device);
                index.apply(engine, 0, &device);
                index.apply(
                    engine,
                    0,
                    &stored(first, FLEET_CONVERSATION, tokens, Tier::Host),
                );
            } else {
                index.apply(
                    engine,
                    0,
                    &stored(first, FLEET_CONVERSATION, tokens, Tier::Device),
                );
            }
        }
    }
}

fn measure_fleet(layout: &str, pages: u64) {
    let config = IndexConfig {
        block_size: BLOCK,
        ..IndexConfig::default()
    };
    let before = rss();
    let index = PrefixIndex::new(config);
    fill_fleet(&index, layout, pages);
    let grown = rss().saturating_sub(before);
    let peak = peak_rss().saturating_sub(before);
    let size = index.size();
    let bound = config.memory_bound(FLEET as usize, FLEET_CONVERSATION as usize);
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    println!(
        "{layout:>14}: {FLEET} ranks x {pages} pages: {} pages, {} entries kept; RSS +{:.1} MiB (peak +{:.1}), {:.1} B a page, {:.1} B an entry; estimate {:.1} MiB; bound {:.1} MiB",
        size.nodes,
        size.entries,
        mib(grown),
        mib(peak),
        grown as f64 / size.nodes.max(1) as f64,
        grown as f64 / size.entries.max(1) as f64,
        mib(size.bytes as u64),
        mib(bound as u64),
    );
}

const FLEET_LAYOUTS: [&str; 4] = [
    "fleet-distinct",
    "fleet-shared",
    "fleet-pairs",
    "fleet-tiered",
];

/// Runs this binary once per layout, so one's freed memory cannot hide the other's
/// growth.
fn each_in_a_process(size: u64, layouts: &[&str]) {
    let me = std::env::current_exe().expect("the running binary");
    for layout in layouts {
        let status = std::process::Command::new(&me)
            .arg(layout)
            .arg(size.to_string())
            .status()
            .expect("the measurement runs");
        assert!(status.success(), "{layout} failed: {status}");
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    let number =
        |arg: Option<String>, default: u64| arg.and_then(|n| n.parse().ok()).unwrap_or(default);
    match first.as_deref() {
        Some("distinct") => measure("distinct", number(args.next(), 1 << 20), 64, false),
        Some("shared") => measure("shared", number(args.next(), 1 << 20), 8, true),
        Some(layout) if FLEET_LAYOUTS.contains(&layout) => {
            measure_fleet(layout, number(args.next(), 65_536));
        }
        Some("fleet") => each_in_a_process(number(args.next(), 65_536), &FLEET_LAYOUTS),
        _ => each_in_a_process(number(first, 1 << 20), &["distinct", "shared"]),
    }
}

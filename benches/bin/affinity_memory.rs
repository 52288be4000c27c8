//! Memory of the affinity store under a flood of random keys, measured as the growth
//! of the process's resident set.
//!
//! `cargo run --release -p switchyard-benches --bin affinity_memory [KEYS] [BOUND]`
//! (defaults 1,000,000 random 32-byte keys into a store bounded at 1,048,576 and at
//! 65,536 bindings) prints the bindings held and the bytes per binding.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

#[path = "rss.rs"]
mod rss;

use router_state::affinity::{AffinityConfig, AffinityScope, LocalAffinityStore};
use router_state::{EngineId, Role};
use rss::rss;

fn flood(keys: u64, bound: usize) {
    let before = rss();
    let store = LocalAffinityStore::new(AffinityConfig {
        max_entries: bound,
        ..AffinityConfig::default()
    });
    let scope = AffinityScope {
        model: "chat-model",
        bucket: "default",
        stage: Role::Plain,
    };
    let engines: Vec<EngineId> = (0..64)
        .map(|i| EngineId::from(format!("E{i:02}").as_str()))
        .collect();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..keys {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = format!("{state:016x}{:016x}", state.rotate_left(17));
        store
            .bind_if_absent(scope, &key, &engines[(i % 64) as usize])
            .expect("a valid key");
    }
    let grown = rss().saturating_sub(before);
    println!(
        "{keys} random keys, bound {bound}: {} bindings held, RSS +{:.1} MiB, {:.0} B per binding",
        store.len(),
        grown as f64 / (1 << 20) as f64,
        grown as f64 / store.len() as f64
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let keys = args
        .next()
        .and_then(|k| k.parse().ok())
        .unwrap_or(1_000_000);
    match args.next().and_then(|b| b.parse().ok()) {
        Some(bound) => flood(keys, bound),
        None => {
            // Each bound in a fresh process, so freed memory cannot hide growth.
            let me = std::env::current_exe().expect("the running binary");
            for bound in [1usize << 20, 1 << 16] {
                let status = std::process::Command::new(&me)
                    .arg(keys.to_string())
                    .arg(bound.to_string())
                    .status()
                    .expect("the measurement runs");
                assert!(status.success(), "bound {bound} failed: {status}");
            }
        }
    }
}

//! The node and entry budgets: what eviction keeps.

use super::*;

#[test]
fn the_node_budget_evicts_least_recently_matched_leaves() {
    let index = PrefixIndex::new(IndexConfig {
        block_size: BS,
        max_nodes: 10,
        ..IndexConfig::default()
    });
    let prefixes: Vec<Vec<u32>> = (0..6).map(|p| (p * 100..p * 100 + 8).collect()).collect();
    for (i, tokens) in prefixes.iter().enumerate() {
        let base = i as u64 * 10;
        index.apply(
            &id("a"),
            0,
            &batch(vec![stored(
                &[base, base + 1],
                None,
                tokens.clone(),
                Tier::Device,
            )]),
        );
        index.lookup(&index.request_hashes(None, &prefixes[0]));
    }
    let size = index.size();
    assert!(size.nodes <= 10, "the budget holds: {size:?}");
    assert!(index.evicted() > 0);
    assert_eq!(
        index
            .lookup(&index.request_hashes(None, &prefixes[0]))
            .blocks_of(&id("a")),
        2,
        "the prefix matched often survives"
    );
}

#[test]
fn the_entry_budget_evicts_pages_many_ranks_hold() {
    let index = PrefixIndex::new(IndexConfig {
        block_size: BS,
        max_nodes: 1 << 20,
        max_entries: 16,
    });
    // Eight ranks each hold one prefix of four pages: 32 entries on 4 pages.
    let tokens: Vec<u32> = (0..4 * BS).collect();
    for rank in 0..8 {
        index.apply(
            &id("a"),
            rank,
            &batch(vec![stored(
                &[1, 2, 3, 4],
                None,
                tokens.clone(),
                Tier::Device,
            )]),
        );
        let size = index.size();
        assert!(size.entries <= 16, "after rank {rank}: {size:?}");
    }
    let size = index.size();
    assert!(size.nodes < 4, "the deepest pages went: {size:?}");
    assert!(index.evicted() > 0);
    let found = index.lookup(&index.request_hashes(None, &tokens));
    assert!(
        (1..4).contains(&found.blocks_of(&id("a"))),
        "the first pages are still matched: {found:?}"
    );
}

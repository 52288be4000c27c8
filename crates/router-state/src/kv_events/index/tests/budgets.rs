//! The node and entry budgets: what eviction keeps.

use proptest::prelude::*;

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

/// The index's estimate against its bound after a batch of `source` holding `pages`
/// pages of prompt `prompt` from page `from`, on `tier`.
fn store_within_bound(
    index: &PrefixIndex,
    sources: usize,
    source: usize,
    (prompt, from, pages): (u32, u32, u32),
    tier: Tier,
) {
    let tokens: Vec<u32> = (0..(from + pages) * BS)
        .map(|i| prompt * 100_000 + i)
        .collect();
    let hashes: Vec<u64> = (0..u64::from(from + pages))
        .map(|b| (source as u64) << 32 | u64::from(prompt) << 16 | b)
        .collect();
    let engine = id(&format!("s{source:04}"));
    index.apply(
        &engine,
        0,
        &batch(vec![stored(&hashes, None, tokens, tier)]),
    );
    let bound = index
        .config()
        .memory_bound(sources, (from + pages) as usize);
    let size = index.size();
    assert!(size.bytes <= bound, "{size:?} past the bound {bound}");
}

#[test]
fn shared_pages_tiered_copies_and_high_ranks_stay_within_the_memory_bound() {
    let index = PrefixIndex::new(IndexConfig {
        block_size: BS,
        max_nodes: 4_096,
        max_entries: 16_384,
    });
    let sources = 1_024;
    // Every rank holds one popular prompt (past the entry budget), then prompts of
    // its own on the device and the host (the page budget), then prompts of two
    // ranks far apart, each on its own tier.
    for s in 0..sources {
        store_within_bound(&index, sources, s, (0, 0, 32), Tier::Device);
    }
    for round in 0..8 {
        for s in 0..sources {
            let tier = if s % 2 == 0 { Tier::Device } else { Tier::Host };
            store_within_bound(
                &index,
                sources,
                s,
                (1 + round * 2_000 + s as u32, 0, 8),
                tier,
            );
        }
    }
    for s in 0..sources {
        let prompt = 20_000 + (s % 512) as u32;
        let tier = if s < 512 { Tier::Device } else { Tier::Disk };
        store_within_bound(&index, sources, s, (prompt, 0, 8), tier);
    }
    assert!(index.evicted() > 0);
    for s in 0..sources {
        index.apply(
            &id(&format!("s{s:04}")),
            0,
            &batch(vec![KvEvent::AllCleared]),
        );
    }
    assert_eq!(index.size().nodes, 0);
    assert!(index.size().bytes <= index.config().memory_bound(sources, 0));
}

#[derive(Debug, Clone)]
enum Feed {
    Store {
        source: usize,
        prompt: u32,
        from: u32,
        pages: u32,
        tier: usize,
    },
    Remove {
        source: usize,
        prompt: u32,
        pages: u32,
    },
    Clear {
        source: usize,
    },
}

fn feed() -> impl Strategy<Value = Feed> {
    let source = prop_oneof![0usize..4, 60usize..70, 190usize..200];
    prop_oneof![
        6 => (source.clone(), 0u32..24, 0u32..8, 1u32..24, 0usize..3)
            .prop_map(|(source, prompt, from, pages, tier)| Feed::Store { source, prompt, from, pages, tier }),
        2 => (source.clone(), 0u32..24, 1u32..32).prop_map(|(source, prompt, pages)| Feed::Remove { source, prompt, pages }),
        1 => source.prop_map(|source| Feed::Clear { source }),
    ]
}

proptest! {
    #[test]
    fn whatever_the_feeds_send_the_index_stays_within_its_memory_bound(
        feeds in proptest::collection::vec(feed(), 1..200),
    ) {
        let index = PrefixIndex::new(IndexConfig { block_size: BS, max_nodes: 256, max_entries: 512 });
        let sources = 200;
        let bound = index.config().memory_bound(sources, 32);
        for feed in feeds {
            let event = match feed {
                Feed::Store { source, prompt, from, pages, tier } => {
                    // Prompts are shared by every source; a store continues nothing,
                    // starting at the prompt's page `from`.
                    let tokens: Vec<u32> = (from * BS..(from + pages) * BS).map(|i| prompt * 1_000 + i).collect();
                    let hashes: Vec<u64> = (from..from + pages).map(|b| u64::from(prompt) << 16 | u64::from(b)).collect();
                    (source, stored(&hashes, None, tokens, [Tier::Device, Tier::Host, Tier::Disk][tier]))
                }
                Feed::Remove { source, prompt, pages } => (
                    source,
                    KvEvent::Removed(crate::kv_events::wire::BlockRemoved {
                        block_hashes: (0..pages).map(|b| u64::from(prompt) << 16 | u64::from(b)).collect(),
                        tier: None,
                    }),
                ),
                Feed::Clear { source } => (source, KvEvent::AllCleared),
            };
            let (source, event) = event;
            index.apply(&id(&format!("s{source:03}")), 0, &batch(vec![event]));
            let size = index.size();
            prop_assert!(size.bytes <= bound, "{:?} past the bound {}", size, bound);
            prop_assert!(index.spills_are_exact());
        }
    }
}

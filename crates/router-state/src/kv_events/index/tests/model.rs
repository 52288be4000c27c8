//! The index against a naive model of what each source holds, with sources in the
//! first owner word and spread over many.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::kv_events::hash::chain_hashes;
use crate::kv_events::wire::BlockRemoved;

/// A naive model: per source, the chain hashes it holds with their tier masks.
#[derive(Default)]
struct Model {
    held: HashMap<(EngineId, u32), HashMap<u64, (u64, u8)>>,
}

impl Model {
    fn apply(&mut self, source: &(EngineId, u32), event: &KvEvent) {
        let held = self.held.entry(source.clone()).or_default();
        match event {
            KvEvent::Stored(s) => {
                let seed = match s.parent {
                    None => 0,
                    Some(p) => match held.get(&p) {
                        Some((chain, _)) => *chain,
                        None => return,
                    },
                };
                for (h, chain) in
                    s.block_hashes
                        .iter()
                        .zip(chain_hashes(&s.tokens, BS as usize, seed))
                {
                    held.entry(*h).or_insert((chain, 0)).1 |= tier_bit(s.tier);
                }
            }
            KvEvent::Removed(r) => {
                let mask = r.tier.map_or(0xff, tier_bit);
                for h in &r.block_hashes {
                    if let Some(entry) = held.get_mut(h) {
                        entry.1 &= !mask;
                        if entry.1 == 0 {
                            held.remove(h);
                        }
                    }
                }
            }
            KvEvent::AllCleared => held.clear(),
        }
    }

    fn depth(&self, engine: &EngineId, chain: &[u64]) -> usize {
        self.held
            .iter()
            .filter(|((e, _), _)| e == engine)
            .map(|(_, held)| {
                chain
                    .iter()
                    .take_while(|h| held.values().any(|(c, _)| c == *h))
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Store {
        source: usize,
        prefix: usize,
        from: usize,
        len: usize,
        tier: usize,
    },
    Remove {
        source: usize,
        prefix: usize,
        block: usize,
        tier: Option<usize>,
    },
    Clear {
        source: usize,
    },
    Restart {
        source: usize,
    },
}

const SOURCES: [(&str, u32); 4] = [("a", 0), ("a", 1), ("b", 0), ("c", 0)];

fn prefix_tokens(prefix: usize) -> Vec<u32> {
    // Prefixes 0 and 1 share their first two pages.
    let start = if prefix < 2 { 0 } else { prefix as u32 * 1000 };
    let mut tokens: Vec<u32> = (start..start + 8).collect();
    tokens.extend((0..16).map(|i| prefix as u32 * 100 + i + 10_000));
    tokens
}

/// The engine hash a source gives page `block` of `prefix`: deterministic per
/// content, as within one engine incarnation.
fn engine_hash(source: usize, prefix: usize, block: usize) -> u64 {
    let chain = chain_hashes(&prefix_tokens(prefix), BS as usize, 0);
    chain[block] ^ (source as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..4, 0usize..4, 0usize..6, 1usize..4, 0usize..3)
            .prop_map(|(source, prefix, from, len, tier)| Op::Store { source, prefix, from, len, tier }),
        2 => (0usize..4, 0usize..4, 0usize..6, proptest::option::of(0usize..3))
            .prop_map(|(source, prefix, block, tier)| Op::Remove { source, prefix, block, tier }),
        1 => (0usize..4).prop_map(|source| Op::Clear { source }),
        1 => (0usize..4).prop_map(|source| Op::Restart { source }),
    ]
}

const TIERS: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];

/// Applies `ops` to `index` and to the naive model, checking that every lookup
/// agrees with the model after each.
fn agrees_with_model(index: &PrefixIndex, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    for op in ops {
        let (source, event) = match *op {
            Op::Store {
                source,
                prefix,
                from,
                len,
                tier,
            } => {
                let tokens = prefix_tokens(prefix);
                let to = (from + len).min(6);
                let hashes: Vec<u64> = (from..to).map(|b| engine_hash(source, prefix, b)).collect();
                let parent = from.checked_sub(1).map(|b| engine_hash(source, prefix, b));
                let tokens = tokens[from * BS as usize..to * BS as usize].to_vec();
                (source, stored(&hashes, parent, tokens, TIERS[tier]))
            }
            Op::Remove {
                source,
                prefix,
                block,
                tier,
            } => {
                let removed = BlockRemoved {
                    block_hashes: vec![engine_hash(source, prefix, block)],
                    tier: tier.map(|t| TIERS[t]),
                };
                (source, KvEvent::Removed(removed))
            }
            Op::Clear { source } | Op::Restart { source } => (source, KvEvent::AllCleared),
        };
        let key = (id(SOURCES[source].0), SOURCES[source].1);
        if matches!(op, Op::Restart { .. }) {
            index.clear_source(&key.0, key.1);
        } else {
            index.apply(&key.0, key.1, &batch(vec![event.clone()]));
        }
        model.apply(&key, &event);
        for prefix in 0..4 {
            let chain = chain_hashes(&prefix_tokens(prefix), BS as usize, 0);
            let found = index.lookup(&chain);
            for engine in ["a", "b", "c"] {
                prop_assert_eq!(
                    found.blocks_of(&id(engine)),
                    model.depth(&id(engine), &chain),
                    "the index matches engine {} on prefix {} as the naive model does after {:?}",
                    engine,
                    prefix,
                    op
                );
            }
        }
        prop_assert!(index.spills_are_exact(), "spills are counted as they are");
    }
    prop_assert_eq!(
        index.engine_hashes(),
        index.size().entries,
        "one engine hash per entry"
    );
    prop_assert!(index.pool_is_exact(), "every leaf is pooled once");
    let entries: usize = model
        .held
        .values()
        .map(|h| {
            h.values()
                .map(|(c, _)| *c)
                .collect::<std::collections::HashSet<_>>()
                .len()
        })
        .sum();
    prop_assert_eq!(index.size().entries, entries, "entry counts agree");
    Ok(())
}

/// An index whose sources `SOURCES` have the slots `slots`, the others taken by
/// sources that hold nothing.
fn index_with_slots(slots: &[u32]) -> PrefixIndex {
    let index = index();
    let last = slots.iter().copied().max().unwrap_or(0);
    for slot in 0..=last {
        let (engine, rank) = match slots.iter().position(|s| *s == slot) {
            Some(source) => (id(SOURCES[source].0), SOURCES[source].1),
            None => (id(&format!("idle{slot:04}")), 0),
        };
        index.apply(&engine, rank, &batch(Vec::new()));
    }
    index
}

proptest! {
    #[test]
    fn the_index_agrees_with_a_naive_model(ops in proptest::collection::vec(op(), 1..60)) {
        agrees_with_model(&index(), &ops)?;
    }

    #[test]
    fn the_index_agrees_with_a_naive_model_with_owners_in_many_words(
        ops in proptest::collection::vec(op(), 1..60),
        slots in proptest::sample::subsequence((0u32..1_100).collect::<Vec<_>>(), 4).prop_shuffle(),
    ) {
        let index = index_with_slots(&slots);
        agrees_with_model(&index, &ops)?;
        for (engine, rank) in SOURCES {
            index.apply(&id(engine), rank, &batch(vec![KvEvent::AllCleared]));
        }
        let size = index.size();
        prop_assert_eq!((size.nodes, size.entries), (0, 0), "cleared sources leave nothing");
        prop_assert_eq!(index.spills_in_use(), 0, "every spill given back");
    }

    #[test]
    fn a_small_budget_holds_and_never_invents_ownership(ops in proptest::collection::vec(op(), 1..60)) {
        let index = PrefixIndex::new(IndexConfig { block_size: BS, max_nodes: 8, max_entries: 12 });
        let mut model = Model::default();
        for op in &ops {
            if let Op::Store { source, prefix, from, len, tier } = *op {
                let tokens = prefix_tokens(prefix);
                let to = (from + len).min(6);
                let hashes: Vec<u64> = (from..to).map(|b| engine_hash(source, prefix, b)).collect();
                let parent = from.checked_sub(1).map(|b| engine_hash(source, prefix, b));
                let event = stored(&hashes, parent, tokens[from * BS as usize..to * BS as usize].to_vec(), TIERS[tier]);
                let key = (id(SOURCES[source].0), SOURCES[source].1);
                index.apply(&key.0, key.1, &batch(vec![event.clone()]));
                model.apply(&key, &event);
            }
            prop_assert!(index.size().nodes <= 8, "the node budget holds");
            prop_assert!(index.size().entries <= 12, "the entry budget holds");
            prop_assert_eq!(index.engine_hashes(), index.size().entries, "evicted pages' engine hashes go with them");
            prop_assert!(index.pool_is_exact(), "every leaf is pooled once");
            for prefix in 0..4 {
                let chain = chain_hashes(&prefix_tokens(prefix), BS as usize, 0);
                let found = index.lookup(&chain);
                for engine in ["a", "b", "c"] {
                    prop_assert!(found.blocks_of(&id(engine)) <= model.depth(&id(engine), &chain), "eviction only forgets");
                }
            }
        }
    }
}

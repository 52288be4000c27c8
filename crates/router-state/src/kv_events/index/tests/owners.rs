//! A page's owners: what a node and its spill keep, against a plain map of owners,
//! and what owners cost at high ranks and when they go.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::kv_events::index::node::Node;
use crate::kv_events::wire::BlockRemoved;

/// Slots in the first word, at the edges of words and far out, so a page's owners
/// take up to several words.
const SLOTS: [std::ops::Range<u32>; 5] = [0..4, 62..66, 127..130, 1_000..1_003, 5_000..5_002];

fn slot() -> impl Strategy<Value = u32> {
    proptest::sample::select(SLOTS.iter().cloned().flatten().collect::<Vec<_>>())
}

#[derive(Debug, Clone)]
enum Change {
    Own {
        node: usize,
        slot: u32,
        tiers: u8,
        hash: u64,
    },
    Disown {
        node: usize,
        slot: u32,
    },
}

fn change() -> impl Strategy<Value = Change> {
    let tiers = prop_oneof![3 => Just(DEVICE), 1 => 1u8..16];
    prop_oneof![
        3 => (0usize..3, slot(), tiers, any::<u64>())
            .prop_map(|(node, slot, tiers, hash)| Change::Own { node, slot, tiers, hash }),
        2 => (0usize..3, slot()).prop_map(|(node, slot)| Change::Disown { node, slot }),
    ]
}

/// A page's owners as they should read: slot -> (tiers, engine hash).
type Owners = BTreeMap<u32, (u8, u64)>;

fn reads_as(node: &Node, spills: &Spills, owners: &Owners) -> Result<(), TestCaseError> {
    let mut slots: Vec<u32> = node.owner_slots(spills).collect();
    slots.sort_unstable();
    prop_assert_eq!(slots, owners.keys().copied().collect::<Vec<_>>());
    prop_assert_eq!(node.owner_count(spills), owners.len());
    prop_assert_eq!(node.has_owners(), !owners.is_empty());
    // (any tier, device) bits by word.
    let mut want: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for (&slot, &(tiers, _)) in owners {
        let bits = want.entry(slot as usize / 64).or_default();
        bits.0 |= 1 << (slot % 64);
        if tiers & DEVICE != 0 {
            bits.1 |= 1 << (slot % 64);
        }
    }
    let mut words: Vec<(usize, u64)> = node.words(spills).collect();
    words.sort_unstable();
    let want_words: Vec<(usize, u64)> = want.iter().map(|(w, bits)| (*w, bits.0)).collect();
    prop_assert_eq!(words, want_words, "the words with owners, each once");
    let words = 5_002 / 64 + 1;
    let (mut by_word, mut device_by_word) = (vec![u64::MAX; words], vec![u64::MAX; words]);
    node.owners_by_word(spills, &mut by_word, &mut device_by_word);
    for word in 0..words {
        let (any, device) = want.get(&word).copied().unwrap_or_default();
        prop_assert_eq!(node.owner_word(spills, word), any, "word {}", word);
        prop_assert_eq!(node.owners_in(spills, word), (any, device), "word {}", word);
        prop_assert_eq!(
            (by_word[word], device_by_word[word]),
            (any, device),
            "word {}",
            word
        );
    }
    for slot in SLOTS.iter().cloned().flatten() {
        let held = owners.get(&slot);
        prop_assert_eq!(node.tiers_of(spills, slot), held.map_or(0, |h| h.0));
        prop_assert_eq!(node.engine_hash(spills, slot), held.map(|h| h.1));
    }
    Ok(())
}

proptest! {
    #[test]
    fn owners_read_back_as_kept_in_any_words_and_leave_nothing_behind(
        changes in proptest::collection::vec(change(), 1..80),
    ) {
        let mut spills = Spills::default();
        let mut nodes: Vec<Node> = (0..3).map(|_| Node::new(0, 0)).collect();
        let mut owners = vec![Owners::new(); 3];
        for change in &changes {
            match *change {
                Change::Own { node, slot, tiers, hash } => {
                    nodes[node].own(&mut spills, slot, tiers, hash);
                    owners[node].insert(slot, (tiers, hash));
                }
                Change::Disown { node, slot } => {
                    nodes[node].disown(&mut spills, slot);
                    owners[node].remove(&slot);
                }
            }
            for (node, owners) in nodes.iter().zip(&owners) {
                reads_as(node, &spills, owners)?;
            }
            // One owner on the device, in any word, takes no spill.
            let spilled = owners
                .iter()
                .filter(|o| o.len() > 1 || o.values().any(|(tiers, _)| *tiers != DEVICE))
                .count();
            prop_assert_eq!(spills.len(), spilled, "a spill only for shared or tiered pages");
            prop_assert!(spills.is_exact());
        }
        for (node, owners) in nodes.iter_mut().zip(&mut owners) {
            let slots: Vec<u32> = owners.keys().copied().collect();
            for slot in slots {
                node.disown(&mut spills, slot);
                owners.remove(&slot);
                reads_as(node, &spills, owners)?;
            }
        }
        prop_assert_eq!(spills.len(), 0, "every spill given back");
        prop_assert!(spills.is_exact(), "and its lists' bytes with it");
    }
}

/// An index of 1,024 sources, engines `e0000`..`e1023` of one rank each, holding
/// nothing yet (source `i` has slot `i`).
fn fleet() -> PrefixIndex {
    let index = index();
    for s in 0..1_024 {
        index.apply(&id(&format!("e{s:04}")), 0, &batch(Vec::new()));
    }
    index
}

/// Stores 64 conversations of four pages of their own from engine `e{source}`.
fn store_distinct(index: &PrefixIndex, source: usize) {
    for c in 0..64u64 {
        let tokens: Vec<u32> = (0..16).map(|i| c as u32 * 100 + i).collect();
        let hashes: Vec<u64> = (c * 4..c * 4 + 4).collect();
        let event = stored(&hashes, None, tokens, Tier::Device);
        index.apply(&id(&format!("e{source:04}")), 0, &batch(vec![event]));
    }
}

#[test]
fn a_page_only_a_high_rank_holds_costs_what_one_rank_0_holds() {
    let low = fleet();
    store_distinct(&low, 0);
    let high = fleet();
    store_distinct(&high, 1_000);
    assert_eq!(high.spills_in_use(), 0, "one owner, in any word, is inline");
    assert_eq!(high.size(), low.size(), "the same pages, the same bytes");
    let chain = high.request_hashes(None, &(0..16).collect::<Vec<_>>());
    assert_eq!(high.lookup(&chain).blocks_of(&id("e1000")), 4);
}

#[test]
fn a_page_every_rank_holds_matches_word_by_word_and_its_owners_leave_nothing() {
    let index = fleet();
    let empty = index.size();
    let tokens: Vec<u32> = (0..32).collect();
    let chain = index.request_hashes(None, &tokens);
    // Source s holds the first s % 8 + 1 pages, every fifth only on the host.
    let depth = |s: usize| s % 8 + 1;
    let hashes =
        |s: usize| -> Vec<u64> { (0..depth(s) as u64).map(|b| s as u64 * 100 + b).collect() };
    for s in 0..1_024 {
        let tier = if s % 5 == 0 { Tier::Host } else { Tier::Device };
        let held = tokens[..depth(s) * BS as usize].to_vec();
        let event = stored(&hashes(s), None, held, tier);
        index.apply(&id(&format!("e{s:04}")), 0, &batch(vec![event]));
    }
    let check = |gone: &dyn Fn(usize) -> bool| {
        let found = index.lookup_by_engine(&chain, true);
        let want: Vec<(String, usize, usize)> = (0..1_024)
            .filter(|s| !gone(*s))
            .map(|s| {
                let device = if s % 5 == 0 { 0 } else { depth(s) };
                (format!("e{s:04}"), depth(s), device)
            })
            .collect();
        let got: Vec<(String, usize, usize)> = found
            .engines
            .iter()
            .map(|m| (m.engine.as_str().to_owned(), m.blocks, m.device_blocks))
            .collect();
        assert_eq!(got, want);
    };
    check(&|_| false);
    let size = index.size();
    assert_eq!(size.nodes, 8);
    assert!(index.spills_in_use() <= 8);
    // Each page's 1,023 further owners are listed with their engine hashes.
    let listed = (size.entries - size.nodes) * 16;
    assert!(
        size.bytes >= empty.bytes + listed,
        "the estimate counts the spills: {size:?}, empty {empty:?}"
    );
    // The owners leave in a scrambled order.
    let order: Vec<usize> = (0..1_024).map(|i| i * 389 % 1_024).collect();
    for (n, &s) in order.iter().enumerate() {
        let removed = KvEvent::Removed(BlockRemoved {
            block_hashes: hashes(s),
            tier: None,
        });
        index.apply(&id(&format!("e{s:04}")), 0, &batch(vec![removed]));
        if n == 511 {
            let gone: Vec<usize> = order[..=n].to_vec();
            check(&|s| gone.contains(&s));
        }
        assert!(index.spills_are_exact());
    }
    let size = index.size();
    assert_eq!((size.nodes, size.entries), (0, 0));
    assert_eq!(index.spills_in_use(), 0, "every spill given back");
}

#[test]
fn engine_hashes_give_their_room_back_when_pages_go() {
    let index = budget(10_000);
    for c in 0..2_500 {
        store_conversation(&index, "a", c);
    }
    assert!(index.engine_hash_room() >= 10_000);
    let removed = KvEvent::Removed(BlockRemoved {
        block_hashes: (40..10_000).collect(),
        tier: None,
    });
    index.apply(&id("a"), 0, &batch(vec![removed]));
    assert_eq!(index.size().entries, 40);
    let room = index.engine_hash_room();
    assert!(room <= 3 * 40 + 64, "the room went with the pages: {room}");
    // Evictions give room back too: the maps never hold more than about three
    // times the entries.
    for c in 2_500..5_000 {
        store_conversation(&index, "b", c);
        let room = index.engine_hash_room();
        assert!(room <= 3 * index.size().entries + 2 * 64, "{room}");
    }
    for engine in ["a", "b"] {
        index.apply(&id(engine), 0, &batch(vec![KvEvent::AllCleared]));
    }
    assert_eq!(index.engine_hash_room(), 0, "a clear gives it all back");
}

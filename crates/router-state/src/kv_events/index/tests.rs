use super::*;
use crate::kv_events::wire::BlockRemoved;

mod budgets;
mod model;
mod owners;

const BS: u32 = 4;

fn id(s: &str) -> EngineId {
    EngineId::from(s)
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>, tier: Tier) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: hashes.to_vec(),
        parent,
        tokens,
        block_size: BS,
        tier,
        namespace: None,
        group_idx: None,
        group_kind: None,
    })
}

fn batch(events: Vec<KvEvent>) -> KvBatch {
    KvBatch {
        ts: 0.0,
        events,
        dp_rank: None,
        dropped: Vec::new(),
    }
}

fn index() -> PrefixIndex {
    PrefixIndex::new(IndexConfig {
        block_size: BS,
        max_nodes: 1 << 20,
        ..IndexConfig::default()
    })
}

#[test]
fn stores_chain_under_their_parents_and_lookups_return_contiguous_depths() {
    let index = index();
    let tokens: Vec<u32> = (0..16).collect();
    let chain = index.request_hashes(None, &tokens);
    index.apply(
        &id("a"),
        0,
        &batch(vec![stored(
            &[10, 11],
            None,
            tokens[..8].to_vec(),
            Tier::Device,
        )]),
    );
    let outcome = index.apply(
        &id("a"),
        0,
        &batch(vec![stored(
            &[12],
            Some(11),
            tokens[8..12].to_vec(),
            Tier::Device,
        )]),
    );
    assert_eq!(outcome.stored, 1);
    index.apply(
        &id("b"),
        0,
        &batch(vec![stored(
            &[20],
            None,
            tokens[..4].to_vec(),
            Tier::Device,
        )]),
    );
    let found = index.lookup(&chain);
    assert_eq!(found.query_blocks, 4);
    assert_eq!(found.blocks_of(&id("a")), 3);
    assert_eq!(found.blocks_of(&id("b")), 1);
    assert_eq!(found.engines[0].engine, id("a"), "deepest first");
    assert_eq!(index.size().entries, 4);
    assert!(index.holds(&id("a"), 0, chain[2]));
}

#[test]
fn skips_stores_that_do_not_fit_and_says_why() {
    let index = index();
    let mut wrong_size = stored(&[1], None, vec![0; 8], Tier::Device);
    if let KvEvent::Stored(s) = &mut wrong_size {
        s.block_size = 8;
    }
    let misaligned = stored(&[1, 2], None, vec![0; 5], Tier::Device);
    let orphan = stored(&[3], Some(99), vec![0; 4], Tier::Device);
    let mut window = stored(&[4], None, vec![0; 4], Tier::Device);
    if let KvEvent::Stored(s) = &mut window {
        s.group_idx = Some(1);
    }
    let outcome = index.apply(
        &id("a"),
        0,
        &batch(vec![wrong_size, misaligned, orphan, window]),
    );
    let reasons: Vec<_> = outcome.skipped.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "block_size_mismatch",
            "misaligned",
            "unknown_parent",
            "non_attention_group"
        ]
    );
    assert_eq!(index.size().nodes, 0);
    let removal = index.apply(
        &id("a"),
        0,
        &batch(vec![KvEvent::Removed(BlockRemoved {
            block_hashes: vec![77],
            tier: None,
        })]),
    );
    assert_eq!(removal.skipped, [SkipReason::UnknownBlock]);
}

#[test]
fn a_removal_on_one_tier_keeps_the_copy_on_another() {
    let index = index();
    let tokens: Vec<u32> = (0..4).collect();
    let chain = index.request_hashes(None, &tokens);
    index.apply(
        &id("a"),
        0,
        &batch(vec![
            stored(&[1], None, tokens.clone(), Tier::Device),
            stored(&[1], None, tokens.clone(), Tier::Host),
        ]),
    );
    assert_eq!(index.size().entries, 1, "one page, two copies");
    index.apply(
        &id("a"),
        0,
        &batch(vec![KvEvent::Removed(BlockRemoved {
            block_hashes: vec![1],
            tier: Some(Tier::Device),
        })]),
    );
    let found = index.lookup(&chain);
    assert_eq!(
        (found.engines[0].blocks, found.engines[0].device_blocks),
        (1, 0),
        "the host copy remains"
    );
    index.apply(
        &id("a"),
        0,
        &batch(vec![KvEvent::Removed(BlockRemoved {
            block_hashes: vec![1],
            tier: None,
        })]),
    );
    assert!(index.lookup(&chain).engines.is_empty());
    assert_eq!(
        index.size(),
        IndexSize {
            nodes: 0,
            entries: 0,
            bytes: index.size().bytes
        }
    );
}

#[test]
fn an_engine_is_its_best_ranks_match_every_figure_of_that_rank() {
    let index = index();
    let tokens: Vec<u32> = (0..40).collect();
    let chain = index.request_hashes(None, &tokens);
    let hashes: Vec<u64> = (1..=10).collect();
    // Rank 0 holds all ten pages on the host; rank 1 the first eight on the device.
    index.apply(
        &id("a"),
        0,
        &batch(vec![stored(&hashes, None, tokens.clone(), Tier::Host)]),
    );
    index.apply(
        &id("a"),
        1,
        &batch(vec![stored(
            &hashes[..8],
            None,
            tokens[..32].to_vec(),
            Tier::Device,
        )]),
    );
    index.set_feed_age(&id("a"), 0, Duration::from_millis(7));
    let found = index.lookup(&chain);
    let m = &found.engines[0];
    assert_eq!(
        (m.blocks, m.device_blocks, m.rank, m.feed_age),
        (10, 0, 0, Duration::from_millis(7)),
        "rank 1's device pages are not rank 0's"
    );
}

#[test]
fn feed_ages_give_each_engine_its_most_lagging_rank_in_id_order() {
    let index = index();
    let tokens: Vec<u32> = (0..4).collect();
    // Sources join out of id order, an engine's ranks apart.
    for (engine, rank, ms) in [
        ("c", 1, 3),
        ("a", 0, 9),
        ("c", 0, 5),
        ("b", 0, 1),
        ("a", 1, 2),
    ] {
        index.apply(
            &id(engine),
            rank,
            &batch(vec![stored(&[1], None, tokens.clone(), Tier::Device)]),
        );
        index.set_feed_age(&id(engine), rank, Duration::from_millis(ms));
    }
    let ms = |ages: Vec<(EngineId, Duration)>| {
        ages.into_iter()
            .map(|(engine, age)| (engine.to_string(), age.as_millis()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ms(index.feed_ages()),
        [("a".into(), 9), ("b".into(), 1), ("c".into(), 5)]
    );
    index.remove_engine(&id("a"));
    assert_eq!(ms(index.feed_ages()), [("b".into(), 1), ("c".into(), 5)]);
}

#[test]
fn clears_restarts_degradation_and_engine_removal() {
    let index = index();
    let tokens: Vec<u32> = (0..8).collect();
    let chain = index.request_hashes(None, &tokens);
    for engine in ["a", "b"] {
        index.apply(
            &id(engine),
            0,
            &batch(vec![stored(&[1, 2], None, tokens.clone(), Tier::Device)]),
        );
    }
    index.set_degraded(&id("b"), 0, true);
    assert_eq!(
        index.lookup(&chain).engines.len(),
        1,
        "a degraded source is not trusted"
    );
    index.set_degraded(&id("b"), 0, false);
    index.apply(&id("a"), 0, &batch(vec![KvEvent::AllCleared]));
    assert_eq!(index.lookup(&chain).blocks_of(&id("a")), 0);
    index.clear_source(&id("b"), 0);
    assert!(index.lookup(&chain).engines.is_empty());
    assert!(
        index.publisher(&id("b")).is_some(),
        "a cleared source still publishes"
    );
    assert!(index.publisher(&id("c")).is_none(), "c never sent a batch");
    index.apply(
        &id("a"),
        0,
        &batch(vec![stored(&[1, 2], None, tokens.clone(), Tier::Device)]),
    );
    index.remove_engine(&id("a"));
    assert_eq!(
        index.size().nodes,
        0,
        "removing the engine drops its entries"
    );
    assert!(
        index.publisher(&id("a")).is_none(),
        "a removed engine publishes no more"
    );
    assert!(index.publisher(&id("b")).is_some());
}

#[test]
fn lookups_over_more_than_64_sources_match_word_by_word() {
    let index = index();
    let tokens: Vec<u32> = (0..50 * BS).collect();
    let chain = index.request_hashes(None, &tokens);
    // Engine i holds the first i % 50 + 1 pages (walks ending on either side of
    // the lookahead's chunks of 16); engine 100 only a host copy of its one, engine
    // 70 is being repaired.
    for i in 0..130u64 {
        let pages = (i % 50 + 1) as usize;
        let tier = if i == 100 { Tier::Host } else { Tier::Device };
        let hashes: Vec<u64> = (0..pages as u64).map(|b| i * 1000 + b).collect();
        let event = stored(&hashes, None, tokens[..pages * BS as usize].to_vec(), tier);
        index.apply(&id(&format!("e{i:03}")), 0, &batch(vec![event]));
    }
    // Engine 130: the first 20 pages on the device, the next 20 only on the host (its
    // device copy ends past the first chunk of 16, within the second).
    let device: Vec<u64> = (0..20).map(|b| 130_000 + b).collect();
    let host: Vec<u64> = (20..40).map(|b| 130_000 + b).collect();
    let tokens_of = |pages: std::ops::Range<usize>| {
        tokens[pages.start * BS as usize..pages.end * BS as usize].to_vec()
    };
    let events = vec![
        stored(&device, None, tokens_of(0..20), Tier::Device),
        stored(&host, Some(130_019), tokens_of(20..40), Tier::Host),
    ];
    index.apply(&id("e130"), 0, &batch(events));
    index.set_degraded(&id("e070"), 0, true);
    let found = index.lookup(&chain);
    assert_eq!(
        found.engines.len(),
        130,
        "every engine but the degraded one"
    );
    let e130 = found
        .engines
        .iter()
        .find(|m| m.engine == id("e130"))
        .expect("a match");
    assert_eq!((e130.blocks, e130.device_blocks), (40, 20));
    for i in (0..130u64).filter(|i| *i != 70) {
        let m = found
            .engines
            .iter()
            .find(|m| m.engine == id(&format!("e{i:03}")))
            .expect("a match");
        let pages = (i % 50 + 1) as usize;
        let device = if i == 100 { 0 } else { pages };
        assert_eq!((m.blocks, m.device_blocks), (pages, device), "engine {i}");
    }
}

#[test]
fn many_sources_in_any_order_answer_each_engine_once_in_order() {
    let index = index();
    let tokens: Vec<u32> = (0..40).collect();
    let chain = index.request_hashes(None, &tokens);
    // 200 engines of two ranks, first heard from in reverse id order; rank r of
    // engine i holds the first (i + r) % 10 + 1 pages.
    let store = |i: u64, rank: u32| {
        let pages = ((i + u64::from(rank)) % 10 + 1) as usize;
        let hashes: Vec<u64> = (0..pages as u64).map(|b| i * 1000 + b).collect();
        let event = stored(
            &hashes,
            None,
            tokens[..pages * BS as usize].to_vec(),
            Tier::Device,
        );
        index.apply(&id(&format!("e{i:03}")), rank, &batch(vec![event]));
    };
    for i in (0..200u64).rev() {
        store(i, 1);
        store(i, 0);
    }
    // Engines leaving and coming back take free slots out of order.
    for i in [5u64, 150, 77] {
        index.remove_engine(&id(&format!("e{i:03}")));
    }
    store(150, 0);
    let expected = |i: u64| -> (usize, u32) {
        let depth = |r: u64| ((i + r) % 10 + 1) as usize;
        match i {
            150 => (depth(0), 0),
            _ if depth(1) > depth(0) => (depth(1), 1),
            _ => (depth(0), 0),
        }
    };
    let by_engine = index.lookup_by_engine(&chain, false);
    let ids: Vec<String> = by_engine
        .engines
        .iter()
        .map(|m| m.engine.as_str().to_owned())
        .collect();
    let mut want: Vec<String> = (0..200u64)
        .filter(|i| ![5, 77].contains(i))
        .map(|i| format!("e{i:03}"))
        .collect();
    assert_eq!(ids, want, "each engine once, in id order");
    for m in &by_engine.engines {
        let i: u64 = m.engine.as_str()[1..].parse().expect("an index");
        assert_eq!((m.blocks, m.rank), expected(i), "engine {i}: its best rank");
    }
    let found = index.lookup(&chain);
    want.sort_by_key(|e| std::cmp::Reverse(expected(e[1..].parse().expect("an index")).0));
    let ids: Vec<String> = found
        .engines
        .iter()
        .map(|m| m.engine.as_str().to_owned())
        .collect();
    assert_eq!(ids, want, "deepest first, then by id");
}

fn budget(max_nodes: usize) -> PrefixIndex {
    PrefixIndex::new(IndexConfig {
        block_size: BS,
        max_nodes,
        ..IndexConfig::default()
    })
}

/// Stores conversation `c` (four pages of its own) as page hashes `4c..4c+4`.
fn store_conversation(index: &PrefixIndex, engine: &str, c: u64) {
    let tokens: Vec<u32> = (0..16).map(|i| c as u32 * 100 + i).collect();
    let hashes: Vec<u64> = (c * 4..c * 4 + 4).collect();
    index.apply(
        &id(engine),
        0,
        &batch(vec![stored(&hashes, None, tokens, Tier::Device)]),
    );
}

#[test]
fn a_source_that_never_removes_keeps_engine_hashes_only_for_pages_in_the_budget() {
    let index = budget(64);
    for c in 0..5_000 {
        store_conversation(&index, "a", c);
    }
    let size = index.size();
    assert!(size.nodes <= 64, "the node budget holds: {size:?}");
    assert_eq!(
        index.engine_hashes(),
        size.entries,
        "one engine hash per page the source holds"
    );
    // The 20,000 engine hashes of every page announced would take over 300 KiB.
    assert!(size.bytes < 32 << 10, "memory stays small: {size:?}");
    assert!(index.evicted() >= 4 * 4_900);
}

#[test]
fn pages_announced_again_under_new_engine_hashes_keep_one_hash() {
    let index = index();
    let tokens: Vec<u32> = (0..8).collect();
    let chain = index.request_hashes(None, &tokens);
    for round in 0..1_000u64 {
        let hashes = [round * 2, round * 2 + 1];
        index.apply(
            &id("a"),
            0,
            &batch(vec![stored(&hashes, None, tokens.clone(), Tier::Device)]),
        );
    }
    assert_eq!(index.engine_hashes(), 2, "the latest hash of each page");
    assert_eq!(index.size().entries, 2);
    let stale = index.apply(
        &id("a"),
        0,
        &batch(vec![KvEvent::Removed(BlockRemoved {
            block_hashes: vec![0],
            tier: None,
        })]),
    );
    assert_eq!(stale.skipped, [SkipReason::UnknownBlock], "a replaced hash");
    assert_eq!(index.lookup(&chain).blocks_of(&id("a")), 2);
    // A hash reused for other content moves to it: the old page loses the source.
    let other: Vec<u32> = (100..104).collect();
    index.apply(
        &id("a"),
        0,
        &batch(vec![stored(&[1_999], None, other.clone(), Tier::Device)]),
    );
    assert_eq!(index.lookup(&chain).blocks_of(&id("a")), 1);
    assert_eq!(
        index
            .lookup(&index.request_hashes(None, &other))
            .blocks_of(&id("a")),
        1
    );
    assert_eq!(index.engine_hashes(), 2);
}

#[test]
fn removals_and_continuations_of_evicted_pages_are_skipped_as_unknown() {
    let index = budget(16);
    store_conversation(&index, "a", 0);
    for c in 1..20 {
        store_conversation(&index, "a", c);
        index.lookup(&index.request_hashes(
            None,
            &(0..16).map(|i| c as u32 * 100 + i).collect::<Vec<_>>(),
        ));
    }
    assert!(!index.holds(
        &id("a"),
        0,
        index.request_hashes(None, &(0..4).collect::<Vec<_>>())[0]
    ));
    let outcome = index.apply(
        &id("a"),
        0,
        &batch(vec![
            KvEvent::Removed(BlockRemoved {
                block_hashes: vec![3],
                tier: None,
            }),
            stored(&[100], Some(3), vec![0; 4], Tier::Device),
        ]),
    );
    assert_eq!(
        outcome.skipped,
        [SkipReason::UnknownBlock, SkipReason::UnknownParent]
    );
}

#[test]
fn eviction_keeps_the_prompts_matched_recently_among_many_leaves() {
    let index = budget(400);
    let prompt = |c: u64| {
        index.request_hashes(
            None,
            &(0..16).map(|i| c as u32 * 100 + i).collect::<Vec<_>>(),
        )
    };
    for c in 0..2_000 {
        store_conversation(&index, "a", c);
        for hot in 0..8 {
            index.lookup(&prompt(hot));
        }
    }
    assert!(index.size().nodes <= 400);
    assert!(index.evicted() >= 4 * 1_900);
    for hot in 0..8 {
        assert_eq!(
            index.lookup(&prompt(hot)).blocks_of(&id("a")),
            4,
            "hot prompt {hot}"
        );
    }
    assert_eq!(
        index.lookup(&prompt(8)).blocks_of(&id("a")),
        0,
        "a cold one went"
    );
    assert!(index.pool_is_exact());
}

#[test]
fn peeks_leave_eviction_order_as_it_was() {
    let index = budget(400);
    let prompt = |c: u64| {
        index.request_hashes(
            None,
            &(0..16).map(|i| c as u32 * 100 + i).collect::<Vec<_>>(),
        )
    };
    for c in 0..2_000 {
        store_conversation(&index, "a", c);
        for hot in 0..8 {
            let peeked = index.peek(&prompt(hot));
            assert_eq!(
                peeked,
                index.peek(&prompt(hot)),
                "a peek answers as a lookup"
            );
        }
    }
    for hot in 0..8 {
        assert_eq!(
            index.peek(&prompt(hot)).blocks_of(&id("a")),
            0,
            "peeked prompt {hot} aged out as if never asked for"
        );
    }
    assert!(index.pool_is_exact());
}

#[test]
fn a_batch_far_past_the_budget_is_evicted_in_steps_down_to_the_budget() {
    let index = budget(100);
    let tokens: Vec<u32> = (0..4_000).collect();
    let hashes: Vec<u64> = (0..1_000).collect();
    index.apply(
        &id("a"),
        0,
        &batch(vec![stored(&hashes, None, tokens.clone(), Tier::Device)]),
    );
    assert_eq!(index.size().nodes, 100);
    assert_eq!(index.evicted(), 900);
    assert_eq!(index.engine_hashes(), 100);
    assert_eq!(
        index
            .lookup(&index.request_hashes(None, &tokens))
            .blocks_of(&id("a")),
        100,
        "the chain's deepest pages went first"
    );
    assert!(index.pool_is_exact());
}

#[tokio::test(start_paused = true)]
async fn a_clear_is_the_publishers_latest() {
    let index = index();
    let tokens: Vec<u32> = (0..8).collect();
    let first = batch(vec![stored(&[1, 2], None, tokens.clone(), Tier::Device)]);
    index.apply(&id("a"), 0, &first);
    assert_eq!(
        index.publisher(&id("a")).map(|p| p.cleared_at),
        Some(None),
        "publishing, never cleared"
    );
    tokio::time::advance(std::time::Duration::from_secs(3)).await;
    index.clear_source(&id("a"), 0);
    let cleared = tokio::time::Instant::now();
    index.apply(&id("a"), 0, &first);
    assert_eq!(
        index.publisher(&id("a")).map(|p| p.cleared_at),
        Some(Some(cleared)),
        "later batches leave the clear as it was"
    );
}

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::test_util::{basic_report, stored_batch};
use router_state::{EngineId, EngineReportedLoadTable, LoadTableConfig};

use super::{Estimated, EventSource, RoutedCacheSource, RoutedPagesSettings};
use crate::cache::{CacheLookup, CacheSource, PrefixHits};

const BLOCK: u32 = 4;

fn id(name: &str) -> EngineId {
    EngineId::new(name)
}

fn prompt(pages: u32) -> Vec<u32> {
    (0..pages * BLOCK).collect()
}

struct Fixture {
    index: Arc<PrefixIndex>,
    load: Arc<EngineReportedLoadTable>,
    source: RoutedCacheSource,
}

fn fixture(settings: RoutedPagesSettings) -> Fixture {
    let index = Arc::new(PrefixIndex::new(IndexConfig {
        block_size: BLOCK,
        max_nodes: 1 << 16,
        ..IndexConfig::default()
    }));
    let load = Arc::new(EngineReportedLoadTable::new(LoadTableConfig::default()));
    let source = RoutedCacheSource::new(
        EventSource::Local(Arc::clone(&index)),
        BLOCK,
        Arc::clone(&load),
        settings,
    );
    Fixture {
        index,
        load,
        source,
    }
}

fn settings(estimate: Estimated, pending_ms: u64) -> RoutedPagesSettings {
    RoutedPagesSettings {
        estimate,
        pending_ms,
        max_age_ms: 60_000,
        ..RoutedPagesSettings::default()
    }
}

/// `engine` announces the first `pages` pages of `tokens`.
fn announce(index: &PrefixIndex, engine: &str, tokens: &[u32], pages: usize) {
    let held = &tokens[..pages * BLOCK as usize];
    index.apply(&id(engine), 0, &stored_batch(held, BLOCK));
}

async fn hits(source: &RoutedCacheSource, tokens: &[u32], dry_run: bool) -> PrefixHits {
    match source.lookup(None, tokens, dry_run).await {
        Ok(CacheLookup::Answered(hits)) => hits,
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_routed_prompt_is_pending_on_its_engine_until_the_pending_time_passes() {
    let f = fixture(settings(Estimated::Auto, 1_000));
    let tokens = prompt(8);
    // `a` publishes events (one unrelated page so far).
    announce(&f.index, "a", &prompt(20)[40..], 1);
    f.source.routed(None, &tokens, &id("a"), 0);
    let found = hits(&f.source, &tokens, false).await;
    assert_eq!(found.engines(), vec![(id("a"), 8)]);
    assert_eq!(found.query_blocks(), 8);
    assert_eq!(found.block_size(), BLOCK);
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(hits(&f.source, &tokens, false).await.blocks_of(&id("a")), 8);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(
        hits(&f.source, &tokens, false).await.engines().is_empty(),
        "past pending_ms a publishing engine's routed pages count no more"
    );
}

#[tokio::test(start_paused = true)]
async fn the_events_confirm_pending_pages_and_the_rest_stay_pending() {
    let f = fixture(settings(Estimated::Auto, 1_000));
    let tokens = prompt(8);
    f.source.routed(None, &tokens, &id("a"), 0);
    announce(&f.index, "a", &tokens, 3);
    let dry = hits(&f.source, &tokens, true).await;
    assert_eq!(dry.engines(), vec![(id("a"), 8)]);
    assert_eq!(
        f.source.routed_pages().pages_of(&id("a")),
        8,
        "a dry run confirms nothing"
    );
    let found = hits(&f.source, &tokens, false).await;
    assert_eq!(
        found.engines(),
        vec![(id("a"), 8)],
        "3 announced, 5 pending"
    );
    assert_eq!(f.source.routed_pages().pages_of(&id("a")), 5);
    announce(&f.index, "a", &tokens, 8);
    hits(&f.source, &tokens, false).await;
    assert!(f.source.routed_pages().is_empty(), "all confirmed");
}

#[tokio::test(start_paused = true)]
async fn only_pages_past_what_a_publisher_holds_are_recorded_and_an_estimate_refreshes_all() {
    let f = fixture(settings(Estimated::Auto, 1_000));
    let tokens = prompt(8);
    announce(&f.index, "a", &tokens, 3);
    f.source.routed(None, &tokens, &id("a"), 3);
    assert_eq!(f.source.routed_pages().pages_of(&id("a")), 5);
    assert_eq!(
        hits(&f.source, &tokens, true).await.engines(),
        vec![(id("a"), 8)]
    );
    f.source.routed(None, &tokens, &id("quiet"), 8);
    assert_eq!(
        f.source.routed_pages().pages_of(&id("quiet")),
        8,
        "an estimated engine's pages are all refreshed"
    );
}

#[tokio::test(start_paused = true)]
async fn an_engine_without_events_is_estimated_from_routing_unless_estimate_is_none() {
    let tokens = prompt(6);
    let auto = fixture(settings(Estimated::Auto, 1_000));
    auto.source.routed(None, &tokens, &id("quiet"), 0);
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(
        hits(&auto.source, &tokens, false).await.engines(),
        vec![(id("quiet"), 6)],
        "no events from it: its routed pages count up to max_age_ms"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    assert!(
        hits(&auto.source, &tokens, false)
            .await
            .engines()
            .is_empty()
    );

    let pending = fixture(settings(Estimated::None, 1_000));
    pending.source.routed(None, &tokens, &id("quiet"), 0);
    assert!(
        hits(&pending.source, &tokens, false)
            .await
            .engines()
            .is_empty(),
        "estimate: none never estimates an engine without events"
    );
}

#[tokio::test(start_paused = true)]
async fn estimate_all_ignores_the_events_and_nothing_counts_routing_when_off() {
    let tokens = prompt(6);
    let estimate = fixture(settings(Estimated::All, 1_000));
    announce(&estimate.index, "a", &tokens, 6);
    estimate.source.routed(None, &tokens[..8], &id("b"), 0);
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(
        hits(&estimate.source, &tokens, false).await.engines(),
        vec![(id("b"), 2)]
    );

    let off = fixture(settings(Estimated::None, 0));
    announce(&off.index, "a", &tokens, 6);
    off.source.routed(None, &tokens, &id("b"), 0);
    assert!(off.source.routed_pages().is_empty());
    assert_eq!(
        hits(&off.source, &tokens, false).await.engines(),
        vec![(id("a"), 6)]
    );
}

#[tokio::test(start_paused = true)]
async fn namespaces_keep_routed_pages_apart() {
    let f = fixture(settings(Estimated::Auto, 1_000));
    let tokens = prompt(4);
    f.source.routed(Some("lora-1"), &tokens, &id("a"), 0);
    assert!(hits(&f.source, &tokens, false).await.engines().is_empty());
    let Ok(CacheLookup::Answered(found)) = f.source.lookup(Some("lora-1"), &tokens, false).await
    else {
        panic!("expected an answer");
    };
    assert_eq!(found.engines(), vec![(id("a"), 4)]);
}

#[tokio::test(start_paused = true)]
async fn an_engines_reported_cache_size_bounds_its_estimate() {
    let f = fixture(settings(Estimated::Auto, 1_000));
    f.load.register(&id("quiet"), NonZeroU32::MIN);
    // Room for 3 pages of 4 tokens.
    f.load
        .ingest(
            &id("quiet"),
            0,
            basic_report(0, 0, 0, 12),
            tokio::time::Instant::now(),
        )
        .unwrap();
    let tokens = prompt(6);
    f.source.routed(None, &tokens, &id("quiet"), 0);
    assert_eq!(f.source.routed_pages().pages_of(&id("quiet")), 3);
    assert_eq!(
        hits(&f.source, &tokens, false).await.engines(),
        vec![(id("quiet"), 3)]
    );
}

#[test]
fn settings_out_of_bounds_are_named() {
    let bad = RoutedPagesSettings {
        pending_ms: 60_001,
        max_age_ms: u64::MAX,
        capacity_tokens: 0,
        max_pages: 0,
        ..RoutedPagesSettings::default()
    };
    let fields: Vec<&str> = bad.problems().into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        vec!["pending_ms", "max_age_ms", "capacity_tokens", "max_pages"]
    );
    assert!(RoutedPagesSettings::default().problems().is_empty());
}

#[test]
fn a_shared_indexer_counts_routing_only_for_pending_pages_or_an_estimate_of_all() {
    let counts = |estimate, pending_ms, knows_publishers| {
        RoutedPagesSettings {
            estimate,
            pending_ms,
            ..RoutedPagesSettings::default()
        }
        .counts_routing(knows_publishers)
    };
    assert!(
        counts(Estimated::Auto, 0, true),
        "the local index names silent engines"
    );
    assert!(
        !counts(Estimated::Auto, 0, false),
        "a shared indexer's engines all publish"
    );
    assert!(counts(Estimated::All, 0, false));
    assert!(counts(Estimated::None, 1, false));
    assert!(!counts(Estimated::None, 0, true));
}

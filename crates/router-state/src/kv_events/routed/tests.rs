use std::time::Duration;

use super::{RoutedPages, RoutedPagesConfig};
use crate::engine::EngineId;

fn id(name: &str) -> EngineId {
    EngineId::new(name)
}

fn table(pages_per_engine: usize, max_pages: usize, max_engines: usize) -> RoutedPages {
    RoutedPages::new(RoutedPagesConfig {
        pages_per_engine,
        max_pages,
        max_engines,
    })
}

const LONG: Duration = Duration::from_secs(3600);

fn always(_: &EngineId) -> Option<Duration> {
    Some(LONG)
}

#[tokio::test(start_paused = true)]
async fn a_routed_prompt_carries_its_engine_as_deep_as_the_chain_matches() {
    let pages = table(100, 1000, 10);
    pages.record(&id("a"), &[1, 2, 3, 4], None, LONG);
    pages.record(&id("b"), &[1, 2, 9], None, LONG);
    assert_eq!(
        pages.extend(&[1, 2, 3, 5], &[], always),
        vec![(id("a"), 3), (id("b"), 2)]
    );
    assert!(
        pages.extend(&[7, 2, 3], &[], always).is_empty(),
        "a chain is matched from its first page"
    );
    // An engine known to hold two pages already continues from there.
    assert_eq!(
        pages.extend(&[1, 2, 9, 10], &[(id("b"), 2), (id("c"), 3)], always),
        vec![(id("a"), 2), (id("b"), 3)],
        "b continues on its own mark of page 9; c has no marks and adds nothing"
    );
    assert_eq!(pages.len(), 7);
}

#[tokio::test(start_paused = true)]
async fn marks_count_by_the_readers_age_rule() {
    let pages = table(100, 1000, 10);
    pages.record(&id("a"), &[1, 2], None, LONG);
    tokio::time::advance(Duration::from_millis(1500)).await;
    pages.record(&id("b"), &[1, 2], None, LONG);
    let young = |_: &EngineId| Some(Duration::from_secs(1));
    assert_eq!(pages.extend(&[1, 2], &[], young), vec![(id("b"), 2)]);
    let only_a = |e: &EngineId| (e == &id("a")).then_some(LONG);
    assert_eq!(pages.extend(&[1, 2], &[], only_a), vec![(id("a"), 2)]);
    let nothing = |_: &EngineId| Some(Duration::ZERO);
    assert!(pages.extend(&[1, 2], &[], nothing).is_empty());
}

#[tokio::test(start_paused = true)]
async fn confirmed_pages_stop_counting_and_the_rest_stay_pending() {
    let pages = table(100, 1000, 10);
    pages.record(&id("a"), &[1, 2, 3, 4], None, LONG);
    pages.confirm(&id("a"), &[1, 2]);
    assert_eq!(pages.pages_of(&id("a")), 2);
    assert!(
        pages.extend(&[1, 2, 3, 4], &[], always).is_empty(),
        "without the confirmed pages the chain breaks at its start"
    );
    assert_eq!(
        pages.extend(&[1, 2, 3, 4], &[(id("a"), 2)], always),
        vec![(id("a"), 4)],
        "from the depth the events show, the pending pages carry on"
    );
    pages.confirm(&id("z"), &[1]);
    assert_eq!(pages.len(), 2, "an unknown engine confirms nothing");
    pages.confirm(&id("a"), &[1, 2, 3, 9]);
    assert_eq!(
        pages.pages_of(&id("a")),
        2,
        "no mark on the last page: nothing to drop"
    );
    pages.record(&id("a"), &[1], None, LONG);
    pages.confirm(&id("a"), &[1, 2, 3]);
    assert_eq!(
        pages.pages_of(&id("a")),
        2,
        "back from page 3 to the first page without a mark: 2 stops it, 1 stays"
    );
}

#[tokio::test(start_paused = true)]
async fn an_engine_keeps_its_capacity_newest_first() {
    let pages = table(3, 1000, 10);
    pages.record(&id("a"), &[1, 2], None, LONG);
    tokio::time::advance(Duration::from_millis(5)).await;
    pages.record(&id("a"), &[10, 11], None, LONG);
    assert_eq!(pages.pages_of(&id("a")), 3);
    assert!(
        pages.extend(&[1], &[], always).is_empty(),
        "the oldest page went"
    );
    assert_eq!(pages.extend(&[2], &[], always), vec![(id("a"), 1)]);
    // A capacity the caller names (from the engine's report) overrides the default.
    pages.record(&id("b"), &[20, 21, 22, 23, 24], Some(5), LONG);
    assert_eq!(pages.pages_of(&id("b")), 5);
    // A prompt longer than the share keeps its leading pages.
    pages.record(&id("c"), &[30, 31, 32, 33, 34], None, LONG);
    assert_eq!(
        pages.extend(&[30, 31, 32, 33], &[], always),
        vec![(id("c"), 3)]
    );
}

#[tokio::test(start_paused = true)]
async fn routing_a_page_again_makes_it_the_newest() {
    let pages = table(2, 1000, 10);
    pages.record(&id("a"), &[1], None, LONG);
    tokio::time::advance(Duration::from_millis(1)).await;
    pages.record(&id("a"), &[2], None, LONG);
    tokio::time::advance(Duration::from_millis(1)).await;
    pages.record(&id("a"), &[1], None, LONG);
    tokio::time::advance(Duration::from_millis(1)).await;
    pages.record(&id("a"), &[3], None, LONG);
    assert_eq!(pages.extend(&[1], &[], always), vec![(id("a"), 1)]);
    assert!(pages.extend(&[2], &[], always).is_empty());
}

#[tokio::test(start_paused = true)]
async fn old_marks_go_when_the_engine_is_routed_again() {
    let pages = table(100, 1000, 10);
    pages.record(&id("a"), &[1, 2], None, Duration::from_secs(10));
    tokio::time::advance(Duration::from_secs(11)).await;
    pages.record(&id("a"), &[5], None, Duration::from_secs(10));
    assert_eq!(pages.pages_of(&id("a")), 1);
}

#[tokio::test(start_paused = true)]
async fn the_total_bound_takes_from_the_fullest_engine() {
    let pages = table(100, 5, 10);
    pages.record(&id("a"), &[1, 2, 3, 4], None, LONG);
    pages.record(&id("b"), &[10, 11], None, LONG);
    assert_eq!(pages.len(), 5);
    assert_eq!(pages.pages_of(&id("a")), 3);
    assert_eq!(pages.pages_of(&id("b")), 2);
    assert!(pages.extend(&[1], &[], always).is_empty());
}

#[tokio::test(start_paused = true)]
async fn engines_past_the_bound_forget_the_stalest() {
    let pages = table(100, 1000, 2);
    pages.record(&id("a"), &[1], None, LONG);
    tokio::time::advance(Duration::from_millis(1)).await;
    pages.record(&id("b"), &[1], None, LONG);
    tokio::time::advance(Duration::from_millis(1)).await;
    pages.record(&id("c"), &[1], None, LONG);
    assert_eq!(
        pages.extend(&[1], &[], always),
        vec![(id("b"), 1), (id("c"), 1)]
    );
    assert_eq!(pages.len(), 2);
    pages.forget(&id("b"));
    assert_eq!(pages.extend(&[1], &[], always), vec![(id("c"), 1)]);
    assert_eq!(pages.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_burst_within_one_millisecond_keeps_the_order_bounded() {
    let pages = table(1000, 100_000, 10);
    let chain: Vec<u64> = (0..128).collect();
    for _ in 0..1000 {
        pages.record(&id("a"), &chain, None, LONG);
    }
    {
        let inner = pages.inner.lock();
        let slot = inner.slots[&id("a")];
        assert_eq!(inner.marks(slot).live, 128);
        assert_eq!(
            inner.marks(slot).order.len(),
            128,
            "one entry per page routed"
        );
    }
    // Routed again later, each page leaves a stale entry; compaction bounds them.
    for step in 0..1000 {
        tokio::time::advance(Duration::from_millis(1)).await;
        pages.record(&id("a"), &chain[..(step % 128) + 1], None, LONG);
    }
    let inner = pages.inner.lock();
    let marks = inner.marks(inner.slots[&id("a")]);
    assert_eq!(marks.live, 128);
    assert!(marks.order.len() <= 2 * 128 + 64, "{}", marks.order.len());
}

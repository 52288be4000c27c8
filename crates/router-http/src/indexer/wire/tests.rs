use super::*;

fn hits() -> PrefixHits {
    PrefixHits {
        query_blocks: 8,
        block_size: 16,
        engines: vec![("a".into(), 8), ("b".into(), 4)],
        ranks: vec![("a".into(), 1), ("b".into(), 0)],
        slower_blocks: vec![("b".into(), 3)],
        feed_age_ms: vec![("a".into(), 2500)],
    }
}

#[test]
fn tiers_and_feed_ages_cross_the_wire() {
    let json = serde_json::to_string(&Answer::from(hits())).unwrap();
    let answer: Answer = serde_json::from_str(&json).unwrap();
    assert_eq!(answer.into_hits().unwrap(), hits());
}

#[test]
fn an_answer_without_tiers_or_ages_means_device_copies_from_fresh_feeds() {
    let json = r#"{"query_blocks": 8, "block_size": 16, "engines": [["a", 8]], "ranks": []}"#;
    let hits = serde_json::from_str::<Answer>(json)
        .unwrap()
        .into_hits()
        .unwrap();
    assert_eq!(hits.slower_tokens(&"a".into(), 128), 0);
    assert_eq!(hits.feed_age_ms_of(&"a".into()), 0);
}

#[test]
fn slower_blocks_beyond_an_engines_match_are_refused() {
    let mut answer = Answer::from(hits());
    answer.slower_blocks = vec![("b".into(), 5)];
    assert_eq!(
        answer.into_hits().unwrap_err(),
        "an engine holding more blocks on slower tiers than in all"
    );
    let mut answer = Answer::from(hits());
    answer.feed_age_ms = vec![("b".into(), 1), ("a".into(), 1)];
    assert_eq!(
        answer.into_hits().unwrap_err(),
        "engine ids that are not sorted, unique names"
    );
}

#[test]
fn fields_a_router_does_not_know_are_ignored() {
    let json = r#"{"query_blocks": 8, "block_size": 16, "engines": [["a", 8]], "ranks": [],
                   "a_later_field": [1, 2]}"#;
    let hits = serde_json::from_str::<Answer>(json)
        .unwrap()
        .into_hits()
        .unwrap();
    assert_eq!(hits.blocks_of(&"a".into()), 8);
}

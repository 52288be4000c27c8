use router_state::EngineReportedLoadTable;

use super::*;

fn cached(engine: &str, tokens: u64, slower_tokens: u64, feed_age_ms: u64) -> Observation {
    Observation::CachedTokens {
        bucket: "b".into(),
        stage: Role::Plain,
        engine: EngineId::from(engine),
        tokens,
        slower_tokens,
        feed_age_ms,
    }
}

#[test]
fn a_candidates_slower_tier_tokens_and_feed_age_show_when_not_zero() {
    let seen = [
        Observation::Candidates {
            bucket: "b".into(),
            stage: Role::Plain,
            engines: vec![
                EngineId::from("A"),
                EngineId::from("B"),
                EngineId::from("C"),
            ],
        },
        cached("A", 2048, 0, 0),
        cached("B", 4096, 1024, 2500),
    ];
    let load = EngineReportedLoadTable::default().snapshot();
    let stage = explain_stage("b", Role::Plain, &seen, &load).expect("the stage was reached");
    let candidates = stage["candidates"].as_array().unwrap();
    let fields = |i: usize| {
        let c = &candidates[i];
        (
            c["matched_prefix_tokens"].as_u64(),
            c.get("matched_on_slower_tiers").and_then(Value::as_u64),
            c.get("kv_feed_age_ms").and_then(Value::as_u64),
        )
    };
    assert_eq!(fields(0), (Some(2048), None, None), "a fresh device copy");
    assert_eq!(fields(1), (Some(4096), Some(1024), Some(2500)));
    assert_eq!(fields(2), (None, None, None), "no match");
}

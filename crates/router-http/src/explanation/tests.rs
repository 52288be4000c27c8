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

fn admitted(engine: &str) -> Observation {
    Observation::Admission {
        bucket: "b".into(),
        stage: Role::Plain,
        engine: EngineId::from(engine),
        metrics: router_state::EngineMetrics::default(),
        caps: None,
        rejected: None,
    }
}

/// The stage's candidates `E0000`, `E0001`, ... `n` of them.
fn candidates(n: usize) -> Observation {
    Observation::Candidates {
        bucket: "b".into(),
        stage: Role::Plain,
        engines: (0..n).map(|i| EngineId::from(format!("E{i:04}"))).collect(),
    }
}

/// The engines an explained stage lists, in order.
fn listed_engines(stage: &Value) -> Vec<&str> {
    stage["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["engine"].as_str().unwrap())
        .collect()
}

#[test]
fn a_stage_of_many_candidates_lists_a_bounded_number_those_looked_at_first() {
    let mut seen = vec![candidates(1024)];
    seen.push(cached("E0900", 512, 0, 0));
    seen.push(admitted("E1000"));
    let load = EngineReportedLoadTable::default().snapshot();
    let stage = explain_stage("b", Role::Plain, &seen, &load).expect("the stage was reached");
    let listed = listed_engines(&stage);
    assert_eq!(listed.len(), MAX_LISTED_CANDIDATES);
    assert_eq!(stage["candidates_omitted"], 1024 - MAX_LISTED_CANDIDATES);
    assert!(
        listed.contains(&"E0900") && listed.contains(&"E1000"),
        "looked at: listed"
    );
    assert_eq!(listed[0], "E0000", "the others fill in, in order");
    assert_eq!(
        listed[MAX_LISTED_CANDIDATES - 1],
        "E1000",
        "candidates keep their order"
    );
    assert!(listed.windows(2).all(|w| w[0] < w[1]));
}

// More engines looked at than the bound (a prefix every engine holds): the picked one
// is listed all the same.
#[test]
fn the_picked_engine_is_listed_however_many_were_looked_at() {
    let mut seen = vec![candidates(200)];
    for i in 0..200 {
        seen.push(cached(&format!("E{i:04}"), 64, 0, 0));
    }
    seen.push(Observation::Picked {
        bucket: "b".into(),
        stage: Role::Plain,
        engine: EngineId::from("E0150"),
        reason: router_policy::PickReason::CacheHit,
        predicted_cached_tokens: Some(64),
    });
    let load = EngineReportedLoadTable::default().snapshot();
    let stage = explain_stage("b", Role::Plain, &seen, &load).unwrap();
    let listed = listed_engines(&stage);
    assert_eq!(listed.len(), MAX_LISTED_CANDIDATES);
    assert!(listed.contains(&"E0150"), "the pick is listed");
    assert_eq!(stage["pick"]["engine"], "E0150");
}

#[test]
fn a_stage_within_the_bound_lists_every_candidate_and_omits_nothing() {
    let seen = [Observation::Candidates {
        bucket: "b".into(),
        stage: Role::Plain,
        engines: vec![EngineId::from("A"), EngineId::from("B")],
    }];
    let load = EngineReportedLoadTable::default().snapshot();
    let stage = explain_stage("b", Role::Plain, &seen, &load).unwrap();
    assert_eq!(stage["candidates"].as_array().unwrap().len(), 2);
    assert!(stage.get("candidates_omitted").is_none());
}

//! Explained picks: every policy names the engine and reason the next real pick in
//! the same state gets, changes nothing doing so (no rotation, no random draw, no
//! binding), and records the admission checks it made.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{engines, report_native, runtime, table};
use router_policy::{
    AffinityBackend, Explanation, LimitExceeded, LocalCacheSource, Observation, Pick, PickReason,
    PickRequest, Policy, PolicyConfig, PolicyHandles, RequestFacts,
};
use router_state::affinity::{AffinityConfig, AffinityScope, LocalAffinityStore};
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::{Engine, EngineReportedLoadTable, Role};

fn build(
    json: &str,
    load: &Arc<EngineReportedLoadTable>,
    store: &Arc<LocalAffinityStore>,
) -> Arc<dyn Policy> {
    let config: PolicyConfig = serde_json::from_str(json).expect("a policy");
    let index = Arc::new(PrefixIndex::new(IndexConfig::default()));
    let handles = PolicyHandles::new(Arc::clone(load))
        .with_affinity(Some(AffinityBackend::Store(Arc::clone(store) as _)))
        .with_prefix_source(Some(Arc::new(LocalCacheSource::new(index))));
    config.build(Role::Plain, &handles).expect("built")
}

type Outcome = (String, PickReason, Option<u64>);

fn pick(policy: &dyn Policy, engines: &[Arc<Engine>], request: &PickRequest<'_>) -> Outcome {
    let pick = runtime()
        .block_on(policy.pick(engines, request))
        .expect("a pick");
    (
        pick.engine.id().to_string(),
        pick.reason,
        pick.predicted_cached_tokens,
    )
}

const POLICIES: &[&str] = &[
    r#"{"type": "round_robin"}"#,
    r#"{"type": "random", "seed": 1}"#,
    r#"{"type": "power_of_two", "seed": 2}"#,
    r#"{"type": "load_based"}"#,
    r#"{"type": "cache_aware", "seed": 3, "min_load_choices": 2}"#,
    r#"{"type": "session_aware", "seed": 4}"#,
    r#"{"type": "sticky", "fallback": "random", "seed": 5}"#,
];

#[test]
fn every_policys_explained_pick_is_the_next_real_pick_and_changes_nothing() {
    let tokens: Vec<u32> = (0..100).collect();
    // 100 candidates: past the windows of `load_based` and `cache_aware`.
    for (json, size) in POLICIES.iter().flat_map(|json| [(json, 6), (json, 100)]) {
        let engines = engines(size);
        let load = table(&engines);
        // Ties (equal loads) leave some picks to rotors and random draws.
        for (i, engine) in engines.iter().enumerate() {
            report_native(&load, engine, i as u64 % 2, 1);
        }
        let store = Arc::new(LocalAffinityStore::new(AffinityConfig::default()));
        let policy = build(json, &load, &store);
        for round in 0..24 {
            let key = format!("k{}", round % 4);
            let request = PickRequest::new(
                RequestFacts::new("m", 100)
                    .with_token_ids(Some(&tokens))
                    .with_session_key(Some(&key))
                    .with_routing_key(Some(&key)),
                Role::Plain,
                "b",
            );
            let explanation = Explanation::dry_run();
            let explained = PickRequest::new(
                request.facts.with_explanation(Some(&explanation)),
                request.stage,
                request.bucket_id,
            );
            let first = pick(policy.as_ref(), &engines, &explained);
            let second = pick(policy.as_ref(), &engines, &explained);
            assert_eq!(
                first, second,
                "{json} at {size} round {round}: explaining changed state"
            );
            let real = pick(policy.as_ref(), &engines, &request);
            assert_eq!(
                real, first,
                "{json} at {size} round {round}: the real pick is the explained one"
            );
            assert!(
                explanation.observations().iter().any(|o| matches!(
                    o,
                    Observation::Admission { engine, rejected: None, .. } if engine.as_str() == first.0
                )),
                "{json} at {size} round {round}: the admission of the pick is recorded"
            );
        }
    }
}

#[test]
fn an_explained_session_pick_binds_nothing() {
    let engines = engines(4);
    let load = table(&engines);
    let store = Arc::new(LocalAffinityStore::new(AffinityConfig::default()));
    let policy = build(r#"{"type": "session_aware", "seed": 9}"#, &load, &store);
    let request = PickRequest::new(
        RequestFacts::new("m", 100).with_session_key(Some("s")),
        Role::Plain,
        "b",
    );
    let explanation = Explanation::dry_run();
    let explained = pick(
        policy.as_ref(),
        &engines,
        &PickRequest::new(
            request.facts.with_explanation(Some(&explanation)),
            request.stage,
            request.bucket_id,
        ),
    );
    assert_eq!(explained.1, PickReason::AffinityAssigned);
    let scope = AffinityScope {
        model: "m",
        bucket: "b",
        stage: Role::Plain,
    };
    assert_eq!(store.get(scope, "s").unwrap(), None, "nothing was bound");
    assert_eq!(pick(policy.as_ref(), &engines, &request), explained);
    assert_eq!(
        store.get(scope, "s").unwrap().map(|e| e.to_string()),
        Some(explained.0.clone()),
        "the real pick binds the explained engine"
    );
    assert_eq!(
        pick(policy.as_ref(), &engines, &request),
        (explained.0, PickReason::AffinityBound, None)
    );
}

/// An admission check: engine, running requests read, verdict, running cap.
type Checked = (String, Option<u64>, Option<LimitExceeded>, Option<u64>);

#[test]
fn rejections_are_recorded_with_the_cap_and_the_figures_read() {
    let engines = engines(3);
    let load = table(&engines);
    let store = Arc::new(LocalAffinityStore::new(AffinityConfig::default()));
    let policy = build(
        r#"{"type": "round_robin", "admission": {"max_running_requests": 4}}"#,
        &load,
        &store,
    );
    report_native(&load, &engines[0], 0, 5);
    report_native(&load, &engines[1], 0, 1);
    let explanation = Explanation::dry_run();
    let request = PickRequest::new(
        RequestFacts::new("m", 100).with_explanation(Some(&explanation)),
        Role::Plain,
        "b",
    );
    let (engine, reason, _) = pick(policy.as_ref(), &engines, &request);
    assert_eq!((engine.as_str(), reason), ("e1", PickReason::NextAdmitted));
    let admissions: Vec<Checked> = explanation
        .observations()
        .into_iter()
        .filter_map(|o| match o {
            Observation::Admission {
                engine,
                metrics,
                caps,
                rejected,
                ..
            } => Some((
                engine.to_string(),
                metrics.running_requests,
                rejected,
                caps.and_then(|c| c.max_running_requests),
            )),
            _ => None,
        })
        .collect();
    let exceeded = LimitExceeded {
        limit: "max_running_requests",
        observed: 5,
        cap: 4,
    };
    assert_eq!(
        admissions,
        vec![
            ("e0".into(), Some(5), Some(exceeded), Some(4)),
            ("e1".into(), Some(1), None, Some(4)),
        ]
    );
}

#[test]
fn a_recorded_pick_is_made_as_usual_and_recorded() {
    let engines = engines(4);
    let load = table(&engines);
    let store = Arc::new(LocalAffinityStore::new(AffinityConfig::default()));
    let policy = build(r#"{"type": "session_aware", "seed": 9}"#, &load, &store);
    let recording = Explanation::recording();
    let request = PickRequest::new(
        RequestFacts::new("m", 100)
            .with_session_key(Some("s"))
            .with_explanation(Some(&recording)),
        Role::Plain,
        "b",
    );
    assert!(!request.is_dry_run());
    let (engine, reason, _) = pick(policy.as_ref(), &engines, &request);
    assert_eq!(reason, PickReason::AffinityAssigned);
    let scope = AffinityScope {
        model: "m",
        bucket: "b",
        stage: Role::Plain,
    };
    assert_eq!(
        store.get(scope, "s").unwrap().map(|e| e.to_string()),
        Some(engine.clone()),
        "a recorded pick binds"
    );
    assert!(recording.observations().iter().any(|o| matches!(
        o,
        Observation::Admission { engine: e, rejected: None, .. } if e.as_str() == engine
    )));
}

#[tokio::test(start_paused = true)]
async fn an_explanation_does_not_keep_a_binding_alive() {
    let engines = engines(4);
    let load = table(&engines);
    let store = Arc::new(LocalAffinityStore::new(AffinityConfig {
        idle_timeout: Duration::from_secs(10),
        ..AffinityConfig::default()
    }));
    let policy = build(r#"{"type": "session_aware", "seed": 9}"#, &load, &store);
    let request = PickRequest::new(
        RequestFacts::new("m", 100).with_session_key(Some("s")),
        Role::Plain,
        "b",
    );
    let explanation = Explanation::dry_run();
    let explained = PickRequest::new(
        request.facts.with_explanation(Some(&explanation)),
        request.stage,
        request.bucket_id,
    );
    let reason = |pick: Result<Pick, _>| pick.expect("a pick").reason;
    assert_eq!(
        reason(policy.pick(&engines, &request).await),
        PickReason::AffinityAssigned
    );
    tokio::time::advance(Duration::from_secs(8)).await;
    assert_eq!(
        reason(policy.pick(&engines, &explained).await),
        PickReason::AffinityBound
    );
    // Idle 12 s since its last real use: expired, however recently it was explained.
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(
        reason(policy.pick(&engines, &explained).await),
        PickReason::AffinityAssigned
    );
}

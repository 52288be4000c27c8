//! PD buckets pick only prefill and decode engines that can hand a request's KV cache
//! over, and pass over a bucket whose engines cannot pair, naming why.

use crate::common;

use std::sync::Arc;

use common::*;
use router_buckets::{BucketResolver, EngineGroup, SelectError};
use router_policy::{Explanation, Observation, PickError, RequestFacts, Unpaired};
use router_state::{Engine, EngineRegistry, EngineReportedLoadTable, PdMismatch, PdProfile, Role};

/// Engines of model `m` with their role and page size.
fn fleet(engines: &[(&str, Role, u32)]) -> EngineRegistry {
    let registry = EngineRegistry::new();
    for (id, role, page_size) in engines {
        let profile = PdProfile {
            page_size: Some(*page_size),
            ..PdProfile::default()
        };
        let engine = Engine::new(*id, format!("http://{id}.test"), "m", *role);
        registry.add(engine.with_pd_profile(profile)).unwrap();
    }
    registry
}

/// One catch-all PD bucket `id` of round-robin groups.
fn catch_all(id: &str, load: &Arc<EngineReportedLoadTable>) -> router_buckets::Bucket {
    pd_bucket(
        id,
        None,
        EngineGroup::new(capped(load, None)),
        EngineGroup::new(capped(load, None)),
    )
}

fn pair_of(selection: &router_buckets::Selection) -> (String, String) {
    let ids: Vec<String> = selection
        .pick
        .engines
        .iter()
        .map(|p| p.engine.id().to_string())
        .collect();
    (ids[0].clone(), ids[1].clone())
}

#[test]
fn a_decode_engine_of_another_page_size_is_never_picked() {
    let rt = runtime();
    let snapshot = fleet(&[
        ("P1", Role::Prefill, 16),
        ("D1", Role::Decode, 32),
        ("D2", Role::Decode, 16),
    ])
    .snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let resolver = BucketResolver::new(vec![catch_all("all", &load)]).unwrap();
    for _ in 0..4 {
        let selection = rt
            .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 10)))
            .unwrap();
        assert_eq!(pair_of(&selection), ("P1".into(), "D2".into()));
        assert!(selection.passed_over.is_empty());
    }
}

#[test]
fn a_prefill_engine_no_decode_engine_can_pair_with_is_never_picked() {
    let rt = runtime();
    let snapshot = fleet(&[
        ("P1", Role::Prefill, 16),
        ("P2", Role::Prefill, 32),
        ("D1", Role::Decode, 32),
    ])
    .snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let resolver = BucketResolver::new(vec![catch_all("all", &load)]).unwrap();
    for _ in 0..4 {
        let selection = rt
            .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 10)))
            .unwrap();
        assert_eq!(pair_of(&selection), ("P2".into(), "D1".into()));
    }
}

#[test]
fn a_bucket_whose_engines_cannot_pair_is_passed_over_naming_the_field_and_both_values() {
    let rt = runtime();
    let snapshot = fleet(&[
        ("P1", Role::Prefill, 16),
        ("D1", Role::Decode, 32),
        ("P2", Role::Prefill, 64),
        ("D2", Role::Decode, 64),
    ])
    .snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let bucket = |id: &str, prefill: &str, decode: &str| {
        pd_bucket(
            id,
            None,
            members(capped(&load, None), &[prefill]),
            members(capped(&load, None), &[decode]),
        )
    };
    let unpaired = PickError::NoCompatiblePair {
        unpaired: vec![Unpaired {
            prefill: "P1".into(),
            decode: "D1".into(),
            mismatch: PdMismatch::PageSize {
                prefill: 16,
                decode: 32,
            },
        }],
        pairs: 1,
    };

    let resolver =
        BucketResolver::new(vec![bucket("a", "P1", "D1"), bucket("b", "P2", "D2")]).unwrap();
    let selection = rt
        .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 10)))
        .unwrap();
    assert_eq!(&*selection.pick.bucket, "b");
    assert_eq!(pair_of(&selection), ("P2".into(), "D2".into()));
    assert_eq!(selection.passed_over.len(), 1);
    assert_eq!(selection.passed_over[0].error, unpaired);
    assert_eq!(selection.passed_over[0].error.code(), "no_compatible_pair");

    let alone = BucketResolver::new(vec![bucket("a", "P1", "D1")]).unwrap();
    let err = rt
        .block_on(alone.select(&snapshot, &RequestFacts::new("m", 10)))
        .unwrap_err();
    assert_eq!(err.code(), "no_engine_available");
    assert_eq!(err.attempts()[0].error, unpaired);
    assert_eq!(
        err.to_string(),
        "no prefill engine is available: bucket a: no prefill engine can hand its KV cache to \
         a decode engine: prefill P1 and decode D1: page_size 16 (prefill) and 32 (decode) differ"
    );
    assert!(
        matches!(
            &err,
            SelectError::Unavailable {
                stage: Role::Prefill,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn the_pairs_named_are_bounded() {
    let rt = runtime();
    let mut engines = Vec::new();
    let ids: Vec<(String, String)> = (0..10)
        .map(|n| (format!("P{n}"), format!("D{n}")))
        .collect();
    for (p, d) in &ids {
        engines.push((p.as_str(), Role::Prefill, 16));
        engines.push((d.as_str(), Role::Decode, 32));
    }
    let snapshot = fleet(&engines).snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let bucket = catch_all("all", &load);
    let err = rt
        .block_on(bucket.pick_engines(&snapshot, &RequestFacts::new("m", 10)))
        .unwrap_err();
    let PickError::NoCompatiblePair { unpaired, pairs } = &err else {
        panic!("{err:?}")
    };
    assert_eq!((unpaired.len(), *pairs), (8, 100));
    assert!(err.to_string().ends_with("; and 92 more pairs"), "{err}");
}

#[test]
fn an_explanation_names_each_engine_left_out_and_why() {
    let rt = runtime();
    let snapshot = fleet(&[
        ("P1", Role::Prefill, 16),
        ("P2", Role::Prefill, 32),
        ("D1", Role::Decode, 16),
        ("D2", Role::Decode, 64),
    ])
    .snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let bucket = catch_all("all", &load);
    let explanation = Explanation::dry_run();
    let request = RequestFacts::new("m", 10).with_explanation(Some(&explanation));
    rt.block_on(bucket.pick_engines(&snapshot, &request))
        .unwrap();
    let unpaired: Vec<(Role, String, String, &'static str)> = explanation
        .observations()
        .into_iter()
        .filter_map(|o| match o {
            Observation::Unpaired {
                stage,
                engine,
                with,
                mismatch,
                ..
            } => Some((
                stage,
                engine.to_string(),
                with.to_string(),
                mismatch.field(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        unpaired,
        [
            (Role::Prefill, "P2".into(), "D1".into(), "page_size"),
            (Role::Decode, "D2".into(), "P1".into(), "page_size"),
        ]
    );
    let candidates: Vec<(Role, Vec<String>)> = explanation
        .observations()
        .into_iter()
        .filter_map(|o| match o {
            Observation::Candidates { stage, engines, .. } => {
                Some((stage, engines.iter().map(ToString::to_string).collect()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        candidates,
        [
            (Role::Prefill, vec!["P1".to_owned()]),
            (Role::Decode, vec!["D1".to_owned()]),
        ]
    );
}

#[test]
fn a_refusal_for_capacity_names_the_buckets_that_could_not_pair_too() {
    let rt = runtime();
    let snapshot = fleet(&[
        ("P1", Role::Prefill, 16),
        ("D1", Role::Decode, 32),
        ("P2", Role::Prefill, 64),
        ("D2", Role::Decode, 64),
    ])
    .snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let bucket = |id: &str, max: Option<u64>, prefill: &str, decode: &str| {
        pd_bucket(
            id,
            max,
            members(capped(&load, Some(1)), &[prefill]),
            members(capped(&load, Some(1)), &[decode]),
        )
    };
    let resolver = BucketResolver::new(vec![
        bucket("a", Some(100), "P1", "D1"),
        bucket("b", None, "P2", "D2"),
    ])
    .unwrap();
    let _full = load.acquire(&"P2".into());
    let err = rt
        .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 10)))
        .unwrap_err();
    assert_eq!(err.code(), "at_capacity");
    assert_eq!(
        err.to_string(),
        "no engine can take the request now: bucket a: no prefill engine can hand its KV cache \
         to a decode engine: prefill P1 and decode D1: page_size 16 (prefill) and 32 (decode) \
         differ; bucket b: every prefill engine is at capacity: P2: max_inflight_requests (1 >= 1)"
    );
}

//! Engine groups, bucket picks and the bucket loop.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::*;
use proptest::prelude::*;
use router_buckets::{BucketResolver, EngineGroup, EnginePicks, SelectError};
use router_policy::{PickError, PickRequest, RequestFacts};
use router_state::{EngineReportedLoadTable, Health, Role};

fn plain_fleet() -> router_state::EngineRegistry {
    registry(&[
        ("c", Role::Plain),
        ("a", Role::Plain),
        ("b", Role::Plain),
        ("d", Role::Plain),
    ])
}

fn pd_fleet() -> router_state::EngineRegistry {
    registry(&[
        ("P1", Role::Prefill),
        ("P2", Role::Prefill),
        ("D1", Role::Decode),
        ("D2", Role::Decode),
    ])
}

#[test]
fn a_group_offers_healthy_members_of_the_stage_in_id_order() {
    let rt = runtime();
    let fleet = plain_fleet();
    fleet.set_health("b", Health::Unhealthy).unwrap();
    let snapshot = fleet.snapshot();
    let request = PickRequest::new(RequestFacts::new("m", 10), Role::Plain, "bucket");
    let recorder = Arc::new(RecordingPolicy::default());
    let offered = |group: &EngineGroup| {
        rt.block_on(group.pick(&snapshot, &request)).ok();
        recorder.0.lock().unwrap().clone()
    };
    assert_eq!(
        offered(&EngineGroup::new(recorder.clone())),
        ["a", "c", "d"],
        "absent membership = every healthy engine"
    );
    assert_eq!(
        offered(&members(recorder.clone(), &["d", "b", "a"])),
        ["a", "d"],
        "explicit membership, health filtered"
    );
    let decode = PickRequest::new(RequestFacts::new("m", 10), Role::Decode, "bucket");
    let err = rt
        .block_on(EngineGroup::new(recorder.clone()).pick(&snapshot, &decode))
        .unwrap_err();
    assert_eq!(
        err,
        PickError::NoCandidates {
            stage: Role::Decode
        },
        "the role filter applies"
    );
    let other_model = PickRequest::new(RequestFacts::new("other", 10), Role::Plain, "bucket");
    assert!(
        rt.block_on(EngineGroup::new(recorder.clone()).pick(&snapshot, &other_model))
            .is_err()
    );
}

#[test]
fn kept_candidates_follow_every_change_of_the_fleet() {
    // One group asked again and again, as a router's is: the same fleet gives the
    // same kept list; a health change, an engine added and a role's own list each
    // give what filtering afresh does.
    let fleet = plain_fleet();
    let group = members(Arc::new(RecordingPolicy::default()), &["a", "b", "d", "e"]);
    let ids = |snapshot: &router_state::RegistrySnapshot, stage: Role| -> Vec<String> {
        group
            .candidates(snapshot, "m", stage)
            .iter()
            .map(|e| e.id().to_string())
            .collect()
    };
    let before = fleet.snapshot();
    let first = group.candidates(&before, "m", Role::Plain);
    assert!(
        Arc::ptr_eq(&first, &group.candidates(&before, "m", Role::Plain)),
        "kept"
    );
    assert_eq!(ids(&before, Role::Plain), ["a", "b", "d"]);
    assert!(
        ids(&before, Role::Decode).is_empty(),
        "each role its own list"
    );
    fleet.set_health("b", Health::Unhealthy).unwrap();
    assert_eq!(ids(&fleet.snapshot(), Role::Plain), ["a", "d"]);
    fleet
        .add(router_state::Engine::new("e", "http://e", "m", Role::Plain))
        .unwrap();
    assert_eq!(ids(&fleet.snapshot(), Role::Plain), ["a", "d", "e"]);
    fleet.set_health("b", Health::Healthy).unwrap();
    assert_eq!(ids(&fleet.snapshot(), Role::Plain), ["a", "b", "d", "e"]);
    // The first snapshot still gives what it held.
    assert_eq!(ids(&before, Role::Plain), ["a", "b", "d"]);
}

#[test]
fn excluded_engines_are_left_out_of_every_stages_candidates() {
    let rt = runtime();
    let snapshot = plain_fleet().snapshot();
    let recorder = Arc::new(RecordingPolicy::default());
    let excluded = ["a".into(), "d".into()];
    let request = PickRequest::new(
        RequestFacts::new("m", 10).with_excluded(&excluded),
        Role::Plain,
        "bucket",
    );
    rt.block_on(EngineGroup::new(recorder.clone()).pick(&snapshot, &request))
        .unwrap();
    assert_eq!(*recorder.0.lock().unwrap(), ["b", "c"]);
    let only = ["a".into()];
    let err = rt
        .block_on(members(recorder.clone(), &["a"]).pick(
            &snapshot,
            &PickRequest::new(request.facts.with_excluded(&only), Role::Plain, "bucket"),
        ))
        .unwrap_err();
    assert_eq!(
        err,
        PickError::NoCandidates { stage: Role::Plain },
        "a group whose every member is excluded has no candidates"
    );
    let pd = pd_fleet().snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let bucket = pd_bucket(
        "b",
        None,
        EngineGroup::new(capped(&load, None)),
        EngineGroup::new(capped(&load, None)),
    );
    let failed = ["P1".into(), "D1".into()];
    let pick = rt
        .block_on(bucket.pick_engines(&pd, &RequestFacts::new("m", 100).with_excluded(&failed)))
        .unwrap();
    let EnginePicks::Pd { prefill, decode } = &pick.engines else {
        panic!("a PD pick")
    };
    assert_eq!(
        (prefill.engine.id().as_str(), decode.engine.id().as_str()),
        ("P2", "D2"),
        "the bucket passes its exclusions to both stages"
    );
}

#[test]
fn an_empty_membership_has_no_candidates_and_never_calls_the_policy() {
    let rt = runtime();
    let snapshot = plain_fleet().snapshot();
    let counting = Arc::new(CountingPolicy::default());
    let group = EngineGroup::with_members(counting.clone(), []);
    let request = PickRequest::new(RequestFacts::new("m", 10), Role::Plain, "bucket");
    let err = rt.block_on(group.pick(&snapshot, &request)).unwrap_err();
    assert_eq!(err.to_string(), "no plain engine is available");
    assert_eq!(counting.0.load(Ordering::SeqCst), 0);
    let all = EngineGroup::new(counting.clone());
    assert_eq!(
        rt.block_on(all.pick(&snapshot, &request))
            .unwrap()
            .engine
            .id()
            .as_str(),
        "a"
    );
    assert_eq!(counting.0.load(Ordering::SeqCst), 1);
}

#[test]
fn a_pick_with_a_candidates_id_but_another_arc_is_outside_the_candidates() {
    let rt = runtime();
    let snapshot = plain_fleet().snapshot();
    let group = EngineGroup::new(Arc::new(ImpostorPolicy));
    let request = PickRequest::new(RequestFacts::new("m", 10), Role::Plain, "bucket");
    let err = rt.block_on(group.pick(&snapshot, &request)).unwrap_err();
    assert_eq!(
        err,
        PickError::OutsideCandidates {
            stage: Role::Plain,
            engine: "a".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "policy returned engine a, which is not one of its plain candidates"
    );
}

#[test]
fn a_pd_bucket_picks_both_stages_and_a_decode_failure_discards_the_prefill_pick() {
    let rt = runtime();
    let snapshot = pd_fleet().snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let ok = pd_bucket(
        "b",
        None,
        members(capped(&load, None), &["P2"]),
        members(capped(&load, None), &["D1"]),
    );
    let request = RequestFacts::new("m", 100);
    let pick = rt.block_on(ok.pick_engines(&snapshot, &request)).unwrap();
    let EnginePicks::Pd { prefill, decode } = &pick.engines else {
        panic!("a PD pick")
    };
    assert_eq!(
        (prefill.engine.id().as_str(), decode.engine.id().as_str()),
        ("P2", "D1")
    );
    assert_eq!(&*pick.bucket, "b");

    let no_decode = pd_bucket(
        "b",
        None,
        members(capped(&load, None), &["P1"]),
        members(capped(&load, None), &[]),
    );
    let err = rt
        .block_on(no_decode.pick_engines(&snapshot, &request))
        .unwrap_err();
    assert_eq!(
        err,
        PickError::NoCandidates {
            stage: Role::Decode
        },
        "the failure keeps its stage"
    );
    assert_eq!(load.in_flight(&"P1".into()), 0, "selection takes no guards");
}

#[test]
fn a_bucket_of_the_wrong_kind_for_the_model_is_an_invalid_configuration() {
    let rt = runtime();
    let snapshot = plain_fleet().snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let pd = pd_bucket(
        "pairs",
        None,
        EngineGroup::new(capped(&load, None)),
        EngineGroup::new(capped(&load, None)),
    );
    let err = rt
        .block_on(pd.pick_engines(&snapshot, &RequestFacts::new("m", 1)))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid policy configuration: bucket pairs selects prefill/decode engines, but model \"m\" is served by plain engines"
    );
    let resolver = BucketResolver::new(vec![pd]).unwrap();
    let err = rt
        .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 1)))
        .unwrap_err();
    assert!(
        matches!(&err, SelectError::Stopped { bucket: Some(b), .. } if &**b == "pairs"),
        "{err:?}"
    );
    assert_eq!(err.code(), "invalid_configuration");
}

fn short_and_long(load: &Arc<EngineReportedLoadTable>) -> BucketResolver {
    BucketResolver::new(vec![
        pd_bucket(
            "short",
            Some(4096),
            members(capped(load, Some(1)), &["P1"]),
            members(capped(load, Some(1)), &["D1"]),
        ),
        pd_bucket(
            "long",
            None,
            members(capped(load, Some(1)), &["P2"]),
            members(capped(load, Some(1)), &["D2"]),
        ),
    ])
    .unwrap()
}

#[test]
fn admission_rejection_advances_to_the_next_bucket_where_both_stages_are_picked_again() {
    let rt = runtime();
    let snapshot = pd_fleet().snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let resolver = short_and_long(&load);
    let _d1_full = load.acquire(&"D1".into());
    let selection = rt
        .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 100)))
        .unwrap();
    assert_eq!(&*selection.pick.bucket, "long");
    let ids: Vec<_> = selection
        .pick
        .engines
        .iter()
        .map(|p| p.engine.id().as_str())
        .collect();
    assert_eq!(
        ids,
        ["P2", "D2"],
        "the short bucket's prefill pick is not reused"
    );
    assert_eq!(selection.passed_over.len(), 1);
    assert_eq!(
        selection.passed_over[0].to_string(),
        "bucket short: every decode engine is at capacity: D1: max_inflight_requests (1 >= 1)"
    );
}

#[test]
fn exhaustion_reports_every_rejection_or_the_missing_stage() {
    let rt = runtime();
    let snapshot = pd_fleet().snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let resolver = short_and_long(&load);
    let guards: Vec<_> = ["P1", "D2"]
        .iter()
        .map(|id| load.acquire(&(*id).into()))
        .collect();
    let err = rt
        .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 100)))
        .unwrap_err();
    assert_eq!(err.code(), "at_capacity");
    assert_eq!(
        err.to_string(),
        "no engine can take the request now: bucket short: every prefill engine is at capacity: \
         P1: max_inflight_requests (1 >= 1); bucket long: every decode engine is at capacity: \
         D2: max_inflight_requests (1 >= 1)"
    );
    drop(guards);

    let fleet = pd_fleet();
    for id in ["D1", "D2"] {
        fleet.set_health(id, Health::Unhealthy).unwrap();
    }
    let err = rt
        .block_on(resolver.select(&fleet.snapshot(), &RequestFacts::new("m", 100)))
        .unwrap_err();
    assert_eq!(err.to_string(), "no decode engine is available");
    assert!(
        matches!(&err, SelectError::Unavailable { stage: Role::Decode, attempts } if attempts.len() == 2)
    );
}

#[test]
fn no_compatible_bucket_and_invalid_signals_stop_before_any_pick() {
    let rt = runtime();
    let snapshot = pd_fleet().snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let resolver = BucketResolver::new(vec![pd_bucket(
        "short",
        Some(4096),
        EngineGroup::new(capped(&load, None)),
        EngineGroup::new(capped(&load, None)),
    )])
    .unwrap();
    let err = rt
        .block_on(resolver.select(&snapshot, &RequestFacts::new("m", 5000)))
        .unwrap_err();
    assert_eq!(err.code(), "no_matching_bucket");
    assert_eq!(
        err.to_string(),
        "no bucket accepts a request of 5000 input tokens"
    );
    let mut bad = RequestFacts::new("m", 100);
    bad.expected_peak_tokens = Some(50);
    let err = rt.block_on(resolver.select(&snapshot, &bad)).unwrap_err();
    assert!(matches!(
        err,
        SelectError::Stopped {
            bucket: None,
            error: PickError::InvalidSignal { .. }
        }
    ));
}

proptest! {
    #[test]
    fn both_pd_picks_come_from_one_bucket(busy in proptest::collection::vec(any::<bool>(), 6), input in 0u64..3000) {
        let rt = runtime();
        let ids = ["P1", "D1", "P2", "D2", "P3", "D3"];
        let fleet = registry(&ids.map(|id| (id, if id.starts_with('P') { Role::Prefill } else { Role::Decode })));
        let load = Arc::new(EngineReportedLoadTable::default());
        let bucket = |name, max, p, d| pd_bucket(name, max, members(capped(&load, Some(1)), &[p]), members(capped(&load, Some(1)), &[d]));
        let resolver = BucketResolver::new(vec![
            bucket("b1", Some(1000), "P1", "D1"),
            bucket("b2", Some(2000), "P2", "D2"),
            bucket("b3", None, "P3", "D3"),
        ]).unwrap();
        let _guards: Vec<_> = ids.iter().zip(&busy).filter(|(_, b)| **b).map(|(id, _)| load.acquire(&(*id).into())).collect();
        // The buckets the request fits, smallest first; the pick is the first whose
        // prefill and decode engines both have room, and only when none has is the
        // answer at_capacity.
        let fits = [Some(1000), Some(2000), None].map(|max: Option<u64>| max.is_none_or(|m| input <= m));
        let expected = (0..3).find(|&i| fits[i] && !busy[2 * i] && !busy[2 * i + 1]);
        match rt.block_on(resolver.select(&fleet.snapshot(), &RequestFacts::new("m", input))) {
            Ok(selection) => {
                let EnginePicks::Pd { prefill, decode } = &selection.pick.engines else { panic!("PD bucket") };
                let suffix = |id: &str| id[1..].to_owned();
                prop_assert_eq!(suffix(prefill.engine.id().as_str()), suffix(decode.engine.id().as_str()), "both PD picks come from one bucket");
                prop_assert_eq!(format!("b{}", suffix(prefill.engine.id().as_str())), selection.pick.bucket.to_string());
                prop_assert_eq!(Some(selection.pick.bucket.to_string()), expected.map(|i| format!("b{}", i + 1)));
            }
            Err(err) => {
                prop_assert_eq!(err.code(), "at_capacity");
                prop_assert_eq!(expected, None, "a bucket with room was passed over");
            }
        }
    }
}

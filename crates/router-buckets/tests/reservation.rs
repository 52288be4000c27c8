//! Reservations: a group reserves the engine its policy picked, picks again when a
//! concurrent pick took the last slot first, and a dry run reserves nothing.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use router_buckets::{EngineGroup, EnginePicks, RESERVE_TRIES};
use router_policy::{
    AdmissionLimits, BoxFuture, EngineAdmission, Explanation, Pick, PickError, PickReason,
    PickRequest, Policy, Rejection, RequestFacts,
};
use router_state::{Engine, EngineReportedLoadTable, Reservation, Role};

/// Picks the candidates in turn without checking them (as if every check had raced
/// a concurrent pick), reserving against a cap of one.
#[derive(Debug)]
struct Racing {
    load: Arc<EngineReportedLoadTable>,
    picks: AtomicUsize,
}

impl Racing {
    fn new(load: &Arc<EngineReportedLoadTable>) -> Self {
        Self {
            load: Arc::clone(load),
            picks: AtomicUsize::new(0),
        }
    }
}

impl Policy for Racing {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        _: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        let n = self.picks.fetch_add(1, Ordering::SeqCst);
        let engine = Arc::clone(&engines[n % engines.len()]);
        Box::pin(std::future::ready(Ok(Pick::new(
            engine,
            PickReason::RoundRobin,
        ))))
    }

    fn reserve(&self, pick: &Pick) -> Result<Option<Reservation>, Rejection> {
        let cap = AdmissionLimits {
            max_inflight_requests: Some(1),
            ..Default::default()
        };
        cap.reserve(&pick.engine, &self.load)
            .map_err(|exceeded| Rejection {
                engine: pick.engine.id().clone(),
                exceeded,
            })
    }
}

fn two_engines() -> router_state::EngineRegistry {
    registry(&[("a", Role::Plain), ("b", Role::Plain)])
}

#[test]
fn a_pick_whose_slot_was_taken_first_picks_again_and_holds_the_next_engine() {
    let rt = runtime();
    let load = Arc::new(EngineReportedLoadTable::default());
    let policy = Arc::new(Racing::new(&load));
    let group = EngineGroup::new(Arc::clone(&policy) as Arc<dyn Policy>);
    let taken = load.acquire(&"a".into());
    let request = PickRequest::new(RequestFacts::new("m", 10), Role::Plain, "bucket");
    let pick = rt
        .block_on(group.pick(&two_engines().snapshot(), &request))
        .unwrap();
    assert_eq!(pick.engine.id().as_str(), "b");
    assert!(pick.reservation.is_some(), "the pick holds b's slot");
    assert_eq!(load.in_flight(&"b".into()), 1);
    assert_eq!(policy.picks.load(Ordering::SeqCst), 2, "a lost, b won");
    drop(pick);
    assert_eq!(load.in_flight(&"b".into()), 0, "dropping the pick frees it");
    drop(taken);
}

#[test]
fn a_pick_that_keeps_losing_its_slot_fails_with_the_cap_after_a_bounded_number_of_tries() {
    let rt = runtime();
    let load = Arc::new(EngineReportedLoadTable::default());
    let policy = Arc::new(Racing::new(&load));
    let group = EngineGroup::new(Arc::clone(&policy) as Arc<dyn Policy>);
    let held = [load.acquire(&"a".into()), load.acquire(&"b".into())];
    let request = PickRequest::new(RequestFacts::new("m", 10), Role::Plain, "bucket");
    let err = rt
        .block_on(group.pick(&two_engines().snapshot(), &request))
        .unwrap_err();
    let PickError::AdmissionRejected { rejection, .. } = err else {
        panic!("a rejection, not {err:?}")
    };
    assert_eq!(rejection.exceeded.limit, "max_inflight_requests");
    assert_eq!(policy.picks.load(Ordering::SeqCst), RESERVE_TRIES);
    assert_eq!(
        load.in_flight(&"a".into()),
        1,
        "nothing counted for the failed pick"
    );
    drop(held);
}

#[test]
fn a_dry_run_reserves_nothing() {
    let rt = runtime();
    let load = Arc::new(EngineReportedLoadTable::default());
    let group = EngineGroup::new(capped(&load, Some(1)));
    let explanation = Explanation::dry_run();
    let facts = RequestFacts::new("m", 10).with_explanation(Some(&explanation));
    let request = PickRequest::new(facts, Role::Plain, "bucket");
    assert!(request.is_dry_run());
    let pick = rt
        .block_on(group.pick(&two_engines().snapshot(), &request))
        .unwrap();
    assert!(pick.reservation.is_none());
    assert_eq!(load.in_flight(pick.engine.id()), 0);
}

#[test]
fn a_pd_pair_that_finds_no_decode_engine_releases_its_prefill_slot() {
    let rt = runtime();
    let snapshot = registry(&[("P1", Role::Prefill), ("D1", Role::Decode)]).snapshot();
    let load = Arc::new(EngineReportedLoadTable::default());
    let bucket = pd_bucket(
        "b",
        None,
        members(capped(&load, Some(1)), &["P1"]),
        members(capped(&load, Some(1)), &["D1"]),
    );
    let full_decode = load.acquire(&"D1".into());
    let request = RequestFacts::new("m", 100);
    let err = rt
        .block_on(bucket.pick_engines(&snapshot, &request))
        .unwrap_err();
    assert!(
        matches!(
            err,
            PickError::NoAdmissibleEngine {
                stage: Role::Decode,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        load.in_flight(&"P1".into()),
        0,
        "the prefill slot went back"
    );
    drop(full_decode);
    let pick = rt
        .block_on(bucket.pick_engines(&snapshot, &request))
        .unwrap();
    let EnginePicks::Pd { prefill, decode } = &pick.engines else {
        panic!("a PD pick")
    };
    assert!(prefill.reservation.is_some() && decode.reservation.is_some());
    assert_eq!(
        load.in_flight(&"P1".into()) + load.in_flight(&"D1".into()),
        2
    );
}

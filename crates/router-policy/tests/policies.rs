//! Behaviour of each concrete policy.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use router_policy::{
    LEAST_LOAD_WINDOW, LeastLoadPolicy, PickError, PickReason, PowerOfTwoPolicy, RandomPolicy,
    RoundRobinPolicy,
};
use router_state::Role;

#[test]
fn round_robin_rotates_with_a_cursor_per_instance() {
    let rt = runtime();
    let fleet = engines(3);
    let load = table(&fleet);
    let a = RoundRobinPolicy::new(Arc::clone(&load), no_caps());
    let b = RoundRobinPolicy::new(Arc::clone(&load), no_caps());
    let picks: Vec<_> = (0..6)
        .map(|_| pick(&rt, &a, &fleet, Role::Plain).unwrap())
        .collect();
    assert_eq!(ids(&picks), ["e0", "e1", "e2", "e0", "e1", "e2"]);
    assert!(picks.iter().all(|p| p.reason == PickReason::RoundRobin));
    let other = pick(&rt, &b, &fleet, Role::Plain).unwrap();
    assert_eq!(
        other.engine.id().as_str(),
        "e0",
        "a second instance starts its own rotation"
    );
}

#[test]
fn round_robin_skips_rejected_engines_in_rotation_order() {
    let rt = runtime();
    let fleet = engines(3);
    let load = table(&fleet);
    let policy = RoundRobinPolicy::new(Arc::clone(&load), caps(1));
    let _busy = load.acquire(fleet[0].id());
    let first = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        (first.engine.id().as_str(), first.reason),
        ("e1", PickReason::NextAdmitted)
    );
    let second = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        (second.engine.id().as_str(), second.reason),
        ("e1", PickReason::RoundRobin)
    );
}

#[test]
fn random_is_uniform_and_reproducible_with_a_seed() {
    let rt = runtime();
    let fleet = engines(4);
    let load = table(&fleet);
    let policy = RandomPolicy::with_seed(Arc::clone(&load), no_caps(), 5);
    let same = RandomPolicy::with_seed(Arc::clone(&load), no_caps(), 5);
    let mut counts = BTreeMap::new();
    for _ in 0..40_000 {
        let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
        assert_eq!(
            p.engine.id(),
            pick(&rt, &same, &fleet, Role::Plain).unwrap().engine.id()
        );
        *counts.entry(p.engine.id().to_string()).or_insert(0u32) += 1;
    }
    assert_eq!(counts.len(), 4);
    for (id, c) in &counts {
        assert!(
            (9_400..10_600).contains(c),
            "{id} chosen {c} of 40000 times: {counts:?}"
        );
    }
}

#[test]
fn random_redraws_among_admitted_engines_after_a_rejection() {
    let rt = runtime();
    let fleet = engines(4);
    let load = table(&fleet);
    let policy = RandomPolicy::with_seed(Arc::clone(&load), caps(1), 1);
    let _busy: Vec<_> = [0, 2]
        .iter()
        .map(|&i| load.acquire(fleet[i].id()))
        .collect();
    let mut seen = BTreeMap::new();
    for _ in 0..2_000 {
        let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
        *seen.entry(p.engine.id().to_string()).or_insert(0u32) += 1;
    }
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        ["e1", "e3"],
        "only admitted engines"
    );
    assert!(
        seen.values().all(|&c| c > 800),
        "both admitted engines share: {seen:?}"
    );
}

#[test]
fn power_of_two_takes_the_lower_pressure_sample() {
    let rt = runtime();
    let fleet = engines(2);
    let load = table(&fleet);
    report_native(&load, &fleet[0], 5, 10);
    report_native(&load, &fleet[1], 1, 10);
    let policy = PowerOfTwoPolicy::with_seed(Arc::clone(&load), no_caps(), 3);
    for _ in 0..50 {
        let p = pick(&rt, &policy, &fleet, Role::Prefill).unwrap();
        assert_eq!(
            p.engine.id().as_str(),
            "e1",
            "with two candidates both are always sampled"
        );
        assert_eq!(p.reason, PickReason::PowerOfTwoReported);
    }
}

#[test]
fn power_of_two_falls_back_to_local_in_flight_without_native_reports() {
    let rt = runtime();
    let fleet = engines(2);
    let load = table(&fleet);
    report_native(&load, &fleet[0], 0, 0);
    report_basic(&load, &fleet[1], 0, 0);
    let _busy = load.acquire(fleet[0].id());
    let policy = PowerOfTwoPolicy::with_seed(Arc::clone(&load), no_caps(), 3);
    for _ in 0..20 {
        let p = pick(&rt, &policy, &fleet, Role::Decode).unwrap();
        assert_eq!(
            (p.engine.id().as_str(), p.reason),
            ("e1", PickReason::PowerOfTwoLocal)
        );
    }
}

#[test]
fn power_of_two_checks_only_the_chosen_engine_and_never_resamples() {
    let rt = runtime();
    let fleet = engines(2);
    let load = table(&fleet);
    report_native(&load, &fleet[0], 9, 9);
    report_native(&load, &fleet[1], 0, 0);
    let _busy = load.acquire(fleet[1].id());
    let policy = PowerOfTwoPolicy::with_seed(Arc::clone(&load), caps(1), 3);
    for _ in 0..20 {
        let err = pick(&rt, &policy, &fleet, Role::Prefill).unwrap_err();
        let PickError::AdmissionRejected { stage, rejection } = &err else {
            panic!("expected a rejection of the chosen engine, got {err:?}");
        };
        assert_eq!(
            (*stage, rejection.engine.as_str()),
            (Role::Prefill, "e1"),
            "the idle e0 is not tried"
        );
    }
}

#[test]
fn power_of_two_takes_a_single_candidate_directly_but_still_checks_it() {
    let rt = runtime();
    let fleet = engines(1);
    let load = table(&fleet);
    let policy = PowerOfTwoPolicy::with_seed(Arc::clone(&load), caps(2), 3);
    let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(p.reason, PickReason::SingleCandidate);
    let _busy: Vec<_> = (0..2).map(|_| load.acquire(fleet[0].id())).collect();
    let err = pick(&rt, &policy, &fleet, Role::Plain).unwrap_err();
    assert_eq!(
        err.to_string(),
        "plain engine e0: max_inflight_requests (2 >= 2)"
    );
}

#[test]
fn least_load_uses_reported_load_with_dispatch_correction() {
    let rt = runtime();
    let fleet = engines(3);
    let load = table(&fleet);
    report_basic(&load, &fleet[0], 2, 2);
    report_basic(&load, &fleet[1], 1, 1);
    report_basic(&load, &fleet[2], 3, 3);
    let policy = LeastLoadPolicy::new(Arc::clone(&load), no_caps());
    let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        (p.engine.id().as_str(), p.reason),
        ("e1", PickReason::LeastLoadReported)
    );
    let _dispatched: Vec<_> = (0..3).map(|_| load.acquire(fleet[1].id())).collect();
    let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        p.engine.id().as_str(),
        "e0",
        "e1's report plus 3 dispatches since exceeds e0"
    );
}

#[test]
fn least_load_uses_local_in_flight_when_any_candidate_lacks_a_report() {
    let rt = runtime();
    let fleet = engines(3);
    let load = table(&fleet);
    report_basic(&load, &fleet[0], 0, 0);
    report_basic(&load, &fleet[1], 50, 50);
    let _busy = (load.acquire(fleet[0].id()), load.acquire(fleet[2].id()));
    let policy = LeastLoadPolicy::new(Arc::clone(&load), no_caps());
    let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        (p.engine.id().as_str(), p.reason),
        ("e1", PickReason::LeastLoadLocal)
    );
}

#[test]
fn least_load_rotates_between_tied_engines() {
    let rt = runtime();
    let fleet = engines(4);
    let load = table(&fleet);
    let policy = LeastLoadPolicy::new(Arc::clone(&load), no_caps());
    let picks: Vec<_> = (0..8)
        .map(|_| pick(&rt, &policy, &fleet, Role::Plain).unwrap())
        .collect();
    assert_eq!(
        ids(&picks),
        ["e0", "e1", "e2", "e3", "e0", "e1", "e2", "e3"]
    );
}

#[test]
fn least_load_passes_over_a_rejected_engine_in_load_order() {
    let rt = runtime();
    let fleet = engines(3);
    let load = table(&fleet);
    report_basic(&load, &fleet[0], 0, 1);
    report_basic(&load, &fleet[1], 0, 9);
    report_basic(&load, &fleet[2], 0, 5);
    let policy = LeastLoadPolicy::new(Arc::clone(&load), caps(1));
    let _busy = load.acquire(fleet[0].id());
    let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        (p.engine.id().as_str(), p.reason),
        ("e2", PickReason::NextAdmitted)
    );
}

// Of 100 candidates, a pick compares the 32 from its rotating start: the least loaded
// engine (e50) is chosen once the sliding window reaches it, the best of the window
// before.
#[test]
fn least_load_of_many_candidates_compares_a_sliding_window() {
    assert_eq!(LEAST_LOAD_WINDOW, 32);
    let rt = runtime();
    let fleet = engines(100);
    let load = table(&fleet);
    for (i, engine) in fleet.iter().enumerate() {
        let waiting = match i {
            50 => 0,
            5 => 5,
            _ => 10,
        };
        report_basic(&load, engine, waiting, 0);
    }
    let policy = LeastLoadPolicy::new(Arc::clone(&load), no_caps());
    let picks: Vec<_> = (0..60)
        .map(|_| pick(&rt, &policy, &fleet, Role::Plain).unwrap())
        .collect();
    let chosen = ids(&picks);
    assert_eq!(chosen[0], "e05", "e50 is outside the first window");
    assert_eq!(chosen[5], "e05");
    assert_eq!(chosen[6], "e06", "a window of ties takes its first");
    assert_eq!(chosen[18], "e18", "the window starting at e18 ends at e49");
    assert_eq!(chosen[19], "e50", "the window starting at e19 reaches e50");
    assert_eq!(chosen[50], "e50");
    assert_eq!(chosen[51], "e51", "past e50 the ties rotate");
}

// Every engine of the window at its cap: the pick goes on past the window, to the
// first admissible engine after it.
#[test]
fn least_load_goes_past_a_full_window() {
    let rt = runtime();
    let fleet = engines(40);
    let load = table(&fleet);
    let _busy: Vec<_> = fleet[..LEAST_LOAD_WINDOW]
        .iter()
        .map(|e| load.acquire(e.id()))
        .collect();
    let policy = LeastLoadPolicy::new(Arc::clone(&load), caps(1));
    let p = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        (p.engine.id().as_str(), p.reason),
        ("e32", PickReason::NextAdmitted)
    );
}

/// A policy that prefers engine `e2` and otherwise defers to a nested fallback, then
/// checks the fallback's engine against its own, stricter admission.
#[derive(Debug)]
struct PreferE2 {
    fallback: RoundRobinPolicy,
    own: Arc<router_policy::AdmissionLimits>,
    load: Arc<router_state::EngineReportedLoadTable>,
}

impl router_policy::Policy for PreferE2 {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<router_state::Engine>],
        request: &'a router_policy::PickRequest<'a>,
    ) -> router_policy::BoxFuture<'a, Result<router_policy::Pick, PickError>> {
        Box::pin(async move {
            if let Some(e2) = engines.iter().find(|e| e.id().as_str() == "e2") {
                return Ok(router_policy::Pick::new(
                    Arc::clone(e2),
                    PickReason::RoundRobin,
                ));
            }
            let pick = self.fallback.pick(engines, request).await?;
            let metrics = self.load.snapshot().observe(pick.engine.id()).metrics();
            match router_policy::EngineAdmission::check(self.own.as_ref(), &pick.engine, &metrics) {
                Ok(router_policy::AdmissionDecision::Allow) => Ok(pick),
                Ok(router_policy::AdmissionDecision::Reject(exceeded)) => {
                    Err(PickError::AdmissionRejected {
                        stage: request.stage,
                        rejection: router_policy::Rejection {
                            engine: pick.engine.id().clone(),
                            exceeded,
                        },
                    })
                }
                Err(e) => Err(PickError::InvalidSignal {
                    stage: Some(request.stage),
                    message: e.to_string(),
                }),
            }
        })
    }
}

#[test]
fn a_nested_fallback_reads_its_own_state_and_the_owner_checks_its_answer() {
    let rt = runtime();
    let fleet = engines(2);
    let load = table(&fleet);
    let policy = PreferE2 {
        fallback: RoundRobinPolicy::new(Arc::clone(&load), no_caps()),
        own: caps(1),
        load: Arc::clone(&load),
    };
    let first = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        first.engine.id().as_str(),
        "e0",
        "no e2: the fallback's rotation starts at e0"
    );
    let second = pick(&rt, &policy, &fleet, Role::Plain).unwrap();
    assert_eq!(
        second.engine.id().as_str(),
        "e1",
        "the fallback keeps its own cursor"
    );
    let _busy = load.acquire(fleet[0].id());
    let err = pick(&rt, &policy, &fleet, Role::Plain).unwrap_err();
    assert_eq!(
        err.to_string(),
        "plain engine e0: max_inflight_requests (1 >= 1)"
    );
}

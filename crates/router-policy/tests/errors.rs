//! Every `PickError` outcome a policy produces, with its message, code and routing
//! consequence. (`NoMatchingBucket` and `OutsideCandidates` come from the bucket layer
//! and are produced in router-buckets' tests.)

use crate::common;

use std::sync::Arc;

use common::*;
use router_policy::{
    AdmissionDecision, AdmissionError, EngineAdmission, LeastLoadPolicy, PickError, Policy,
    PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy,
};
use router_state::{Engine, EngineMetrics, EngineReportedLoadTable, Role};

fn every_policy(
    load: &Arc<EngineReportedLoadTable>,
    admission: Arc<dyn EngineAdmission>,
) -> Vec<Box<dyn Policy>> {
    vec![
        Box::new(RoundRobinPolicy::new(
            Arc::clone(load),
            Arc::clone(&admission),
        )),
        Box::new(RandomPolicy::with_seed(
            Arc::clone(load),
            Arc::clone(&admission),
            1,
        )),
        Box::new(PowerOfTwoPolicy::with_seed(
            Arc::clone(load),
            Arc::clone(&admission),
            1,
        )),
        Box::new(LeastLoadPolicy::new(Arc::clone(load), admission)),
    ]
}

#[test]
fn no_candidates_names_the_stage_and_advances_to_the_next_bucket() {
    let rt = runtime();
    let load = Arc::new(EngineReportedLoadTable::default());
    for policy in every_policy(&load, no_caps()) {
        let err = pick(&rt, policy.as_ref(), &[], Role::Decode).unwrap_err();
        assert_eq!(
            err,
            PickError::NoCandidates {
                stage: Role::Decode
            },
            "{policy:?}"
        );
        assert_eq!(err.to_string(), "no decode engine is available");
        assert_eq!(
            (err.code(), err.stage()),
            ("no_candidates", Some(Role::Decode))
        );
        assert!(err.advances_to_next_bucket());
    }
}

#[test]
fn no_admissible_engine_lists_every_rejection() {
    let rt = runtime();
    let fleet = staged(Role::Prefill, 2);
    let load = table(&fleet);
    let _busy: Vec<_> = fleet.iter().map(|e| load.acquire(e.id())).collect();
    let exhaustive = every_policy(&load, caps(1));
    for policy in exhaustive
        .iter()
        .filter(|p| !format!("{p:?}").starts_with("PowerOfTwo"))
    {
        let err = pick(&rt, policy.as_ref(), &fleet, Role::Prefill).unwrap_err();
        assert_eq!(err.code(), "no_admissible_engine", "{policy:?}");
        let mut rejected: Vec<_> = err.rejections().iter().map(|r| r.engine.as_str()).collect();
        rejected.sort();
        assert_eq!(rejected, ["e0", "e1"], "{policy:?}");
        assert!(err.advances_to_next_bucket());
    }
    let round_robin = RoundRobinPolicy::new(Arc::clone(&load), caps(1));
    assert_eq!(
        pick(&rt, &round_robin, &fleet, Role::Prefill)
            .unwrap_err()
            .to_string(),
        "every prefill engine is at capacity: e0: max_inflight_requests (1 >= 1), \
         e1: max_inflight_requests (1 >= 1)"
    );
}

#[test]
fn admission_rejected_carries_the_chosen_engine_and_limit() {
    let rt = runtime();
    let fleet = staged(Role::Decode, 2);
    let load = table(&fleet);
    for e in &fleet {
        report_native(&load, e, 0, 5);
    }
    let limits = router_policy::AdmissionLimits {
        max_running_requests: Some(4),
        ..Default::default()
    };
    let policy = PowerOfTwoPolicy::with_seed(Arc::clone(&load), Arc::new(limits), 1);
    let err = pick(&rt, &policy, &fleet, Role::Decode).unwrap_err();
    assert_eq!(err.code(), "admission_rejected");
    assert_eq!(err.rejections().len(), 1);
    let engine = err.rejections()[0].engine.clone();
    assert_eq!(
        err.to_string(),
        format!("decode engine {engine}: max_running_requests (5 >= 4)")
    );
    assert!(err.advances_to_next_bucket());
}

/// An admission check that cannot run, e.g. one that needs a signal it was not given.
#[derive(Debug)]
struct BrokenAdmission;

impl EngineAdmission for BrokenAdmission {
    fn check(&self, _: &Engine, _: &EngineMetrics) -> Result<AdmissionDecision, AdmissionError> {
        Err(AdmissionError("queue-time estimate unavailable".into()))
    }
}

#[test]
fn a_failing_admission_check_is_an_invalid_signal_that_stops_routing() {
    let rt = runtime();
    let fleet = engines(3);
    let load = table(&fleet);
    for policy in every_policy(&load, Arc::new(BrokenAdmission)) {
        let err = pick(&rt, policy.as_ref(), &fleet, Role::Plain).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid routing signal: admission check failed: queue-time estimate unavailable",
            "{policy:?}"
        );
        assert_eq!(
            (err.code(), err.stage()),
            ("invalid_signal", Some(Role::Plain))
        );
        assert!(!err.advances_to_next_bucket());
    }
}

#[test]
fn messages_of_the_outcomes_raised_by_other_layers() {
    let cases = [
        (
            PickError::NoMatchingBucket {
                input_tokens: 9000,
                expected_peak_tokens: Some(12000),
            },
            "no bucket accepts a request of 9000 input tokens with an expected peak of 12000 tokens",
            "no_matching_bucket",
        ),
        (
            PickError::NoMatchingBucket {
                input_tokens: 9000,
                expected_peak_tokens: None,
            },
            "no bucket accepts a request of 9000 input tokens",
            "no_matching_bucket",
        ),
        (
            PickError::InvalidConfiguration {
                stage: None,
                message: "bucket b has no groups".into(),
            },
            "invalid policy configuration: bucket b has no groups",
            "invalid_configuration",
        ),
        (
            PickError::OutsideCandidates {
                stage: Role::Prefill,
                engine: "P9".into(),
            },
            "policy returned engine P9, which is not one of its prefill candidates",
            "outside_candidates",
        ),
    ];
    for (err, message, code) in cases {
        assert_eq!(err.to_string(), message);
        assert_eq!(err.code(), code);
        assert!(!err.advances_to_next_bucket(), "{code} stops routing");
        assert!(err.rejections().is_empty());
    }
}

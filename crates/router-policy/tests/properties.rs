//! Properties every policy keeps, over random fleets, loads and caps.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use router_policy::{
    AdmissionDecision, AdmissionLimits, EngineAdmission, LeastLoadPolicy, PickError, Policy,
    PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy,
};
use router_state::{EngineReportedLoadTable, InflightGuard, Role};

fn all_policies(
    load: &Arc<EngineReportedLoadTable>,
    limits: AdmissionLimits,
    seed: u64,
) -> Vec<Box<dyn Policy>> {
    let admission: Arc<dyn EngineAdmission> = Arc::new(limits);
    vec![
        Box::new(RoundRobinPolicy::new(
            Arc::clone(load),
            Arc::clone(&admission),
        )),
        Box::new(RandomPolicy::with_seed(
            Arc::clone(load),
            Arc::clone(&admission),
            seed,
        )),
        Box::new(PowerOfTwoPolicy::with_seed(
            Arc::clone(load),
            Arc::clone(&admission),
            seed,
        )),
        Box::new(LeastLoadPolicy::new(Arc::clone(load), admission)),
    ]
}

fn stage() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Plain), Just(Role::Prefill), Just(Role::Decode)]
}

/// Per engine: in-flight guards to hold, and an optional (native?, waiting, running) report.
fn engine_state() -> impl Strategy<Value = (usize, Option<(bool, u64, u64)>)> {
    (
        0usize..4,
        proptest::option::of((any::<bool>(), 0u64..8, 0u64..8)),
    )
}

fn limits() -> impl Strategy<Value = AdmissionLimits> {
    (
        proptest::option::of(1u64..8),
        proptest::option::of(1u64..8),
        proptest::option::of(1u64..4),
    )
        .prop_map(|(running, waiting, inflight)| AdmissionLimits {
            max_running_requests: running,
            max_waiting_requests: waiting,
            max_inflight_requests: inflight,
            ..Default::default()
        })
}

proptest! {
    #[test]
    fn picks_come_from_the_candidates_and_pass_admission(
        states in proptest::collection::vec(engine_state(), 1..12),
        limits in limits(),
        stage in stage(),
        seed: u64,
    ) {
        let rt = runtime();
        let fleet = staged(stage, states.len());
        let load = table(&fleet);
        let mut guards: Vec<InflightGuard> = Vec::new();
        for (engine, (in_flight, report)) in fleet.iter().zip(&states) {
            guards.extend((0..*in_flight).map(|_| load.acquire(engine.id())));
            match report {
                Some((true, waiting, running)) => report_native(&load, engine, *waiting, *running),
                Some((false, waiting, running)) => report_basic(&load, engine, *waiting, *running),
                None => {}
            }
        }
        let admitted = |engine: &router_state::Engine| {
            let metrics = load.snapshot().observe(engine.id()).metrics();
            limits.check(engine, &metrics).expect("limits always run") == AdmissionDecision::Allow
        };
        let any_admissible = fleet.iter().any(|e| admitted(e));
        for policy in all_policies(&load, limits, seed) {
            for _ in 0..4 {
                match pick(&rt, policy.as_ref(), &fleet, stage) {
                    Ok(p) => {
                        prop_assert!(
                            fleet.iter().any(|c| Arc::ptr_eq(c, &p.engine)),
                            "every pick belongs to the exact candidate set ({policy:?} returned {})", p.engine.id()
                        );
                        prop_assert!(admitted(&p.engine), "a rejected engine is never returned ({policy:?} returned {})", p.engine.id());
                    }
                    Err(PickError::AdmissionRejected { rejection, .. }) => {
                        prop_assert!(format!("{policy:?}").starts_with("PowerOfTwo"), "only power-of-two stops at its first choice");
                        let engine = fleet.iter().find(|e| *e.id() == rejection.engine).expect("a candidate");
                        prop_assert!(!admitted(engine), "a rejection names an engine admission really rejects");
                    }
                    Err(err) => {
                        prop_assert_eq!(err.code(), "no_admissible_engine");
                        prop_assert!(!any_admissible, "exhaustive policies fail only when no engine is admissible ({policy:?}: {err})");
                    }
                }
            }
        }
        drop(guards);
    }

    #[test]
    fn round_robin_visits_each_candidate_once_per_n_picks(n in 1usize..24, warmup in 0usize..50) {
        let rt = runtime();
        let fleet = engines(n);
        let policy = RoundRobinPolicy::new(table(&fleet), no_caps());
        for _ in 0..warmup {
            pick(&rt, &policy, &fleet, Role::Plain).expect("no caps");
        }
        let window: Vec<_> = (0..n).map(|_| pick(&rt, &policy, &fleet, Role::Plain).expect("no caps")).collect();
        let visited: BTreeSet<_> = window.iter().map(|p| p.engine.id().clone()).collect();
        prop_assert_eq!(visited.len(), n, "round-robin visits each of {} candidates once per {} picks", n, n);
    }

    #[test]
    fn power_of_two_never_samples_one_engine_twice(n in 2usize..40, worst in any::<prop::sample::Index>(), seed: u64) {
        let rt = runtime();
        let fleet = engines(n);
        let load = table(&fleet);
        let worst = worst.index(n);
        let _busy = load.acquire(fleet[worst].id());
        let policy = PowerOfTwoPolicy::with_seed(Arc::clone(&load), no_caps(), seed);
        for _ in 0..64 {
            let p = pick(&rt, &policy, &fleet, Role::Plain).expect("no caps");
            prop_assert_ne!(
                p.engine.id(), fleet[worst].id(),
                "the busiest engine wins only if sampled twice: power-of-two never samples one engine twice when two or more exist"
            );
        }
    }
}

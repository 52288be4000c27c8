//! Properties every policy keeps, over random fleets, loads and caps.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use router_policy::test_kit::{Scenario, admission_limits, engine_loads, reference, role};
use router_policy::{
    AdmissionDecision, AdmissionLimits, EngineAdmission, LeastLoadPolicy, Policy, PowerOfTwoPolicy,
    RandomPolicy, RoundRobinPolicy,
};
use router_state::{EngineReportedLoadTable, Role};

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

proptest! {
    #[test]
    fn picks_come_from_the_candidates_and_pass_admission(
        loads in engine_loads(1..12),
        limits in admission_limits(),
        stage in role(),
        seed: u64,
    ) {
        let scenario = Scenario::new("m", stage, &loads);
        for policy in all_policies(&scenario.load, limits, seed) {
            // Power-of-two stops at its first choice when admission rejects it.
            let exhaustive = !format!("{policy:?}").starts_with("PowerOfTwo");
            for _ in 0..4 {
                let outcome = scenario.block_on(policy.pick(&scenario.engines, &request(stage)));
                if let Err(broken) = reference::check_pick(&scenario, &limits, &outcome, exhaustive) {
                    prop_assert!(false, "{policy:?}: {broken}");
                }
            }
        }
    }

    #[test]
    fn the_reference_admission_agrees_with_the_limits(
        loads in engine_loads(1..6),
        limits in admission_limits(),
    ) {
        let scenario = Scenario::new("m", Role::Plain, &loads);
        for engine in &scenario.engines {
            let metrics = scenario.metrics(engine);
            let decision = limits.check(engine, &metrics).expect("limits always run");
            prop_assert_eq!(
                decision == AdmissionDecision::Allow,
                reference::admits(&limits, &metrics),
                "{:?} under {:?}", metrics, limits
            );
        }
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

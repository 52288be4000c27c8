//! One pick of each policy over 4, 64 and 256 candidates with fresh native reports.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use router_policy::{
    AdmissionLimits, EngineAdmission, LeastLoadPolicy, PickRequest, Policy, PowerOfTwoPolicy,
    RandomPolicy, RequestFacts, RoundRobinPolicy,
};
use router_state::Role;
use router_state::test_util::fleet;

mod support;

fn policies(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy_pick");
    for n in [4usize, 64, 256, 1024] {
        let engines = fleet("m", Role::Prefill, "e", n);
        let load = support::loaded_table(&engines);
        let admission: Arc<dyn EngineAdmission> = Arc::new(AdmissionLimits {
            max_running_requests: Some(1_000_000),
            max_inflight_requests: Some(1_000_000),
            ..Default::default()
        });
        let policies: [(&str, Box<dyn Policy>); 4] = [
            (
                "round_robin",
                Box::new(RoundRobinPolicy::new(
                    Arc::clone(&load),
                    Arc::clone(&admission),
                )),
            ),
            (
                "random",
                Box::new(RandomPolicy::with_seed(
                    Arc::clone(&load),
                    Arc::clone(&admission),
                    1,
                )),
            ),
            (
                "power_of_two",
                Box::new(PowerOfTwoPolicy::with_seed(
                    Arc::clone(&load),
                    Arc::clone(&admission),
                    1,
                )),
            ),
            (
                "load_based",
                Box::new(LeastLoadPolicy::new(
                    Arc::clone(&load),
                    Arc::clone(&admission),
                )),
            ),
        ];
        let request = PickRequest::new(RequestFacts::new("m", 1000), Role::Prefill, "bucket");
        for (name, policy) in &policies {
            group.bench_with_input(BenchmarkId::new(*name, n), &engines, |b, engines| {
                b.iter(|| {
                    support::ready(policy.pick(black_box(engines), &request)).expect("admitted")
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, policies);
criterion_main!(benches);

//! `EngineGroup::pick` over a 64-engine model: candidate filtering (health, role,
//! membership, id order) plus a power-of-two pick and the exact-candidate check.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use router_buckets::EngineGroup;
use router_policy::{AdmissionLimits, PickRequest, PowerOfTwoPolicy, RequestFacts};
use router_state::{Engine, EngineRegistry, Health, Role};

mod support;

fn group_pick(c: &mut Criterion) {
    let registry = EngineRegistry::new();
    for i in 0..64 {
        let role = if i % 2 == 0 {
            Role::Prefill
        } else {
            Role::Decode
        };
        registry
            .add(Engine::new(
                format!("e{i:02}"),
                format!("http://e{i}.test"),
                "m",
                role,
            ))
            .expect("unique ids");
    }
    for i in (0..64).step_by(8) {
        registry
            .set_health(&format!("e{i:02}"), Health::Unhealthy)
            .expect("registered");
    }
    let snapshot = registry.snapshot();
    let engines: Vec<_> = snapshot.model_engines("m").to_vec();
    let load = support::loaded_table(&engines);
    let policy = Arc::new(PowerOfTwoPolicy::with_seed(
        load,
        Arc::new(AdmissionLimits::default()),
        1,
    ));
    let all = EngineGroup::new(policy.clone());
    let explicit =
        EngineGroup::with_members(policy, engines.iter().step_by(3).map(|e| e.id().clone()));
    let request = PickRequest::new(RequestFacts::new("m", 1000), Role::Prefill, "bucket");
    let mut group = c.benchmark_group("group_pick_64");
    for (name, engine_group) in [("all_members", &all), ("explicit_members", &explicit)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let future = engine_group.pick(black_box(&snapshot), &request);
                support::ready(Box::pin(future)).expect("a candidate")
            });
        });
    }
    group.finish();
}

criterion_group!(benches, group_pick);
criterion_main!(benches);

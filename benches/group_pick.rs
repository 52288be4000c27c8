//! `EngineGroup::pick` over a 64-engine model: candidate filtering (health, role,
//! membership, id order) plus a power-of-two pick and the exact-candidate check; and
//! the same group with a `load_based` shadow on every pick, beside a `load_based` pick
//! alone over the same candidates (what the shadow may cost at most).

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use router_buckets::{EngineGroup, ShadowConfig};
use router_policy::{
    AdmissionLimits, PickRequest, PolicyConfig, PolicyHandles, PowerOfTwoPolicy, RequestFacts,
};
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
        Arc::clone(&load),
        Arc::new(AdmissionLimits::default()),
        1,
    ));
    let handles = PolicyHandles::new(load);
    let shadow_policy = PolicyConfig::LoadBased(Default::default());
    let shadow = ShadowConfig {
        policy: shadow_policy.clone(),
        every: 1,
    }
    .build("shadow", Role::Prefill, &handles)
    .expect("a valid shadow");
    let shadowed = EngineGroup::new(policy.clone()).with_shadow(shadow);
    let alone = shadow_policy
        .build(Role::Prefill, &handles)
        .expect("a valid policy");
    let all = EngineGroup::new(policy.clone());
    let explicit =
        EngineGroup::with_members(policy, engines.iter().step_by(3).map(|e| e.id().clone()));
    let request = PickRequest::new(RequestFacts::new("m", 1000), Role::Prefill, "bucket");
    let mut group = c.benchmark_group("group_pick_64");
    let candidates = all.eligible(&snapshot, &request);
    group.bench_function("load_based_pick_alone", |b| {
        b.iter(|| {
            let future = alone.pick(black_box(&candidates), &request);
            support::ready(future).expect("a candidate")
        });
    });
    for (name, engine_group) in [
        ("all_members", &all),
        ("explicit_members", &explicit),
        ("all_members_load_based_shadow", &shadowed),
    ] {
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

//! One pick of each policy over 8, 64, 256 and 1,024 candidates with fresh native
//! reports. A candidate is one engine with one rank, so 1,024 candidates are 1,024
//! engine ranks (a multi-rank engine is one candidate; its ranks matter only to the
//! prefix index, where each is a source).

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use router_policy::{
    AdmissionLimits, AffinityBackend, CacheAwareConfig, CacheAwarePolicy, CacheScore, CacheSource,
    EngineAdmission, LeastLoadPolicy, LocalCacheSource, PickRequest, Policy, PowerOfTwoPolicy,
    PrefixMemo, RandomPolicy, RequestFacts, RoundRobinPolicy, SessionAwarePolicy, StickyPolicy,
};
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::test_util::fleet;
use router_state::{Engine, EngineId, EngineReportedLoadTable, Role};

mod fleet_index;
mod support;

const SIZES: [usize; 4] = [8, 64, 256, 1024];
/// Distinct keys and prompts a bench cycles through, so no pick repeats the last.
const KEYS: usize = 4096;
/// Pages each source of the cache-aware bench's index holds.
const PAGES_PER_SOURCE: usize = 1024;

fn admission() -> Arc<dyn EngineAdmission> {
    Arc::new(AdmissionLimits {
        max_running_requests: Some(1_000_000),
        max_inflight_requests: Some(1_000_000),
        ..Default::default()
    })
}

fn simple(load: &Arc<EngineReportedLoadTable>) -> Vec<(&'static str, Box<dyn Policy>)> {
    let load = || Arc::clone(load);
    vec![
        (
            "round_robin",
            Box::new(RoundRobinPolicy::new(load(), admission())),
        ),
        (
            "random",
            Box::new(RandomPolicy::with_seed(load(), admission(), 1)),
        ),
        (
            "power_of_two",
            Box::new(PowerOfTwoPolicy::with_seed(load(), admission(), 1)),
        ),
        (
            "load_based",
            Box::new(LeastLoadPolicy::new(load(), admission())),
        ),
    ]
}

fn bench_keyless(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy_pick");
    for n in SIZES {
        let engines = fleet("m", Role::Prefill, "e", n);
        let load = support::loaded_table(&engines);
        let request = PickRequest::new(RequestFacts::new("m", 1000), Role::Prefill, "bucket");
        for (name, policy) in &simple(&load) {
            group.bench_with_input(BenchmarkId::new(*name, n), &engines, |b, engines| {
                b.iter(|| {
                    support::ready(policy.pick(black_box(engines), &request)).expect("admitted")
                });
            });
        }
    }
    group.finish();
}

/// `session_aware` and `sticky` with rendezvous affinity (no store), each pick a
/// different key.
fn bench_affinity(c: &mut Criterion) {
    let keys: Vec<String> = (0..KEYS)
        .map(|k| format!("{:08x}-7b1d-4c3e-9f2a-{k:012x}", k * 2_654_435_761))
        .collect();
    let mut group = c.benchmark_group("policy_pick");
    for n in SIZES {
        let engines = fleet("m", Role::Prefill, "e", n);
        let load = support::loaded_table(&engines);
        let fallback = || -> Arc<dyn Policy> {
            Arc::new(PowerOfTwoPolicy::with_seed(
                Arc::clone(&load),
                Arc::new(AdmissionLimits::default()),
                1,
            ))
        };
        let session = SessionAwarePolicy::new(
            AffinityBackend::Rendezvous,
            Arc::clone(&load),
            admission(),
            fallback(),
        );
        let sticky = StickyPolicy::new(
            AffinityBackend::Rendezvous,
            Arc::clone(&load),
            admission(),
            fallback(),
        );
        for (name, policy, session_key) in [
            ("session_aware", &session as &dyn Policy, true),
            ("sticky", &sticky as &dyn Policy, false),
        ] {
            let mut next = 0;
            group.bench_with_input(BenchmarkId::new(name, n), &engines, |b, engines| {
                b.iter(|| {
                    next = (next + 1) % KEYS;
                    let key = Some(keys[next].as_str());
                    let facts = RequestFacts::new("m", 1000);
                    let facts = if session_key {
                        facts.with_session_key(key)
                    } else {
                        facts.with_routing_key(key)
                    };
                    let request = PickRequest::new(facts, Role::Prefill, "bucket");
                    support::ready(policy.pick(black_box(engines), &request)).expect("admitted")
                });
            });
        }
    }
    group.finish();
}

/// `cache_aware` over an index of as many sources as candidates (see
/// `fleet_index`), 4,096-token prompts: a popular system prompt many candidates hold
/// and one candidate's own conversation after it. `lookup`: each pick a different
/// prompt, hashing it and looking it up included. `memo`: each pick a different
/// prompt whose lookup was done beforehand, so the policy's own work, reading an
/// answer and load slots out of cache. `again`: one prompt picked again and again,
/// as a request's next bucket picks on its first one's answer, in cache. `fresh`:
/// each pick a different prompt, looked up just before the pick and not timed, as a
/// request's first pick follows its lookup: the answer in cache, the load slots not.
fn bench_cache_aware(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy_pick");
    for n in SIZES {
        let ids = fleet_index::engines(n);
        let engines = fleet_engines(&ids);
        let load = support::loaded_table(&engines);
        let index = Arc::new(PrefixIndex::new(IndexConfig {
            block_size: fleet_index::BLOCK,
            ..IndexConfig::default()
        }));
        let conversations = fleet_index::fill(&index, &ids, PAGES_PER_SOURCE);
        let prompts: Vec<Vec<u32>> = (0..KEYS.min(n * conversations))
            .map(|k| fleet_index::conversation(k % n, (k / n) % conversations))
            .collect();
        let source: Arc<dyn CacheSource> = Arc::new(LocalCacheSource::new(Arc::clone(&index)));
        for (name, score) in [
            ("cache_aware", CacheScore::Cached),
            ("cache_aware_ttft", CacheScore::Ttft),
        ] {
            let policy = CacheAwarePolicy::new(
                Arc::clone(&source),
                Arc::clone(&load),
                admission(),
                CacheAwareConfig {
                    score,
                    seed: Some(1),
                    ..CacheAwareConfig::default()
                },
            )
            .expect("valid");
            // Each prompt's lookup done once beforehand, as a request's first bucket
            // would.
            let memos: Vec<PrefixMemo> = prompts.iter().map(|_| PrefixMemo::new()).collect();
            for (memo, tokens) in memos.iter().zip(&prompts) {
                let facts = RequestFacts::new("m", tokens.len() as u64)
                    .with_token_ids(Some(tokens))
                    .with_prefix_memo(Some(memo));
                let request = PickRequest::new(facts, Role::Prefill, "bucket");
                support::ready(policy.pick(&engines, &request)).expect("admitted");
            }
            for (variant, memoised, step) in
                [("lookup", false, 1), ("memo", true, 1), ("again", true, 0)]
            {
                let mut next = 0;
                let id = BenchmarkId::new(format!("{name}/{variant}"), n);
                group.bench_with_input(id, &engines, |b, engines| {
                    b.iter(|| {
                        next = (next + step) % prompts.len();
                        let fresh = PrefixMemo::new();
                        let memo = if memoised { &memos[next] } else { &fresh };
                        let tokens = prompts[next].as_slice();
                        let facts = RequestFacts::new("m", tokens.len() as u64)
                            .with_token_ids(Some(tokens))
                            .with_prefix_memo(Some(memo));
                        let request = PickRequest::new(facts, Role::Prefill, "bucket");
                        support::ready(policy.pick(black_box(engines), &request)).expect("admitted")
                    });
                });
            }
            let mut next = 0;
            let id = BenchmarkId::new(format!("{name}/fresh"), n);
            group.bench_with_input(id, &engines, |b, engines| {
                b.iter_batched(
                    || {
                        next = (next + 1) % prompts.len();
                        let memo = PrefixMemo::new();
                        support::ready(memo.lookup(&source, None, &prompts[next], false));
                        (next, memo)
                    },
                    |(k, memo)| {
                        let tokens = prompts[k].as_slice();
                        let facts = RequestFacts::new("m", tokens.len() as u64)
                            .with_token_ids(Some(tokens))
                            .with_prefix_memo(Some(&memo));
                        let request = PickRequest::new(facts, Role::Prefill, "bucket");
                        let pick = support::ready(policy.pick(black_box(engines), &request))
                            .expect("admitted");
                        // Dropped after the timing.
                        (pick, memo)
                    },
                    BatchSize::PerIteration,
                );
            });
        }
    }
    group.finish();
}

/// Engines of the ids `ids`, sharing them (as a router's registry and its feeds do).
fn fleet_engines(ids: &[EngineId]) -> Vec<Arc<Engine>> {
    ids.iter()
        .map(|id| {
            Arc::new(Engine::new(
                id.clone(),
                format!("http://{}.test", id.as_str()),
                "m",
                Role::Prefill,
            ))
        })
        .collect()
}

criterion_group!(benches, bench_keyless, bench_affinity, bench_cache_aware);
criterion_main!(benches);

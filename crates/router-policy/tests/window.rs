//! `cache_aware` in groups larger than its window (`CACHE_AWARE_WINDOW`): the deepest
//! holder still wins, tied holders share a prefix, the load bound holds on a sampled
//! mean, and an explanation still names the next real pick.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{engines, no_caps, report_basic, report_native, runtime, table};
use router_policy::{
    BoxFuture, CACHE_AWARE_WINDOW, CacheAwareConfig, CacheAwarePolicy, CacheLookup,
    CacheQueryError, CacheSource, Explanation, PickReason, PickRequest, Policy, PrefixHits,
    RequestFacts,
};
use router_state::{Engine, EngineId, EngineReportedLoadTable, Role};

const BLOCK: u32 = 16;
const PROMPT: u64 = 4096;

/// A source answering that each named engine holds so many leading blocks.
#[derive(Debug)]
struct Held(Vec<(EngineId, usize)>);

impl Held {
    /// Every engine holding `blocks`, except `deeper` holding `deep`.
    fn all(engines: &[Arc<Engine>], blocks: usize, deeper: Option<(usize, usize)>) -> Arc<Self> {
        let mut held: Vec<(EngineId, usize)> = engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let blocks = deeper.filter(|(at, _)| *at == i).map_or(blocks, |(_, d)| d);
                (e.id().clone(), blocks)
            })
            .collect();
        held.sort();
        Arc::new(Self(held))
    }
}

impl CacheSource for Held {
    fn lookup<'a>(
        &'a self,
        _: Option<&'a str>,
        _: &'a [u32],
        _: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        Box::pin(std::future::ready(Ok(CacheLookup::Answered(
            PrefixHits::new((PROMPT / u64::from(BLOCK)) as usize, BLOCK, self.0.clone()),
        ))))
    }
}

fn policy(
    source: Arc<dyn CacheSource>,
    load: &Arc<EngineReportedLoadTable>,
    config: CacheAwareConfig,
) -> CacheAwarePolicy {
    let config = CacheAwareConfig {
        seed: Some(11),
        ..config
    };
    CacheAwarePolicy::new(source, Arc::clone(load), no_caps(), config).expect("valid")
}

fn pick(
    policy: &CacheAwarePolicy,
    engines: &[Arc<Engine>],
    explanation: Option<&Explanation>,
) -> (String, PickReason, Option<u64>) {
    let tokens: Vec<u32> = (0..PROMPT as u32).collect();
    let request = PickRequest::new(
        RequestFacts::new("m", PROMPT)
            .with_token_ids(Some(&tokens))
            .with_explanation(explanation),
        Role::Plain,
        "b",
    );
    let pick = runtime()
        .block_on(policy.pick(engines, &request))
        .expect("a pick");
    (
        pick.engine.id().to_string(),
        pick.reason,
        pick.predicted_cached_tokens,
    )
}

#[test]
fn the_deepest_holder_of_a_thousand_wins() {
    let engines = engines(1024);
    let load = table(&engines);
    for e in &engines {
        report_native(&load, e, 0, 1);
    }
    // Everyone holds 64 blocks, the 778th holds 192: the window keeps the least work.
    let source = Held::all(&engines, 64, Some((777, 192)));
    let policy = policy(source, &load, CacheAwareConfig::default());
    for _ in 0..50 {
        assert_eq!(
            pick(&policy, &engines, None),
            (
                engines[777].id().to_string(),
                PickReason::CacheHit,
                Some(192 * u64::from(BLOCK))
            )
        );
    }
}

#[test]
fn tied_holders_of_a_large_group_share_the_prefix() {
    let engines = engines(256);
    let load = table(&engines);
    for e in &engines {
        report_native(&load, e, 0, 1);
    }
    let source = Held::all(&engines, 128, None);
    let policy = policy(source, &load, CacheAwareConfig::default());
    let winners: HashSet<String> = (0..400).map(|_| pick(&policy, &engines, None).0).collect();
    // Equal holders, equal load: without the window's random start the same engine
    // would win every time; with it, the winners spread over the group.
    assert!(
        winners.len() >= 4 * 256 / CACHE_AWARE_WINDOW,
        "{} distinct winners",
        winners.len()
    );
}

#[test]
fn the_load_bound_holds_on_a_sampled_mean() {
    let engines = engines(512);
    let load = table(&engines);
    for e in &engines {
        report_basic(&load, e, 0, 8);
    }
    // Only the sixth holds the prompt, and it runs 40 requests: past
    // ceil(1.25 x (mean 8 + 1/512)) = 11, whichever engines the sample reads.
    report_basic(&load, &engines[5], 0, 40);
    let source = Arc::new(Held(vec![(engines[5].id().clone(), 256)]));
    let policy = policy(source, &load, CacheAwareConfig::default());
    for _ in 0..50 {
        let (engine, reason, _) = pick(&policy, &engines, None);
        assert_eq!(reason, PickReason::CacheSpill);
        assert_ne!(engine, engines[5].id().as_str());
    }
    // At 10 requests it is under the bound and keeps its prefix.
    report_basic(&load, &engines[5], 0, 10);
    assert_eq!(pick(&policy, &engines, None).1, PickReason::CacheHit);
}

#[test]
fn an_explained_pick_in_a_large_group_is_the_next_real_pick() {
    let engines = engines(300);
    let load = table(&engines);
    for (i, e) in engines.iter().enumerate() {
        report_native(&load, e, i as u64 % 3, 1);
    }
    let tied = Held::all(&engines, 100, None);
    let policy = policy(tied, &load, CacheAwareConfig::default());
    for round in 0..40 {
        let explanation = Explanation::dry_run();
        let explained = pick(&policy, &engines, Some(&explanation));
        assert_eq!(pick(&policy, &engines, None), explained, "round {round}");
    }
}

//! `cache_aware` over a source that counts routed pages: siblings of a new prefix
//! follow the first pick before its engine's events arrive; an engine that refused a
//! request, or a dry run, is credited with nothing.

use crate::common;

use std::sync::Arc;

use common::{caps, engines, no_caps, report_native, runtime, table};
use router_policy::{
    AdmissionLimits, CacheAwareConfig, CacheAwarePolicy, Estimated, EventSource, Explanation,
    PickError, PickReason, PickRequest, Policy, RequestFacts, RoutedCacheSource,
    RoutedPagesSettings,
};
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::test_util::stored_batch;
use router_state::{Engine, EngineReportedLoadTable, Role};

const BLOCK: u32 = 16;
const PROMPT: u32 = 4096;
/// Longer than any test: the pages stay pending throughout.
const PENDING_MS: u64 = 60_000;

struct Fleet {
    engines: Vec<Arc<Engine>>,
    load: Arc<EngineReportedLoadTable>,
    source: Arc<RoutedCacheSource>,
}

/// Four idle engines, each publishing KV events (one page of an unrelated prompt),
/// and a source counting their routed pages as pending for `pending_ms`.
fn fleet(pending_ms: u64) -> Fleet {
    let engines = engines(4);
    let load = table(&engines);
    let index = Arc::new(PrefixIndex::new(IndexConfig {
        block_size: BLOCK,
        max_nodes: 1 << 16,
        ..IndexConfig::default()
    }));
    for engine in &engines {
        report_native(&load, engine, 0, 0);
        let other: Vec<u32> = (1_000_000..1_000_000 + BLOCK).collect();
        index.apply(engine.id(), 0, &stored_batch(&other, BLOCK));
    }
    let settings = RoutedPagesSettings {
        estimate: Estimated::None,
        pending_ms,
        ..RoutedPagesSettings::default()
    };
    let source = Arc::new(RoutedCacheSource::new(
        EventSource::Local(index),
        BLOCK,
        Arc::clone(&load),
        settings,
    ));
    Fleet {
        engines,
        load,
        source,
    }
}

impl Fleet {
    fn policy(&self, admission: Arc<AdmissionLimits>) -> CacheAwarePolicy {
        let config = CacheAwareConfig {
            seed: Some(7),
            ..CacheAwareConfig::default()
        };
        CacheAwarePolicy::new(
            Arc::clone(&self.source) as _,
            Arc::clone(&self.load),
            admission,
            config,
        )
        .expect("a valid configuration")
    }
}

fn pick(
    policy: &dyn Policy,
    engines: &[Arc<Engine>],
    tokens: &[u32],
    explanation: Option<&Explanation>,
) -> Result<(String, PickReason, Option<u64>), PickError> {
    let request = PickRequest::new(
        RequestFacts::new("m", tokens.len() as u64)
            .with_token_ids(Some(tokens))
            .with_explanation(explanation),
        Role::Plain,
        "b",
    );
    runtime().block_on(policy.pick(engines, &request)).map(|p| {
        (
            p.engine.id().to_string(),
            p.reason,
            p.predicted_cached_tokens,
        )
    })
}

/// A prompt on a new prefix: `prefix` tokens shared, then a distinct question.
fn sibling(prefix: u32, question: u32) -> Vec<u32> {
    let mut tokens: Vec<u32> = (0..prefix).collect();
    tokens.extend((0..PROMPT - prefix).map(|i| 500_000 + question * 10_000 + i));
    tokens
}

#[test]
fn siblings_of_a_new_prefix_follow_the_first_before_its_events_arrive() {
    let f = fleet(PENDING_MS);
    let policy = f.policy(no_caps());
    let (first, reason, predicted) = pick(&policy, &f.engines, &sibling(3072, 0), None).unwrap();
    assert_eq!(
        (reason, predicted),
        (PickReason::CacheMiss, Some(0)),
        "nobody holds the new prefix yet"
    );
    for question in 1..10 {
        let (engine, reason, predicted) =
            pick(&policy, &f.engines, &sibling(3072, question), None).unwrap();
        assert_eq!(engine, first, "sibling {question} follows the first");
        assert_eq!(reason, PickReason::CacheHit);
        assert_eq!(predicted, Some(3072), "the shared prefix, pending");
    }

    // Without pending pages, the second sibling is a miss like the first.
    let f = fleet(0);
    let policy = f.policy(no_caps());
    pick(&policy, &f.engines, &sibling(3072, 0), None).unwrap();
    let (_, reason, _) = pick(&policy, &f.engines, &sibling(3072, 1), None).unwrap();
    assert_eq!(reason, PickReason::CacheMiss);
}

#[test]
fn an_engine_that_refused_the_request_is_credited_with_nothing() {
    let f = fleet(PENDING_MS);
    let policy = f.policy(caps(1));
    let tokens = sibling(4096, 0);
    let mut guards: Vec<_> = f.engines.iter().map(|e| f.load.acquire(e.id())).collect();
    assert!(
        pick(&policy, &f.engines, &tokens, None).is_err(),
        "every engine is at its cap"
    );
    assert!(f.source.routed_pages().is_empty(), "no engine took it");

    // One engine has room again: only it gets the pages.
    drop(guards.remove(2));
    let (engine, ..) = pick(&policy, &f.engines, &tokens, None).unwrap();
    assert_eq!(engine, f.engines[2].id().to_string());
    let pages = f.source.routed_pages();
    assert_eq!(pages.pages_of(f.engines[2].id()), (PROMPT / BLOCK) as usize);
    assert_eq!(pages.len(), (PROMPT / BLOCK) as usize);
}

#[test]
fn a_dry_run_is_credited_with_nothing() {
    let f = fleet(PENDING_MS);
    let policy = f.policy(no_caps());
    let explanation = Explanation::dry_run();
    pick(&policy, &f.engines, &sibling(4096, 0), Some(&explanation)).unwrap();
    assert!(f.source.routed_pages().is_empty());
}

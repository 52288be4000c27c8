//! CacheAwarePolicy: hits, thresholds, candidate bounds, the pressure guard, the soft
//! queue gate and saturation, explicit admission, the miss fallback, and the prefix
//! memo.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{caps, engines, no_caps, report_native, runtime, table};
use router_policy::{
    BoxFuture, CacheAwareConfig, CacheAwarePolicy, CacheLookup, CacheQueryError, CacheSource,
    LocalCacheSource, PickError, PickReason, PickRequest, Policy, PolicyConfig, PolicyConfigError,
    PolicyHandles, PrefixHits, PrefixMemo, Real, RequestFacts,
};
use router_state::kv_events::{BlockStored, IndexConfig, KvBatch, KvEvent, PrefixIndex, Tier};
use router_state::{Engine, EngineId, EngineReportedLoadTable, Role};
use serde::Deserialize as _;
use serde::de::IntoDeserializer as _;
use serde::de::value::F64Deserializer;

const BLOCK: u32 = 16;
const PROMPT: u64 = 4096;

/// A source that answers with fixed hits (blocks per engine) and counts its lookups.
#[derive(Debug)]
struct Scripted {
    answer: Result<CacheLookup, CacheQueryError>,
    asked: AtomicUsize,
}

impl Scripted {
    fn hits(blocks: &[(&str, usize)]) -> Arc<Self> {
        let mut engines: Vec<(EngineId, usize)> = blocks
            .iter()
            .map(|(id, b)| (EngineId::from(*id), *b))
            .collect();
        engines.sort();
        Self::answering(Ok(CacheLookup::Answered(PrefixHits::new(
            (PROMPT / u64::from(BLOCK)) as usize,
            BLOCK,
            engines,
        ))))
    }

    fn answering(answer: Result<CacheLookup, CacheQueryError>) -> Arc<Self> {
        Arc::new(Self {
            answer,
            asked: AtomicUsize::new(0),
        })
    }
}

impl CacheSource for Scripted {
    fn lookup<'a>(
        &'a self,
        _: Option<&'a str>,
        _: &'a [u32],
        _: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(self.answer.clone()))
    }
}

/// The default settings without the load bound: these tests load holders past it on
/// purpose, to exercise the other rules (`tests/score.rs` tests the bound).
fn unbounded() -> CacheAwareConfig {
    CacheAwareConfig {
        load_bound: None,
        ..CacheAwareConfig::default()
    }
}

/// `tokens` cached tokens, in blocks.
fn cached(tokens: u64) -> usize {
    (tokens / u64::from(BLOCK)) as usize
}

struct Setup {
    engines: Vec<Arc<Engine>>,
    load: Arc<EngineReportedLoadTable>,
    tokens: Vec<u32>,
}

impl Setup {
    fn new(n: usize) -> Self {
        let engines = engines(n);
        let load = table(&engines);
        Self {
            engines,
            load,
            tokens: (0..PROMPT as u32).collect(),
        }
    }

    fn policy(&self, source: Arc<dyn CacheSource>, config: CacheAwareConfig) -> CacheAwarePolicy {
        self.policy_with(source, config, no_caps())
    }

    fn policy_with(
        &self,
        source: Arc<dyn CacheSource>,
        config: CacheAwareConfig,
        admission: Arc<router_policy::AdmissionLimits>,
    ) -> CacheAwarePolicy {
        let config = CacheAwareConfig {
            seed: Some(7),
            ..config
        };
        CacheAwarePolicy::new(source, Arc::clone(&self.load), admission, config)
            .expect("a valid configuration")
    }

    fn request(&self) -> PickRequest<'_> {
        PickRequest::new(
            RequestFacts::new("m", PROMPT).with_token_ids(Some(&self.tokens)),
            Role::Plain,
            "b",
        )
    }

    fn pick(&self, policy: &dyn Policy) -> Result<(String, PickReason, Option<u64>), PickError> {
        let request = self.request();
        runtime()
            .block_on(policy.pick(&self.engines, &request))
            .map(|p| {
                (
                    p.engine.id().to_string(),
                    p.reason,
                    p.predicted_cached_tokens,
                )
            })
    }

    /// A fresh native report: `waiting` requests, `waiting * 100` uncached tokens.
    fn busy(&self, engine: usize, waiting: u64) {
        report_native(&self.load, &self.engines[engine], waiting, 0);
    }

    fn idle_all(&self) {
        for i in 0..self.engines.len() {
            self.busy(i, 0);
        }
    }
}

#[test]
fn the_deepest_holder_wins_and_predicts_its_cached_tokens() {
    let s = Setup::new(4);
    s.idle_all();
    let source = Scripted::hits(&[("e1", cached(1024)), ("e3", cached(3072))]);
    let policy = s.policy(source, unbounded());
    assert_eq!(
        s.pick(&policy).unwrap(),
        ("e3".into(), PickReason::CacheHit, Some(3072))
    );
}

#[test]
fn hits_below_the_minimum_or_the_ratio_gate_are_misses() {
    let s = Setup::new(4);
    s.idle_all();
    let shallow = Scripted::hits(&[("e2", cached(512))]);
    let (_, reason, predicted) = s.pick(&s.policy(shallow, unbounded())).unwrap();
    assert_eq!(
        (reason, predicted),
        (PickReason::CacheMiss, Some(0)),
        "512 < 1024 tokens"
    );

    let half = Scripted::hits(&[("e2", cached(2048))]);
    let gated = CacheAwareConfig {
        min_match_ratio: Some(Real::new(0.6).unwrap()),
        ..unbounded()
    };
    assert_eq!(
        s.pick(&s.policy(half.clone(), gated)).unwrap().1,
        PickReason::CacheMiss
    );
    let lenient = CacheAwareConfig {
        min_match_ratio: Some(Real::new(0.5).unwrap()),
        ..unbounded()
    };
    assert_eq!(s.pick(&s.policy(half, lenient)).unwrap().0, "e2");
}

#[test]
fn the_pressure_guard_switches_near_ties_only() {
    let s = Setup::new(3);
    s.idle_all();
    // e0 caches 3,072 tokens but queues 100,000 uncached tokens; e1 caches 2,560
    // (512 more to prefill, within the 1,024 margin) and is idle.
    s.busy(0, 1000);
    let near = Scripted::hits(&[("e0", cached(3072)), ("e1", cached(2560))]);
    assert_eq!(
        s.pick(&s.policy(near.clone(), unbounded())).unwrap(),
        ("e1".into(), PickReason::CacheGuardSwitch, Some(2560))
    );
    let mut off = unbounded();
    off.pressure_guard.enabled = false;
    assert_eq!(
        s.pick(&s.policy(near, off)).unwrap(),
        ("e0".into(), PickReason::CacheHit, Some(3072))
    );
    // Beyond the margin the deeper prefix wins however loaded.
    let far = Scripted::hits(&[("e0", cached(3072)), ("e1", cached(1024))]);
    assert_eq!(s.pick(&s.policy(far, unbounded())).unwrap().0, "e0");
    // A small queue difference is no reason to give up cached tokens.
    s.busy(0, 5);
    let near = Scripted::hits(&[("e0", cached(3072)), ("e1", cached(2560))]);
    assert_eq!(s.pick(&s.policy(near, unbounded())).unwrap().0, "e0");
}

#[test]
fn admission_is_explicit_and_rejections_never_go_cold() {
    let s = Setup::new(4);
    s.idle_all();
    let _held: Vec<_> = (0..2).map(|_| s.load.acquire(s.engines[3].id())).collect();
    let source = Scripted::hits(&[("e1", cached(2048)), ("e3", cached(3072))]);
    // e3 (deepest) is at its in-flight cap: the next admitted holder wins.
    assert_eq!(
        s.pick(&s.policy_with(source.clone(), unbounded(), caps(2)))
            .unwrap()
            .0,
        "e1"
    );
    // Every holder at its cap: the pick fails rather than going to an idle non-holder.
    let _more: Vec<_> = (0..2).map(|_| s.load.acquire(s.engines[1].id())).collect();
    match s.pick(&s.policy_with(source, unbounded(), caps(2))) {
        Err(PickError::NoAdmissibleEngine { rejections, .. }) => {
            let ids: Vec<&str> = rejections.iter().map(|r| r.engine.as_str()).collect();
            assert_eq!(ids, ["e3", "e1"]);
        }
        other => panic!("expected NoAdmissibleEngine, got {other:?}"),
    }
}

#[test]
fn candidate_bounds_limit_the_holders_considered() {
    let bounds = unbounded().candidates;
    assert_eq!(
        [1, 8, 100, 200, 1000].map(|n| bounds.count(n)),
        [1, 8, 8, 10, 32],
        "min(group, 32, max(8, ceil(0.05 x group)))"
    );
    let s = Setup::new(4);
    s.idle_all();
    let _held: Vec<_> = (0..2).map(|_| s.load.acquire(s.engines[3].id())).collect();
    let source = Scripted::hits(&[("e1", cached(2048)), ("e3", cached(3072))]);
    let mut one = unbounded();
    one.candidates.min_engines = 1;
    one.candidates.max_engines = 1;
    assert!(
        matches!(
            s.pick(&s.policy_with(source, one, caps(2))),
            Err(PickError::NoAdmissibleEngine { .. })
        ),
        "only the best holder was a candidate"
    );
}

#[test]
fn the_soft_queue_gate_prefers_unqueued_holders_and_pins_when_all_are_queued() {
    let s = Setup::new(3);
    s.idle_all();
    let gate = CacheAwareConfig {
        engine_queue_limit: Some(10),
        ..unbounded()
    };
    let source = Scripted::hits(&[("e0", cached(3072)), ("e1", cached(1024))]);
    s.busy(0, 20);
    assert_eq!(
        s.pick(&s.policy(source.clone(), gate.clone())).unwrap().0,
        "e1",
        "e0 is set aside"
    );
    s.busy(1, 10);
    assert_eq!(
        s.pick(&s.policy(source.clone(), gate.clone())).unwrap(),
        ("e0".into(), PickReason::CacheSaturationPin, Some(3072)),
        "every holder queued and no floor: the prefix order decides"
    );
    let floor = CacheAwareConfig {
        saturation_queue_floor: Some(5),
        ..gate
    };
    assert_eq!(
        s.pick(&s.policy(source.clone(), floor.clone())).unwrap(),
        ("e2".into(), PickReason::CacheMiss, Some(0)),
        "e2 is below the floor: go cold to it"
    );
    s.busy(2, 7);
    assert_eq!(
        s.pick(&s.policy(source, floor)).unwrap(),
        ("e1".into(), PickReason::CacheSaturationPin, Some(1024)),
        "the whole group is at the floor: pin the least pressured holder"
    );
}

#[test]
fn a_miss_takes_the_least_pressured_engine_below_the_queue_limit() {
    let s = Setup::new(4);
    for (i, waiting) in [(0, 9), (1, 3), (2, 1), (3, 12)] {
        s.busy(i, waiting);
    }
    let miss = Scripted::hits(&[]);
    let every = CacheAwareConfig {
        min_load_choices: 4,
        ..unbounded()
    };
    assert_eq!(
        s.pick(&s.policy(miss.clone(), every)).unwrap(),
        ("e2".into(), PickReason::CacheMiss, Some(0))
    );
    // Sampling two of the engines below the limit of 4 (e1, e2) always finds e2.
    let gated = CacheAwareConfig {
        engine_queue_limit: Some(4),
        ..unbounded()
    };
    let policy = s.policy(miss, gated);
    for _ in 0..20 {
        assert_eq!(s.pick(&policy).unwrap().0, "e2");
    }
}

#[test]
fn an_unavailable_source_falls_back_visibly_and_a_refused_query_is_an_error() {
    let s = Setup::new(2);
    s.idle_all();
    let down = Scripted::answering(Ok(CacheLookup::Unavailable("indexer timed out".into())));
    assert_eq!(
        s.pick(&s.policy(down, unbounded())).unwrap().1,
        PickReason::CacheUnavailable
    );
    let refused = Scripted::answering(Err(CacheQueryError("unknown namespace".into())));
    let err = s.pick(&s.policy(refused, unbounded())).unwrap_err();
    assert!(
        matches!(err, PickError::InvalidSignal { .. }) && !err.advances_to_next_bucket(),
        "{err}"
    );
    // Without token ids there is nothing to look up.
    let source = Scripted::hits(&[("e1", cached(4096))]);
    let policy = s.policy(source.clone(), unbounded());
    let request = PickRequest::new(RequestFacts::new("m", PROMPT), Role::Plain, "b");
    let pick = runtime()
        .block_on(policy.pick(&s.engines, &request))
        .unwrap();
    assert_eq!(pick.reason, PickReason::CacheUnavailable);
    assert_eq!(source.asked.load(Ordering::SeqCst), 0);
}

#[test]
fn a_real_lookup_after_a_dry_one_asks_the_source_again() {
    let source = Scripted::hits(&[("e1", cached(4096))]);
    let shared: Arc<dyn CacheSource> = source.clone();
    let memo = PrefixMemo::new();
    let rt = runtime();
    let ask = |dry_run: bool| rt.block_on(memo.lookup(&shared, None, &[1, 2, 3], dry_run));
    ask(true);
    ask(true);
    assert_eq!(
        source.asked.load(Ordering::SeqCst),
        1,
        "dry answers are shared"
    );
    ask(false);
    assert_eq!(
        source.asked.load(Ordering::SeqCst),
        2,
        "a shadow's dry answer does not stand in for a real pick's lookup"
    );
    ask(false);
    ask(true);
    assert_eq!(
        source.asked.load(Ordering::SeqCst),
        2,
        "a real answer serves both"
    );
    assert_eq!(memo.len(), 1);
}

#[test]
fn one_request_looks_its_prefix_up_once_per_source() {
    let s = Setup::new(2);
    s.idle_all();
    let source = Scripted::hits(&[("e1", cached(4096))]);
    let other = Scripted::hits(&[("e0", cached(4096))]);
    let first = s.policy(source.clone(), unbounded());
    let second = s.policy(source.clone(), unbounded());
    let elsewhere = s.policy(other.clone(), unbounded());
    let memo = PrefixMemo::new();
    let request = s.request();
    let request = PickRequest::new(
        request.facts.with_prefix_memo(Some(&memo)),
        request.stage,
        request.bucket_id,
    );
    let rt = runtime();
    for policy in [&first, &second, &first] {
        assert_eq!(
            rt.block_on(policy.pick(&s.engines, &request))
                .unwrap()
                .engine
                .id()
                .as_str(),
            "e1"
        );
    }
    assert_eq!(
        rt.block_on(elsewhere.pick(&s.engines, &request))
            .unwrap()
            .engine
            .id()
            .as_str(),
        "e0"
    );
    assert_eq!(
        source.asked.load(Ordering::SeqCst),
        1,
        "shared across bucket attempts"
    );
    assert_eq!(
        other.asked.load(Ordering::SeqCst),
        1,
        "each source has its own entry"
    );
    assert_eq!(memo.len(), 2);
    // Without a memo every pick asks.
    rt.block_on(first.pick(&s.engines, &s.request())).unwrap();
    assert_eq!(source.asked.load(Ordering::SeqCst), 2);
}

#[test]
fn the_local_source_reads_the_index_fed_by_kv_events() {
    let s = Setup::new(3);
    s.idle_all();
    let index = indexed(&s, &[("e2", 2048, Tier::Device)]);
    let policy = s.policy(Arc::new(LocalCacheSource::new(index)), unbounded());
    assert_eq!(
        s.pick(&policy).unwrap(),
        ("e2".into(), PickReason::CacheHit, Some(2048))
    );
}

/// An index fed by KV events in which each `(engine, tokens, tier)` holds the first
/// `tokens` of the prompt on `tier`.
fn indexed(s: &Setup, holders: &[(&str, usize, Tier)]) -> Arc<PrefixIndex> {
    let index = Arc::new(PrefixIndex::new(IndexConfig {
        block_size: BLOCK,
        ..IndexConfig::default()
    }));
    for &(engine, held, tier) in holders {
        let batch = KvBatch {
            ts: 0.0,
            events: vec![KvEvent::Stored(BlockStored {
                block_hashes: (1..=(held / BLOCK as usize) as u64).collect(),
                parent: None,
                tokens: s.tokens[..held].to_vec(),
                block_size: BLOCK,
                tier,
                namespace: None,
                group_idx: None,
                group_kind: None,
            })],
            dp_rank: None,
            dropped: vec![],
        };
        index.apply(&EngineId::from(engine), 0, &batch);
    }
    index
}

/// `e1` holds 3072 of the prompt's tokens on `far_tier`, `e2` 2048 on the device.
fn index_with_two_holders(s: &Setup, far_tier: Tier) -> Arc<PrefixIndex> {
    indexed(s, &[("e1", 3072, far_tier), ("e2", 2048, Tier::Device)])
}

#[test]
fn a_copy_on_a_slower_tier_counts_for_less_than_one_on_the_device() {
    let s = Setup::new(3);
    s.idle_all();
    let index = index_with_two_holders(&s, Tier::Host);
    let source = || -> Arc<dyn CacheSource> { Arc::new(LocalCacheSource::new(Arc::clone(&index))) };
    let equal = s.policy(source(), unbounded());
    assert_eq!(
        s.pick(&equal).unwrap(),
        ("e1".into(), PickReason::CacheHit, Some(3072)),
        "by default a host copy counts as a device copy"
    );
    let weighted = s.policy(
        source(),
        CacheAwareConfig {
            slower_tier_weight: Real::new(0.5).unwrap(),
            ..unbounded()
        },
    );
    assert_eq!(
        s.pick(&weighted).unwrap(),
        ("e2".into(), PickReason::CacheHit, Some(2048)),
        "3072 host tokens at half weight are worth less than 2048 on the device"
    );
    let zero = CacheAwareConfig {
        slower_tier_weight: Real::new(0.0).unwrap(),
        ..unbounded()
    };
    let worthless = s.policy(source(), zero.clone());
    let index_only_host = index_with_two_holders(&s, Tier::Disk);
    index_only_host.remove_engine(&EngineId::from("e2"));
    let only_slower = s.policy(Arc::new(LocalCacheSource::new(index_only_host)), zero);
    assert_eq!(s.pick(&worthless).unwrap().0, "e2");
    assert_eq!(
        s.pick(&only_slower).unwrap().1,
        PickReason::CacheMiss,
        "a copy worth nothing is no hit"
    );
}

#[test]
fn a_slower_tier_weight_outside_0_to_1_is_refused() {
    for weight in [-0.1, 1.5] {
        let config = CacheAwareConfig {
            slower_tier_weight: Real::new(weight).unwrap(),
            ..unbounded()
        };
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("slower_tier_weight"), "{err}");
    }
}

#[test]
fn a_real_is_finite() {
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(Real::new(value), None, "{value} is refused");
    }
    assert_eq!(Real::new(-0.5).map(Real::get), Some(-0.5));
    let infinite: F64Deserializer<serde::de::value::Error> = f64::INFINITY.into_deserializer();
    let err = Real::deserialize(infinite).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid value: floating point `inf`, expected a finite number"
    );
}

#[test]
fn cache_aware_is_for_plain_and_prefill_groups_and_needs_a_prefix_source() {
    let parse = |json: &str| serde_json::from_str::<PolicyConfig>(json).unwrap();
    let config = parse(r#"{"type": "cache_aware"}"#);
    assert_eq!(
        config,
        PolicyConfig::CacheAware(CacheAwareConfig::default()),
        "every setting has its default"
    );
    let source: Arc<dyn CacheSource> = Scripted::hits(&[]);
    let handles = PolicyHandles::new(Arc::default()).with_prefix_source(Some(source));
    for role in [Role::Plain, Role::Prefill] {
        config
            .build(role, &handles)
            .expect("plain and prefill groups");
    }
    let err = config.build(Role::Decode, &handles).unwrap_err();
    assert!(matches!(err, PolicyConfigError::WrongRole { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("policy cache_aware cannot pick decode engines"),
        "{err}"
    );
    let err = config
        .build(Role::Plain, &PolicyHandles::new(Arc::default()))
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("policy cache_aware needs the model's prefix index"),
        "{err}"
    );

    // A policy built anyway refuses to pick decode engines.
    let s = Setup::new(2);
    let policy = s.policy(Scripted::hits(&[]), unbounded());
    let request = PickRequest::new(RequestFacts::new("m", PROMPT), Role::Decode, "b");
    let err = runtime()
        .block_on(policy.pick(&s.engines, &request))
        .unwrap_err();
    assert!(
        matches!(err, PickError::InvalidConfiguration { .. }),
        "{err}"
    );
}

#[test]
fn invalid_settings_are_named() {
    let check = |json: &str| {
        serde_json::from_str::<PolicyConfig>(json)
            .map_err(|e| e.to_string())
            .and_then(|c| c.validate().map_err(|e| e.to_string()))
    };
    for (json, expected) in [
        (
            r#"{"type": "cache_aware", "min_match_ratio": 0}"#,
            "min_match_ratio must be in (0, 1]",
        ),
        (
            r#"{"type": "cache_aware", "min_match_ratio": 1.5}"#,
            "min_match_ratio must be in (0, 1]",
        ),
        (
            r#"{"type": "cache_aware", "candidates": {"min_engines": 0}}"#,
            "candidates.min_engines must be at least 1",
        ),
        (
            r#"{"type": "cache_aware", "candidates": {"min_engines": 9, "max_engines": 4}}"#,
            "candidates.max_engines must be at least min_engines",
        ),
        (
            r#"{"type": "cache_aware", "candidates": {"ratio": 2}}"#,
            "candidates.ratio must be in [0, 1]",
        ),
        (
            r#"{"type": "cache_aware", "pressure_guard": {"rel": 1}}"#,
            "pressure_guard.rel must be a finite number above 1",
        ),
        (
            r#"{"type": "cache_aware", "engine_queue_limit": 0}"#,
            "engine_queue_limit must be at least 1",
        ),
        (
            r#"{"type": "cache_aware", "saturation_queue_floor": 2}"#,
            "saturation_queue_floor needs engine_queue_limit",
        ),
        (
            r#"{"type": "cache_aware", "engine_queue_limit": 4, "saturation_queue_floor": 5}"#,
            "saturation_queue_floor must be at most engine_queue_limit",
        ),
        (
            r#"{"type": "cache_aware", "min_load_choices": 0}"#,
            "min_load_choices must be at least 1",
        ),
        (
            r#"{"type": "cache_aware", "admission": {"max_running_requests": 0}}"#,
            "admission.max_running_requests must be at least 1",
        ),
        (
            r#"{"type": "cache_aware", "cache_threshold": 0.5}"#,
            "unknown field `cache_threshold`",
        ),
    ] {
        let err = check(json).unwrap_err();
        assert!(err.starts_with(expected), "{json}: {err}");
    }
    assert_eq!(
        check(
            r#"{"type": "cache_aware", "min_match_ratio": 0.25, "engine_queue_limit": 8, "saturation_queue_floor": 8, "pressure_guard": {"abs_ms": 50}}"#
        ),
        Ok(())
    );
}

#[test]
fn the_design_documents_engine_count_names_are_accepted() {
    let parse = |json: &str| serde_json::from_str::<PolicyConfig>(json).unwrap();
    let old = parse(
        r#"{"type": "cache_aware", "worker_queue_limit": 16,
            "candidates": {"min_workers": 2, "max_workers": 4}}"#,
    );
    let new = parse(
        r#"{"type": "cache_aware", "engine_queue_limit": 16,
            "candidates": {"min_engines": 2, "max_engines": 4}}"#,
    );
    assert_eq!(old, new);
    let PolicyConfig::CacheAware(config) = new else {
        panic!("a cache_aware config")
    };
    assert_eq!(
        (
            config.engine_queue_limit,
            config.candidates.min_engines,
            config.candidates.max_engines
        ),
        (Some(16), 2, 4)
    );
}

#[test]
fn only_cache_aware_reads_the_prompt() {
    let source: Arc<dyn CacheSource> = Scripted::hits(&[]);
    let store = Arc::new(router_state::affinity::LocalAffinityStore::new(
        router_state::affinity::AffinityConfig::default(),
    ));
    let handles = PolicyHandles::new(Arc::default())
        .with_prefix_source(Some(source))
        .with_affinity(Some(router_policy::AffinityBackend::Store(store)));
    let reads = |json: &str| {
        let config = serde_json::from_str::<PolicyConfig>(json).unwrap();
        config.build(Role::Plain, &handles).unwrap().reads_prompt()
    };
    assert!(reads(r#"{"type": "cache_aware"}"#));
    for kind in [
        "round_robin",
        "random",
        "power_of_two",
        "load_based",
        "session_aware",
        "sticky",
    ] {
        assert!(!reads(&format!(r#"{{"type": "{kind}"}}"#)), "{kind}");
    }
}

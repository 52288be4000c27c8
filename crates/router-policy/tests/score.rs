//! `cache_aware` weighing a holder's cached tokens against the work in front of them:
//! `score: ttft` (predicted time to first token) and `load_bound` (bounded load).

use crate::common;

use std::sync::Arc;

use common::{caps, engines, no_caps, runtime, table};
use router_policy::{
    AdmissionLimits, BoxFuture, CacheAwareConfig, CacheAwarePolicy, CacheLookup, CacheQueryError,
    CacheScore, CacheSource, PickReason, PickRequest, Policy, PrefixHits, Real, RequestFacts,
};
use router_state::test_util::{basic_report, with_native};
use router_state::{Engine, EngineId, EngineReportedLoadTable, NativeLoad, Role};
use tokio::time::Instant;

const BLOCK: u32 = 16;
const PROMPT: u64 = 4096;

/// A source answering that each named engine holds so many leading blocks.
#[derive(Debug)]
struct Held(Vec<(EngineId, usize)>);

/// The whole prompt on `e0`.
fn on_first() -> Held {
    Held(vec![(EngineId::new("e0"), BLOCKS)])
}

const BLOCKS: usize = (PROMPT / BLOCK as u64) as usize;

impl CacheSource for Held {
    fn lookup<'a>(
        &'a self,
        _: Option<&'a str>,
        _: &'a [u32],
        _: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        Box::pin(std::future::ready(Ok(CacheLookup::Answered(
            PrefixHits::new(BLOCKS, BLOCK, self.0.clone()),
        ))))
    }
}

/// Two native reports, so the table measures a prefill speed of 20,000 tokens/s,
/// the second with `waiting_uncached` tokens queued.
fn report(load: &EngineReportedLoadTable, engine: &Engine, waiting_uncached: u64) {
    let native = |tokens: u64, busy_us: u64, waiting: u64| {
        with_native(
            basic_report(1, waiting / 100, 1000, 100_000),
            NativeLoad {
                waiting_uncached_tokens: waiting,
                total_tokens: 1000 + waiting,
                max_running_requests: 64,
                prefill_uncached_tokens_total: tokens,
                prefill_busy_us_total: busy_us,
            },
        )
    };
    load.ingest(engine.id(), 0, native(0, 0, 0), Instant::now())
        .unwrap();
    load.ingest(
        engine.id(),
        0,
        native(20_000, 1_000_000, waiting_uncached),
        Instant::now(),
    )
    .unwrap();
}

fn pick(score: CacheScore, queued_on_holder: u64) -> (String, PickReason, Option<u64>) {
    pick_with(
        CacheAwareConfig {
            score,
            load_bound: None,
            ..CacheAwareConfig::default()
        },
        queued_on_holder,
    )
}

fn pick_with(config: CacheAwareConfig, queued_on_holder: u64) -> (String, PickReason, Option<u64>) {
    pick_in(config, queued_on_holder, on_first(), no_caps(), &[])
}

/// Three engines: `e0` with `queued_on_holder` tokens queued, `e1` idle, `e2` with
/// 2,000; the prompt held as `held` says; `guarded` engines with one request of the
/// router's in flight.
fn pick_in(
    config: CacheAwareConfig,
    queued_on_holder: u64,
    held: Held,
    admission: Arc<AdmissionLimits>,
    guarded: &[usize],
) -> (String, PickReason, Option<u64>) {
    let engines = engines(3);
    let load = table(&engines);
    report(&load, &engines[0], queued_on_holder);
    report(&load, &engines[1], 0);
    report(&load, &engines[2], 2_000);
    let _guards: Vec<_> = guarded
        .iter()
        .map(|&i| load.acquire(engines[i].id()))
        .collect();
    let config = CacheAwareConfig {
        seed: Some(7),
        ..config
    };
    let policy = CacheAwarePolicy::new(Arc::new(held), Arc::clone(&load), admission, config)
        .expect("a valid configuration");
    let tokens: Vec<u32> = (0..PROMPT as u32).collect();
    let request = PickRequest::new(
        RequestFacts::new("m", PROMPT).with_token_ids(Some(&tokens)),
        Role::Plain,
        "b",
    );
    let pick = runtime()
        .block_on(policy.pick(&engines, &request))
        .expect("a pick");
    (
        pick.engine.id().to_string(),
        pick.reason,
        pick.predicted_cached_tokens,
    )
}

#[test]
fn a_holder_wins_while_its_queue_costs_less_than_the_prompt() {
    // e0's queue (2,000 tokens: 100 ms) is shorter than prefilling the prompt
    // elsewhere (4,096 tokens: 205 ms).
    assert_eq!(
        pick(CacheScore::Ttft, 2_000),
        ("e0".into(), PickReason::CacheHit, Some(PROMPT))
    );
}

#[test]
fn a_queue_longer_than_the_prompt_spills_to_the_quickest_engine() {
    // e0: 10,000 queued tokens, 500 ms; e1: the whole prompt, 205 ms; e2: 305 ms.
    assert_eq!(
        pick(CacheScore::Ttft, 10_000),
        ("e1".into(), PickReason::CacheSpill, Some(0))
    );
    // `cached` keeps the holder whatever its queue.
    assert_eq!(
        pick(CacheScore::Cached, 10_000),
        ("e0".into(), PickReason::CacheHit, Some(PROMPT))
    );
}

fn bounded(bound: f64) -> CacheAwareConfig {
    CacheAwareConfig {
        load_bound: Real::new(bound),
        ..CacheAwareConfig::default()
    }
}

#[test]
fn a_holder_over_the_load_bound_spills_to_the_least_pressured_engine_under_it() {
    // e0 holds 101 requests (1 running, 100 waiting), e1 1, e2 21: the bound at
    // 1.25 is ceil(1.25 x 124 / 3) = 52.
    assert_eq!(
        pick_with(bounded(1.25), 10_000),
        ("e1".into(), PickReason::CacheSpill, Some(0))
    );
    // At 3.0 it is 124: e0 is under it and keeps the request.
    assert_eq!(
        pick_with(bounded(3.0), 10_000),
        ("e0".into(), PickReason::CacheHit, Some(PROMPT))
    );
}

#[test]
fn a_load_bound_below_one_is_refused() {
    assert!(bounded(0.9).validate().is_err());
    assert!(bounded(1.0).validate().is_ok());
}

#[test]
fn a_spill_credits_what_its_engine_holds() {
    // e1 holds 512 tokens, too few to be a holder; the spill lands on it and says so.
    let held = Held(vec![
        (EngineId::new("e0"), BLOCKS),
        (EngineId::new("e1"), 32),
    ]);
    assert_eq!(
        pick_in(bounded(1.25), 10_000, held, no_caps(), &[]),
        ("e1".into(), PickReason::CacheSpill, Some(512))
    );
}

#[test]
fn a_spill_admission_refuses_falls_back_to_the_holders() {
    // e1 and e2, under the bound, each have a request in flight: at a cap of one,
    // admission refuses them, and the holder over the bound serves the request.
    assert_eq!(
        pick_in(bounded(1.25), 10_000, on_first(), caps(1), &[1, 2]),
        ("e0".into(), PickReason::CacheHit, Some(PROMPT))
    );
}

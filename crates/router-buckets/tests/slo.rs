//! Buckets with latency targets: those predicted to miss theirs are tried last.

use crate::common;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use router_buckets::{BucketResolver, SloTargets};
use router_policy::{Explanation, Observation, RequestFacts};
use router_state::test_util::{basic_report, with_native};
use router_state::{EngineReportedLoadTable, NativeLoad, Role};
use tokio::time::Instant;

/// Reports `engine` with `waiting_uncached` tokens queued, prefilling 10,000 tokens a
/// second: two reports, so the table measures the speed.
fn prefilling(load: &EngineReportedLoadTable, engine: &str, waiting_uncached: u64) {
    for (tokens, busy_us) in [(0, 0), (10_000, 1_000_000)] {
        let native = NativeLoad {
            waiting_uncached_tokens: waiting_uncached,
            total_tokens: 0,
            max_running_requests: 8,
            prefill_uncached_tokens_total: tokens,
            prefill_busy_us_total: busy_us,
        };
        let report = with_native(basic_report(1, 0, 0, 1000), native);
        load.ingest(&engine.into(), 0, report, Instant::now())
            .expect("a registered engine");
    }
}

struct Fleet {
    load: Arc<EngineReportedLoadTable>,
    resolver: BucketResolver,
    registry: router_state::EngineRegistry,
}

/// `fast` (engine F, 100 ms to first token and 20 ms a token) before `bulk` (engine B,
/// no targets, one request at a time; when `measured`, predicted to meet `fast`'s
/// targets, else with its pace unknown).
fn fleet(measured: bool) -> Fleet {
    fleet_with(measured, None)
}

/// [`fleet`], `bulk` with `bulk_targets` when given.
fn fleet_with(measured: bool, bulk_targets: Option<SloTargets>) -> Fleet {
    let load = Arc::new(EngineReportedLoadTable::default());
    for id in ["F", "B"] {
        load.register(&id.into(), NonZeroU32::MIN);
    }
    let targets = SloTargets {
        ttft_ms: Some(100),
        tpot_ms: Some(20),
    };
    let fast = plain_bucket("fast", None, members(capped(&load, None), &["F"]))
        .with_slo(targets)
        .with_load(Arc::clone(&load));
    let bulk = router_buckets::Bucket::new(
        "bulk",
        1,
        limits(0, None),
        None,
        router_buckets::BucketGroups::Plain(members(capped(&load, Some(1)), &["B"])),
    )
    .expect("valid bucket")
    .with_load(Arc::clone(&load));
    let bulk = match bulk_targets {
        Some(targets) => bulk.with_slo(targets),
        None => bulk,
    };
    prefilling(&load, "B", 0);
    if measured {
        load.observe_tpot(&"B".into(), Duration::from_millis(10));
    }
    Fleet {
        resolver: BucketResolver::new(vec![bulk, fast]).expect("unique ids"),
        registry: registry(&[("F", Role::Plain), ("B", Role::Plain)]),
        load,
    }
}

impl Fleet {
    /// The bucket a 500-token request gets, the buckets whose place changed, and
    /// what the explanation saw of `fast`'s targets.
    fn route(&self) -> (String, Vec<String>, Option<Option<bool>>) {
        self.route_in(&self.resolver)
    }

    fn route_in(&self, resolver: &BucketResolver) -> (String, Vec<String>, Option<Option<bool>>) {
        let explanation = Explanation::recording();
        let request = RequestFacts::new("m", 500).with_explanation(Some(&explanation));
        let selection = runtime()
            .block_on(resolver.select(&self.registry.snapshot(), &request))
            .expect("a selection");
        let seen = explanation
            .observations()
            .into_iter()
            .find_map(|o| match o {
                Observation::Slo { bucket, meets, .. } if bucket == "fast" => Some(meets),
                _ => None,
            });
        (
            selection.pick.bucket.to_string(),
            selection.demoted.iter().map(|b| b.to_string()).collect(),
            seen,
        )
    }
}

#[test]
fn a_bucket_predicted_to_miss_its_targets_is_tried_last() {
    let f = fleet(true);
    assert_eq!(
        f.route(),
        ("fast".into(), vec![], Some(None)),
        "nothing known: the bucket keeps its place"
    );
    prefilling(&f.load, "F", 500);
    f.load.observe_tpot(&"F".into(), Duration::from_millis(15));
    assert_eq!(
        f.route(),
        ("fast".into(), vec![], Some(Some(true))),
        "50 ms queued + 50 ms of its own prompt, 15 ms a token: both met"
    );
    prefilling(&f.load, "F", 600);
    assert_eq!(
        f.route(),
        ("bulk".into(), vec!["fast".into()], Some(Some(false))),
        "60 + 50 ms to the first token: over 100 ms"
    );
    prefilling(&f.load, "F", 0);
    for _ in 0..8 {
        f.load.observe_tpot(&"F".into(), Duration::from_millis(40));
    }
    assert_eq!(
        f.route(),
        ("bulk".into(), vec!["fast".into()], Some(Some(false))),
        "decoding slower than 20 ms a token"
    );
    for _ in 0..8 {
        f.load.observe_tpot(&"B".into(), Duration::from_millis(80));
    }
    assert_eq!(
        f.route(),
        ("fast".into(), vec![], Some(Some(false))),
        "bulk decodes slower still: fast keeps its place"
    );
}

#[test]
fn a_demoted_bucket_still_serves_what_no_other_takes() {
    let f = fleet(true);
    prefilling(&f.load, "F", 5000);
    let _busy = f.load.acquire(&"B".into());
    assert_eq!(
        f.route(),
        ("fast".into(), vec!["fast".into()], Some(Some(false))),
        "bulk, tried first, admits no more: fast, tried last, takes it"
    );
}

#[test]
fn a_bucket_whose_pace_is_unknown_may_meet_the_targets_and_is_tried_first() {
    let f = fleet(false);
    prefilling(&f.load, "F", 5000);
    assert_eq!(
        f.route(),
        ("bulk".into(), vec!["fast".into()], Some(Some(false))),
        "trying bulk is how its pace becomes known"
    );
}

#[test]
fn a_bucket_alone_or_beside_buckets_without_candidates_keeps_its_place() {
    let f = fleet(true);
    prefilling(&f.load, "F", 5000);
    let fast = f.resolver.get("fast").unwrap().clone();
    let alone = BucketResolver::new(vec![fast]).unwrap();
    assert_eq!(
        f.route_in(&alone),
        ("fast".into(), vec![], None),
        "one fitting bucket: nothing to order"
    );
    f.registry
        .set_health("B", router_state::Health::Unhealthy)
        .unwrap();
    assert_eq!(
        f.route(),
        ("fast".into(), vec![], Some(Some(false))),
        "bulk has no candidate: it is no better"
    );
}

#[test]
fn a_bucket_is_not_demoted_behind_one_that_misses_what_it_meets() {
    let f = fleet(true);
    prefilling(&f.load, "F", 1000);
    f.load.observe_tpot(&"F".into(), Duration::from_millis(15));
    for _ in 0..16 {
        f.load.observe_tpot(&"B".into(), Duration::from_millis(500));
    }
    assert_eq!(
        f.route(),
        ("fast".into(), vec![], Some(Some(false))),
        "fast misses its first token (150 ms); bulk's is sooner, but it decodes at 500 ms a token"
    );
}

#[test]
fn buckets_demoted_together_keep_their_order_and_count_as_unmoved() {
    // fast: 150 ms to first token against 100 (its 15 ms a token within 50); bulk:
    // 50 ms within 200, but 40 ms a token against 20. Each is closer to the other's.
    let f = fleet_with(
        true,
        Some(SloTargets {
            ttft_ms: Some(200),
            tpot_ms: Some(20),
        }),
    );
    let fast = f
        .resolver
        .get("fast")
        .unwrap()
        .clone()
        .with_slo(SloTargets {
            ttft_ms: Some(100),
            tpot_ms: Some(50),
        });
    let bulk = f.resolver.get("bulk").unwrap().clone();
    let resolver = BucketResolver::new(vec![fast, bulk]).unwrap();
    prefilling(&f.load, "F", 1000);
    f.load.observe_tpot(&"F".into(), Duration::from_millis(15));
    for _ in 0..16 {
        f.load.observe_tpot(&"B".into(), Duration::from_millis(40));
    }
    assert_eq!(
        f.route_in(&resolver),
        ("fast".into(), vec![], Some(Some(false)))
    );
}

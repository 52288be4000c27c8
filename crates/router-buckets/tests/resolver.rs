//! Bucket resolution: length filtering and ordering.

use crate::common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use router_buckets::{Bucket, BucketError, BucketGroups, BucketResolver, EngineGroup, TokenLimits};
use router_policy::{PickError, expected_peak};

fn bucket(id: &str, rank: i32, min: u64, max: Option<u64>, context: Option<u64>) -> Bucket {
    let group = EngineGroup::new(Arc::new(CountingPolicy::default()));
    Bucket::new(
        id,
        rank,
        limits(min, max),
        context,
        BucketGroups::Plain(group),
    )
    .expect("valid bucket")
}

fn ids(buckets: &[&Bucket]) -> Vec<String> {
    buckets.iter().map(|b| b.id().to_owned()).collect()
}

#[test]
fn orders_by_capacity_then_rank_then_id_with_unbounded_last() {
    let resolver = BucketResolver::new(vec![
        bucket("open", 0, 0, None, None),
        bucket("b-mid", 5, 0, Some(8192), None),
        bucket("a-mid", 5, 0, Some(8192), None),
        bucket("mid-ranked", 1, 0, None, Some(8192)),
        bucket("small", 9, 0, Some(4096), Some(100_000)),
    ])
    .unwrap();
    assert_eq!(
        ids(&resolver.resolve(10, None).unwrap()),
        ["small", "mid-ranked", "a-mid", "b-mid", "open"],
        "capacity is the lesser of the range maximum and the context capacity"
    );
}

#[test]
fn filters_by_inclusive_range_and_by_context_against_the_peak() {
    let resolver = BucketResolver::new(vec![
        bucket("short", 10, 0, Some(4096), Some(8192)),
        bucket("long", 20, 0, Some(131_072), Some(131_072)),
        bucket("min-only", 0, 1000, None, None),
    ])
    .unwrap();
    assert_eq!(
        ids(&resolver.resolve(4096, Some(8192)).unwrap()),
        ["short", "long", "min-only"]
    );
    assert_eq!(
        ids(&resolver.resolve(4096, Some(16_384)).unwrap()),
        ["long", "min-only"],
        "peak over context"
    );
    assert_eq!(
        ids(&resolver.resolve(4097, None).unwrap()),
        ["long", "min-only"],
        "range max is inclusive"
    );
    assert_eq!(
        ids(&resolver.resolve(999, None).unwrap()),
        ["short", "long"],
        "range min is inclusive"
    );
    assert_eq!(ids(&resolver.resolve(200_000, None).unwrap()), ["min-only"]);
    assert!(
        BucketResolver::new(vec![bucket("s", 0, 0, Some(10), None)])
            .unwrap()
            .resolve(11, None)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_peak_below_the_input_is_an_invalid_signal() {
    let resolver = BucketResolver::new(vec![bucket("any", 0, 0, None, None)]).unwrap();
    let err = resolver.resolve(100, Some(99)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid routing signal: expected peak of 99 tokens is below the 100 input tokens"
    );
    assert_eq!(err.code(), "invalid_signal");
}

#[test]
fn the_expected_peak_is_overflow_checked() {
    assert_eq!(expected_peak(10, Some(20)).unwrap(), Some(30));
    assert_eq!(expected_peak(10, None).unwrap(), None);
    let err = expected_peak(u64::MAX, Some(1)).unwrap_err();
    assert!(matches!(err, PickError::InvalidSignal { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "invalid routing signal: {} input tokens plus 1 output tokens overflows",
            u64::MAX
        )
    );
}

#[test]
fn bucket_construction_errors() {
    let group = || BucketGroups::Plain(EngineGroup::new(Arc::new(CountingPolicy::default())));
    let err = |r: Result<Bucket, BucketError>| r.unwrap_err().to_string();
    assert_eq!(
        err(Bucket::new("", 0, TokenLimits::default(), None, group())),
        "bucket id must not be empty"
    );
    assert_eq!(
        err(Bucket::new("b", 0, limits(10, Some(5)), None, group())),
        "bucket b: limits.min (10) is above limits.max (5)"
    );
    assert_eq!(
        err(Bucket::new("b", 0, limits(10, None), Some(9), group())),
        "bucket b: max_context_tokens (9) is below limits.min (10), so no request fits"
    );
    assert_eq!(
        BucketResolver::new(vec![
            bucket("x", 0, 0, None, None),
            bucket("x", 1, 0, None, None)
        ])
        .unwrap_err()
        .to_string(),
        "duplicate bucket id \"x\""
    );
}

fn arbitrary_bucket(i: usize) -> impl Strategy<Value = Bucket> {
    (
        0i32..3,
        0u64..3000,
        proptest::option::of(0u64..6000),
        proptest::option::of(1u64..9000),
    )
        .prop_filter_map("valid bucket", move |(rank, min, max, context)| {
            let group = EngineGroup::new(Arc::new(CountingPolicy::default()));
            Bucket::new(
                format!("b{}", 9 - i % 10),
                rank,
                limits(min, max),
                context,
                BucketGroups::Plain(group),
            )
            .ok()
        })
}

proptest! {
    #[test]
    fn resolution_equals_a_naive_filter_then_sort(
        buckets in (1usize..10).prop_flat_map(|n| (0..n).map(arbitrary_bucket).collect::<Vec<_>>()),
        input in 0u64..7000,
        output in proptest::option::of(0u64..4000),
    ) {
        let peak = output.map(|o| input + o);
        let mut naive: Vec<&Bucket> = buckets
            .iter()
            .filter(|b| {
                let l = b.limits();
                input >= l.min
                    && l.max.is_none_or(|m| input <= m)
                    && b.max_context_tokens().is_none_or(|c| peak.unwrap_or(input) <= c)
            })
            .collect();
        let capacity = |b: &Bucket| match (b.limits().max, b.max_context_tokens()) {
            (Some(m), Some(c)) => Some(m.min(c)),
            (m, c) => m.or(c),
        };
        naive.sort_by(|a, b| {
            let key = |x: &Bucket| (capacity(x).is_none(), capacity(x).unwrap_or(0), x.rank(), x.id().to_owned());
            key(a).cmp(&key(b))
        });
        let resolver = BucketResolver::new(buckets.clone()).expect("ids are unique");
        let resolved = resolver.resolve(input, peak).expect("the peak is at least the input");
        prop_assert_eq!(ids(&resolved), ids(&naive), "resolver order equals a naive filter-then-sort");
    }
}

/// Picks like [`CountingPolicy`] and, saying nothing of it, is taken to read the
/// prompt.
#[derive(Debug, Default)]
struct PromptReader(CountingPolicy);

impl router_policy::Policy for PromptReader {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<router_state::Engine>],
        request: &'a router_policy::PickRequest<'a>,
    ) -> router_policy::BoxFuture<'a, Result<router_policy::Pick, PickError>> {
        self.0.pick(engines, request)
    }
}

#[test]
fn a_route_depends_on_the_prompt_only_through_a_length_bound_or_a_policy_reading_it() {
    let blind = || bucket("open", 0, 0, None, None);
    let routes = |buckets: Vec<Bucket>| BucketResolver::new(buckets).unwrap().routes_on_prompt();
    assert!(!routes(vec![blind()]), "no bound, no reader");
    assert!(routes(vec![blind(), bucket("min", 1, 1, None, None)]));
    assert!(routes(vec![blind(), bucket("max", 1, 0, Some(4096), None)]));
    assert!(routes(vec![blind(), bucket("ctx", 1, 0, None, Some(8192))]));
    let reader = || EngineGroup::new(Arc::new(PromptReader::default()));
    let counter = || EngineGroup::new(Arc::new(CountingPolicy::default()));
    assert!(routes(vec![plain_bucket("plain", None, reader())]));
    assert!(!routes(vec![pd_bucket("pd", None, counter(), counter())]));
    assert!(
        routes(vec![pd_bucket("pd", None, counter(), reader())]),
        "a decode reader"
    );
    assert!(
        routes(vec![pd_bucket("pd", None, reader(), counter())]),
        "a prefill reader"
    );
}

#[test]
fn a_resolver_knows_whether_it_picks_plain_engines() {
    let counter = || EngineGroup::new(Arc::new(CountingPolicy::default()));
    let plain = BucketResolver::new(vec![plain_bucket("p", None, counter())]).unwrap();
    let pd = BucketResolver::new(vec![pd_bucket("pd", None, counter(), counter())]).unwrap();
    assert!(plain.has_plain_bucket());
    assert!(!pd.has_plain_bucket());
}

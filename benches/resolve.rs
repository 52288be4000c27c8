//! `BucketResolver::resolve` over 16 buckets.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use router_buckets::{Bucket, BucketGroups, BucketResolver, EngineGroup, TokenLimits};
use router_policy::{AdmissionLimits, RoundRobinPolicy};
use router_state::EngineReportedLoadTable;

fn resolve(c: &mut Criterion) {
    let load = Arc::new(EngineReportedLoadTable::default());
    let policy = Arc::new(RoundRobinPolicy::new(
        load,
        Arc::new(AdmissionLimits::default()),
    ));
    let buckets = (0..16u64)
        .map(|i| {
            let max = (i < 15).then_some(1024 << (i % 8));
            let limits = TokenLimits {
                min: if i % 4 == 0 { 0 } else { 128 * i },
                max,
            };
            Bucket::new(
                format!("bucket-{i:02}"),
                (i % 3) as i32,
                limits,
                max.map(|m| m * 2),
                BucketGroups::Plain(EngineGroup::new(policy.clone())),
            )
            .expect("valid bucket")
        })
        .collect();
    let resolver = BucketResolver::new(buckets).expect("unique ids");
    c.bench_function("resolve_16_buckets", |b| {
        b.iter(|| {
            resolver
                .resolve(black_box(1500), black_box(Some(3000)))
                .expect("valid signal")
        })
    });
}

criterion_group!(benches, resolve);
criterion_main!(benches);

//! What a replayable decision record (`decisions.replayable`) costs a recorded
//! request beyond the record itself: its prompt's pages hashed as the prefix index
//! hashes them, each keyed, written in hex, and the object serialized, for prompts of
//! 1,024, 4,096 and 32,768 tokens in pages of 16.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hash::RandomState;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use router_http::bench_kit;

// The allocator the switchyard binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BLOCK: u32 = 16;

fn bench_replay_fields(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision_record");
    let key = RandomState::new();
    for tokens in [1024u32, 4096, 32_768] {
        let ids: Vec<u32> = (0..tokens)
            .map(|t| t.wrapping_mul(2_654_435_761) % 50_000)
            .collect();
        group.throughput(Throughput::Elements(u64::from(tokens)));
        group.bench_with_input(BenchmarkId::new("replay_fields", tokens), &ids, |b, ids| {
            b.iter(|| bench_kit::replay_fields(black_box(ids), BLOCK, &key));
        });
    }
    group.finish();
}

criterion_group!(benches, bench_replay_fields);
criterion_main!(benches);

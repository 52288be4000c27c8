//! Prefix-cache hot paths: applying stored blocks from KV events, looking a long
//! prompt up over many engines, and hashing a long prompt.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use router_state::EngineId;
use router_state::kv_events::{BlockStored, IndexConfig, KvBatch, KvEvent, PrefixIndex, Tier};

const BLOCK: u32 = 16;

fn config() -> IndexConfig {
    IndexConfig {
        block_size: BLOCK,
        ..IndexConfig::default()
    }
}

/// One batch storing `blocks` pages of `tokens`, continuing `parent`.
fn batch(first_hash: u64, blocks: usize, parent: Option<u64>, tokens: &[u32]) -> KvBatch {
    KvBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (first_hash..first_hash + blocks as u64).collect(),
            parent,
            tokens: tokens.to_vec(),
            block_size: BLOCK,
            tier: Tier::Device,
            namespace: None,
            group_idx: None,
            group_kind: None,
        })],
        dp_rank: Some(0),
        dropped: Vec::new(),
    }
}

/// 512 conversations of 64 pages, announced 16 pages per batch as an engine
/// prefills them: 32,768 stored blocks.
fn conversations() -> Vec<KvBatch> {
    let mut batches = Vec::new();
    let mut next_hash = 1u64;
    for conversation in 0..512u32 {
        let tokens: Vec<u32> = (0..64 * BLOCK)
            .map(|i| conversation * 100_000 + i)
            .collect();
        let mut parent = None;
        for part in tokens.chunks(16 * BLOCK as usize) {
            batches.push(batch(next_hash, 16, parent, part));
            next_hash += 16;
            parent = Some(next_hash - 1);
        }
    }
    batches
}

fn apply(c: &mut Criterion) {
    let batches = conversations();
    let engine = EngineId::from("E0");
    let mut group = c.benchmark_group("prefix_index");
    group.throughput(Throughput::Elements(32_768));
    group.bench_function("apply_stored/32768_blocks", |b| {
        b.iter_batched(
            || PrefixIndex::new(config()),
            |index| {
                for batch in &batches {
                    index.apply(&engine, 0, batch);
                }
                index
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

fn lookup(c: &mut Criterion) {
    // One 2,048-page prompt; engine i holds its first 32 * (i + 1) pages.
    let tokens: Vec<u32> = (0..2048 * BLOCK).collect();
    let index = PrefixIndex::new(config());
    for i in 0..64u32 {
        let pages = 32 * (i as usize + 1);
        let engine = EngineId::from(format!("E{i:02}").as_str());
        let held = &tokens[..pages * BLOCK as usize];
        index.apply(&engine, 0, &batch(1, pages, None, held));
    }
    let chain = index.request_hashes(None, &tokens);
    let mut group = c.benchmark_group("prefix_index");
    group.bench_function("lookup/2048_blocks_64_engines", |b| {
        b.iter(|| black_box(index.lookup(black_box(&chain))));
    });
    group.finish();
}

fn hash(c: &mut Criterion) {
    let index = PrefixIndex::new(config());
    let tokens: Vec<u32> = (0..32_768u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut group = c.benchmark_group("prefix_index");
    group.throughput(Throughput::Elements(32_768));
    group.bench_function("hash/32768_tokens", |b| {
        b.iter(|| black_box(index.request_hashes(None, black_box(&tokens))));
    });
    group.finish();
}

criterion_group!(benches, apply, lookup, hash);
criterion_main!(benches);

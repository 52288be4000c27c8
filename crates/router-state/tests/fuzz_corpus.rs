//! Replays the decoder fuzz target's corpus (`fuzz/corpus/kv_batch`: golden frames of
//! the real publishers and hostile shapes) and mutations of it, checking that the
//! decoder never panics and that whatever it accepts is well formed and safe to
//! apply. `cargo fuzz run kv_batch` (nightly) explores further from the same corpus.

use std::path::PathBuf;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use rmpv::Value;
use router_state::EngineId;
use router_state::kv_events::{IndexConfig, KvEvent, PrefixIndex, decode_batch};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/kv_batch");
    let mut entries: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&path).expect("a readable corpus file"))
        })
        .collect();
    entries.sort();
    entries
}

/// What the fuzz target does with one input, plus the decoder's promises.
fn exercise(input: &[u8]) -> bool {
    let Ok(batch) = decode_batch(input) else {
        return false;
    };
    let index = PrefixIndex::new(IndexConfig::default());
    let engine = EngineId::from("E1");
    let outcome = index.apply(&engine, 0, &batch);
    let announced: usize = batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(stored) => stored.block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert!(
        outcome.stored <= announced,
        "only announced pages are stored"
    );
    for event in &batch.events {
        if let KvEvent::Stored(stored) = event {
            index.lookup(&index.request_hashes(stored.namespace.as_deref(), &stored.tokens));
        }
    }
    index.remove_engine(&engine);
    assert_eq!(index.size().entries, 0);
    true
}

#[test]
fn the_corpus_decodes_without_panicking_and_every_golden_frame_is_accepted() {
    let corpus = corpus();
    assert!(corpus.len() >= 20, "the corpus is in place");
    for (name, input) in &corpus {
        let accepted = exercise(input);
        if name.starts_with("golden-") {
            assert!(accepted, "{name} is a real publisher's batch");
        }
        if name.starts_with("edge-") {
            assert!(!accepted, "{name} is not a batch");
        }
    }
}

fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let golden: Vec<Vec<u8>> = corpus()
        .into_iter()
        .filter(|(name, _)| name.starts_with("golden-"))
        .map(|(_, input)| input)
        .collect();
    (
        proptest::sample::select(golden),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..6),
    )
        .prop_map(|(mut input, edits)| {
            for (at, byte, kind) in edits {
                if input.is_empty() {
                    break;
                }
                let i = at.index(input.len());
                match kind {
                    0 => input[i] = byte,
                    1 => input.truncate(i),
                    _ => input.insert(i, byte),
                }
            }
            input
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn mutated_frames_never_panic(input in mutated()) {
        exercise(&input);
    }

    #[test]
    fn structured_batches_never_panic(input in structured_batch()) {
        exercise(&input);
    }
}

/// Any msgpack scalar, with the tags and media a batch names among them.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0_u64..64).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-z_]{0,10}".prop_map(Value::from),
        prop::sample::select(vec![
            "BlockStored",
            "GPU",
            "CPU_TIERED",
            "DISK",
            "full_attention",
            "sliding_window",
        ])
        .prop_map(Value::from),
    ]
}

/// Any msgpack value up to three levels deep.
fn anything() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((scalar(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

/// Mostly the well-formed `field`, sometimes anything at all.
fn or_anything(field: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    prop_oneof![4 => field, 1 => anything()]
}

fn hash_list(n: usize) -> impl Strategy<Value = Value> {
    prop::collection::vec(any::<u64>().prop_map(Value::from), n).prop_map(Value::Array)
}

/// A `BlockStored` event, as an array (legacy positions) or a map, whose fields are
/// mostly well formed and consistent (tokens = pages x page size).
fn stored_event() -> impl Strategy<Value = Value> {
    (0_usize..4, prop::sample::select(vec![4_usize, 16]))
        .prop_flat_map(|(pages, block)| {
            (
                or_anything(hash_list(pages)),
                or_anything(prop_oneof![
                    Just(Value::Nil),
                    any::<u64>().prop_map(Value::from)
                ]),
                or_anything(
                    prop::collection::vec((0_u64..1000).prop_map(Value::from), pages * block)
                        .prop_map(Value::Array),
                ),
                or_anything(Just(Value::from(block as u64))),
                or_anything(prop_oneof![
                    Just(Value::Nil),
                    Just(Value::from("GPU")),
                    Just(Value::from("CPU_TIERED"))
                ]),
                any::<bool>(),
            )
        })
        .prop_map(|(hashes, parent, tokens, block, medium, as_map)| {
            if as_map {
                Value::Map(vec![
                    (Value::from("type"), Value::from("BlockStored")),
                    (Value::from("block_hashes"), hashes),
                    (Value::from("parent_block_hash"), parent),
                    (Value::from("token_ids"), tokens),
                    (Value::from("block_size"), block),
                    (Value::from("medium"), medium),
                ])
            } else {
                Value::Array(vec![
                    Value::from("BlockStored"),
                    hashes,
                    parent,
                    tokens,
                    block,
                    Value::Nil,
                    medium,
                ])
            }
        })
}

fn event() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => stored_event(),
        2 => (0_usize..4)
            .prop_flat_map(|n| (or_anything(hash_list(n)), or_anything(Just(Value::Nil))))
            .prop_map(|(hashes, medium)| Value::Array(vec![Value::from("BlockRemoved"), hashes, medium])),
        1 => Just(Value::Array(vec![Value::from("AllBlocksCleared")])),
        1 => anything(),
    ]
}

/// A KV-event batch (`[ts, events, dp_rank]`) in msgpack: mostly well formed, with
/// wrong types, shapes and values mixed in at every level.
fn structured_batch() -> impl Strategy<Value = Vec<u8>> {
    (
        or_anything(any::<f64>().prop_map(Value::from)),
        prop::collection::vec(event(), 0..6),
        or_anything(prop_oneof![
            Just(Value::Nil),
            (0_u64..4).prop_map(Value::from)
        ]),
    )
        .prop_map(|(ts, events, rank)| {
            let batch = Value::Array(vec![ts, Value::Array(events), rank]);
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &batch).expect("writing to a Vec");
            bytes
        })
}

#[test]
fn most_structured_batches_get_past_the_decoder() {
    let mut runner = TestRunner::deterministic();
    let strategy = structured_batch();
    let accepted = (0..256)
        .filter(|_| exercise(&strategy.new_tree(&mut runner).expect("a batch").current()))
        .count();
    assert!(
        accepted >= 128,
        "only {accepted} of 256 batches were decoded"
    );
}

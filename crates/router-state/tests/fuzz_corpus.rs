//! Replays the decoder fuzz target's corpus (`fuzz/corpus/kv_batch`: golden frames of
//! the real publishers and hostile shapes) and mutations of it, checking that the
//! decoder never panics and that whatever it accepts is well formed and safe to
//! apply. `cargo fuzz run kv_batch` (nightly) explores further from the same corpus.

use std::path::PathBuf;

use proptest::prelude::*;
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
            index.lookup(&index.request_hashes(&stored.tokens));
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
    fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..256)) {
        exercise(&input);
    }
}

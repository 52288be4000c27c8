//! Fuzzes the KV-event batch decoder and applies whatever it accepts to an index.
//! The corpus in `corpus/kv_batch` is replayed on stable by
//! `crates/router-state/tests/fuzz_corpus.rs`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use router_state::EngineId;
use router_state::kv_events::{IndexConfig, KvEvent, PrefixIndex, decode_batch};

fuzz_target!(|input: &[u8]| {
    let Ok(batch) = decode_batch(input) else {
        return;
    };
    let index = PrefixIndex::new(IndexConfig::default());
    let engine = EngineId::from("E1");
    index.apply(&engine, 0, &batch);
    for event in &batch.events {
        if let KvEvent::Stored(stored) = event {
            index.lookup(&index.request_hashes(stored.namespace.as_deref(), &stored.tokens));
        }
    }
    index.remove_engine(&engine);
    assert_eq!(index.size().entries, 0);
});

//! Fuzzes the upstream client's response decoder: the first byte picks how the rest
//! is cut into reads, and the outcome must not depend on the cuts. The corpus in
//! `corpus/h1_response` is replayed on stable by
//! `crates/router-upstream/src/fuzzing/tests.rs`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use router_upstream::fuzzing::decode_response;

fuzz_target!(|input: &[u8]| {
    let Some((&step, wire)) = input.split_first() else {
        return;
    };
    let step = usize::from(step.max(1));
    let cuts: Vec<usize> = (step..wire.len()).step_by(step).collect();
    let whole = decode_response(wire, &[]).ok();
    assert_eq!(whole, decode_response(wire, &cuts).ok());
});

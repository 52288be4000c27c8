//! Fuzzes a whole exchange of the upstream client over an in-memory pipe: the client
//! writes its request, and the input is the engine's answer (its first byte the
//! read size). No panic, at most `MOST_BUFFERED` bytes held undecoded, and an
//! accepted answer equals what the response decoder makes of the same bytes. The
//! corpus in `corpus/h1_exchange` is replayed on stable by
//! `crates/router-upstream/src/fuzzing/tests.rs`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use router_upstream::fuzzing::check_exchange;

fuzz_target!(|input: &[u8]| check_exchange(input));

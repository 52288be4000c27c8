//! Replays the `h1_response` fuzz target's corpus (`fuzz/corpus/h1_response`: real
//! engine answers and hostile shapes) and mutations of it. The decoder must never
//! panic, and its outcome must not depend on how the socket cut the bytes into
//! reads. `cargo +nightly fuzz run h1_response` explores further from the same corpus.
//! The `h1_exchange` target's corpus is replayed through the same checks as the
//! target makes.

use std::path::PathBuf;

use proptest::prelude::*;

use super::*;

fn corpus() -> Vec<(String, Vec<u8>)> {
    corpus_of("h1_response")
}

fn corpus_of(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
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

/// The outcome without the error's wording: a limit may be noticed at a different
/// point of the input depending on the reads, but never accepted in one case and
/// refused in another.
fn outcome(wire: &[u8], cuts: &[usize]) -> Option<Decoded> {
    decode_response(wire, cuts).ok()
}

#[test]
fn real_answers_decode_whole_and_hostile_shapes_are_refused() {
    let corpus = corpus();
    assert!(corpus.len() >= 20, "the corpus is in place");
    for (name, input) in &corpus {
        let decoded = decode_response(input, &[]);
        if name.starts_with("golden-") {
            let decoded = decoded.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(decoded.complete, "{name} is a whole answer");
        } else if name.starts_with("edge-") {
            assert!(decoded.is_err(), "{name} is refused: {decoded:?}");
        }
    }
    let sse = corpus
        .iter()
        .find(|(name, _)| name == "golden-sse-chunked")
        .expect("the SSE answer");
    let decoded = decode_response(&sse.1, &[]).unwrap();
    assert!(decoded.body.starts_with(b"data: {"));
    assert!(decoded.body.ends_with(b"data: [DONE]\n\n"));
    let interim = decode_response(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        &[],
    )
    .unwrap();
    assert_eq!(
        (interim.status, interim.body.as_slice()),
        (StatusCode::OK, &b"ok"[..])
    );
}

#[test]
fn limits_hold_whether_the_bytes_arrive_in_one_read_or_many() {
    for (name, input) in corpus() {
        let whole = outcome(&input, &[]);
        // Byte by byte, or in 512 small reads for the inputs past the limits (each
        // read re-parses the head so far).
        let step = (input.len() / 512).max(1);
        let small_reads: Vec<usize> = (0..input.len()).step_by(step).collect();
        assert_eq!(
            whole,
            outcome(&input, &small_reads),
            "{name}: the same outcome read in one piece and in small reads"
        );
    }
}

#[test]
fn a_line_or_head_at_its_limit_decodes_alike_wherever_a_read_cuts_it() {
    let at_limits: Vec<_> = corpus()
        .into_iter()
        .filter(|(name, _)| name.contains("-limit"))
        .collect();
    assert_eq!(
        at_limits.len(),
        4,
        "a chunk line and a head, at and past their limits"
    );
    for (name, input) in at_limits {
        // The end of the long line: the chunk-size line, or the head's last field.
        let end = 1000
            + input[1000..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("a long line");
        let whole = outcome(&input, &[]);
        assert_eq!(whole.is_some(), name.starts_with("golden-"), "{name}");
        for cut in end - 4..=end + 4 {
            assert_eq!(whole, outcome(&input, &[cut]), "{name} cut at {cut}");
        }
    }
}

#[test]
fn the_exchange_corpus_passes_the_targets_checks_in_any_read_size() {
    let corpus = corpus_of("h1_exchange");
    assert!(corpus.len() >= 8, "the corpus is in place");
    for (name, input) in &corpus {
        let (_, wire) = input.split_first().expect("a read size and an answer");
        for read in [1, 2, 7, 64, 255] {
            check_exchange(&[&[read][..], wire].concat());
        }
        check_exchange(input);
        let outcome = exchange_in_reads(wire, usize::from(input[0])).outcome;
        if name.starts_with("golden-") {
            let answer = outcome.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                !answer.body.is_empty() || answer.status.as_u16() == 204,
                "{name}"
            );
        } else {
            assert!(outcome.is_err(), "{name} is refused: {outcome:?}");
        }
    }
}

#[test]
fn an_exchange_holds_no_more_than_a_head_undecoded() {
    let mut endless = b"HTTP/1.1 200 OK\r\nx-long: ".to_vec();
    endless.resize(MOST_BUFFERED * 2, b'a');
    let exchanged = exchange_in_reads(&endless, 4096);
    assert!(matches!(
        exchanged.outcome,
        Err(H1Error::Malformed("response head too large"))
    ));
    assert!(exchanged.most_buffered <= MOST_BUFFERED);
}

fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let inputs: Vec<Vec<u8>> = corpus().into_iter().map(|(_, input)| input).collect();
    (
        proptest::sample::select(inputs),
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
    fn mutated_answers_decode_alike_whatever_the_reads(
        input in mutated(),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        prop_assert_eq!(outcome(&input, &[]), outcome(&input, &cuts));
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        input in proptest::collection::vec(any::<u8>(), 0..512),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        prop_assert_eq!(outcome(&input, &[]), outcome(&input, &cuts));
    }
}

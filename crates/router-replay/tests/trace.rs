//! The trace format: what reads, what is refused and where.

use router_replay::{
    MAX_LINE_BYTES, Segment, TraceError, TraceRequest, oracle_cached_tokens, read_trace,
    write_trace,
};

fn named(id: &str, tokens: u32) -> Segment {
    Segment::Named {
        id: id.into(),
        tokens,
    }
}

fn request(at_us: u64, session: &str, prompt: Vec<Segment>) -> TraceRequest {
    TraceRequest {
        at_us,
        model: None,
        session: Some(session.into()),
        prompt,
        output_tokens: 8,
    }
}

fn line_error(text: &str) -> (usize, String) {
    match read_trace(text.as_bytes()) {
        Err(TraceError::Line { line, message }) => (line, message),
        other => panic!("expected a line error, got {other:?}"),
    }
}

#[test]
fn a_written_trace_reads_back_and_blank_lines_are_skipped() {
    let trace = vec![
        request(0, "a", vec![named("s", 40)]),
        TraceRequest {
            model: Some("m".into()),
            ..request(
                5,
                "b",
                vec![Segment::Recorded {
                    token_ids: vec![1, 2, 3],
                }],
            )
        },
    ];
    let mut out = Vec::new();
    write_trace(&mut out, &trace).unwrap();
    out.extend_from_slice(b"\n  \n");
    assert_eq!(read_trace(out.as_slice()).unwrap(), trace);
}

#[test]
fn named_segments_draw_the_same_tokens_for_the_same_id() {
    let a = request(0, "a", vec![named("s", 40), named("x", 8)]);
    let b = request(0, "b", vec![named("s", 40), named("y", 8)]);
    assert_eq!(a.tokens()[..40], b.tokens()[..40]);
    assert_ne!(a.tokens()[40..], b.tokens()[40..]);
    assert_eq!(a.tokens().len(), 48);
}

#[test]
fn bad_lines_are_refused_with_their_number() {
    let (line, message) =
        line_error("{\"at_us\": 0, \"prompt\": [], \"output_tokens\": 1}\nnot json\n");
    assert_eq!(line, 2, "{message}");
    let (line, message) = line_error(
        "{\"at_us\": 9, \"prompt\": [], \"output_tokens\": 1}\n{\"at_us\": 3, \"prompt\": [], \"output_tokens\": 1}\n",
    );
    assert_eq!(line, 2);
    assert!(message.contains("arrival order"), "{message}");
    let (_, message) = line_error(
        "{\"at_us\": 0, \"prompt\": [{\"id\": \"s\", \"tokens\": 2000000}], \"output_tokens\": 1}\n",
    );
    assert!(message.contains("prompt is longer"), "{message}");
    let (_, message) =
        line_error("{\"at_us\": 0, \"prompt\": [], \"output_tokens\": 1, \"extra\": 1}\n");
    assert!(message.contains("unknown field"), "{message}");
}

#[test]
fn a_line_past_the_bound_is_refused_before_it_is_parsed() {
    let mut text = vec![b' '; MAX_LINE_BYTES + 1];
    text.push(b'\n');
    let (line, message) = match read_trace(text.as_slice()) {
        Err(TraceError::Line { line, message }) => (line, message),
        other => panic!("expected a line error, got {other:?}"),
    };
    assert_eq!(line, 1);
    assert!(message.contains("longer than"), "{message}");
}

#[test]
fn the_oracle_counts_full_pages_of_the_longest_shared_run_of_segments() {
    let trace = [
        request(0, "a", vec![named("s", 40), named("a0", 10)]),
        // The system prompt, seen before: 2 full pages of its 40 tokens.
        request(1, "b", vec![named("s", 40), named("b0", 10)]),
        // All of a's first prompt (50 tokens: 3 pages), then new tokens.
        request(
            2,
            "a",
            vec![named("s", 40), named("a0", 10), named("a1", 20)],
        ),
        // Nothing seen.
        request(3, "c", vec![named("t", 40)]),
    ];
    assert_eq!(oracle_cached_tokens(&trace, 16), 32 + 48);
}

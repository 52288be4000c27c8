use serde_json::{Value, json};

use super::*;
use crate::report::oracle_cached_tokens;

/// A replayable record: arriving at `arrival` us, its prompt `pages` (hex) and
/// `prompt_tokens`, answered with `status`.
fn record(id: &str, arrival: u64, pages: &str, prompt_tokens: u64, status: u16) -> Value {
    json!({
        "request_id": id,
        "model": "m",
        "request": {"session_key": format!("s-{id}"), "max_output_tokens": 50, "stream": true},
        "pick": {"engines": {"plain": {"engine": format!("E{}", arrival / 100 % 2), "reason": "cache_hit"}}},
        "replay": {"arrival_unix_us": arrival, "prompt_tokens": prompt_tokens, "block_size": 4, "pages": pages},
        "result": {"status": status, "outcome": "ok", "code": if status == 503 { "at_capacity" } else { "ok" },
                   "first_byte_ms": 2.5, "duration_ms": 10.0, "prompt_tokens": prompt_tokens,
                   "cached_tokens": 4, "completion_tokens": 7},
    })
}

fn lines(records: &[Value]) -> String {
    records.iter().map(|r| format!("{r}\n")).collect()
}

fn read(text: &str) -> Result<Recorded, TraceError> {
    read_records(vec![text.as_bytes()])
}

const A: &str = "00000000000000aa";
const B: &str = "00000000000000bb";
const C: &str = "00000000000000cc";

#[test]
fn records_become_a_trace_in_arrival_order_with_what_happened() {
    let mut unpaged = record("r4", 1_000_900, "", 9, 200);
    unpaged["replay"].as_object_mut().unwrap().remove("pages");
    unpaged["request"] = json!({"routing_key": "k", "max_output_tokens": 12});
    unpaged["result"]
        .as_object_mut()
        .unwrap()
        .remove("completion_tokens");
    let text = lines(&[
        // Written as the requests ended, not as they came.
        record("r2", 1_000_500, &format!("{A}{C}"), 10, 200),
        record("r1", 1_000_000, &format!("{A}{B}"), 8, 200),
        json!({"request_id": "old", "model": "m", "result": {"status": 200}}),
        record("r3", 1_000_700, A, 4, 503),
        unpaged,
    ]);
    let recorded = read(&format!("\n{text}\n")).unwrap();
    assert_eq!(recorded.not_replayable, 1);
    assert_eq!(recorded.without_pages, 1);
    assert_eq!(recorded.without_output, 1);
    assert_eq!(recorded.page_tokens, Some(4));
    let trace = &recorded.trace;
    let at: Vec<u64> = trace.iter().map(|r| r.at_us).collect();
    assert_eq!(at, [0, 500, 700, 900]);
    assert_eq!(trace[0].session.as_deref(), Some("s-r1"));
    assert_eq!(trace[3].session.as_deref(), Some("k"), "the routing key");
    assert_eq!(trace[0].output_tokens, 7, "the tokens the answer reported");
    assert_eq!(trace[3].output_tokens, 12, "else max_tokens");
    assert_eq!(trace[0].model.as_deref(), Some("m"));
    assert_eq!(
        trace[0].prompt,
        [Segment::Pages {
            pages: PageHashes(vec![0xaa, 0xbb]),
            page_tokens: 4,
        }]
    );
    // Two pages of 4 and 2 tokens more, drawn for this request alone.
    assert_eq!(trace[1].prompt_tokens(), 10);
    assert!(matches!(
        &trace[1].prompt[1],
        Segment::Named { tokens: 2, .. }
    ));
    assert_eq!(trace[3].prompt_tokens(), 9);
    assert!(matches!(
        &trace[3].prompt[..],
        [Segment::Named { tokens: 9, .. }]
    ));
    let happened = recorded.happened.outcomes();
    assert_eq!(happened[0].ttft_us, Some(2_500));
    assert_eq!(happened[1].finished_us, Some(500 + 10_000));
    assert_eq!(happened[0].cached_tokens, 4);
    assert_eq!(happened[0].reason.as_deref(), Some("cache_hit"));
    assert!(happened[2].rejected && !happened[2].failed);
    assert_eq!(happened[2].ttft_us, None);
    let summary = recorded.happened.summary("recorded", 0);
    assert_eq!(summary.requests, 4);
    assert_eq!(summary.rejected, 1);
    assert_eq!(
        summary
            .engine_load
            .iter()
            .map(|(e, _)| e.as_str())
            .collect::<Vec<_>>(),
        ["E0", "E1"]
    );
}

#[test]
fn prompts_share_exactly_the_pages_their_hashes_share() {
    let text = lines(&[
        record("r1", 10, &format!("{A}{B}{C}"), 13, 200),
        record("r2", 20, &format!("{A}{B}{A}"), 12, 200),
        record("r3", 30, &format!("{B}{A}"), 8, 200),
    ]);
    let trace = read(&text).unwrap().trace;
    let tokens: Vec<Vec<u32>> = trace.iter().map(TraceRequest::tokens).collect();
    assert_eq!(tokens[0].len(), 13);
    assert_eq!(tokens[0][..8], tokens[1][..8], "two pages shared");
    assert_ne!(tokens[0][8..12], tokens[1][8..12]);
    assert_ne!(tokens[0][..4], tokens[2][..4]);
    // The oracle credits the shared pages: two of the second prompt.
    assert_eq!(oracle_cached_tokens(&trace, 4), 8);
}

#[test]
fn records_from_several_files_are_read_as_one() {
    let older = lines(&[record("r1", 10, A, 4, 200)]);
    let newer = lines(&[record("r2", 5, B, 4, 200)]);
    let recorded = read_records(vec![older.as_bytes(), newer.as_bytes()]).unwrap();
    let at: Vec<u64> = recorded.trace.iter().map(|r| r.at_us).collect();
    assert_eq!(at, [0, 5]);
    assert_eq!(recorded.trace[0].session.as_deref(), Some("s-r2"));
}

#[test]
fn a_malformed_record_is_refused_with_its_line() {
    let good = lines(&[record("r1", 10, A, 4, 200)]);
    let message = |text: String| read(&text).unwrap_err().to_string();
    let bad_hex = record("r2", 20, "00000000000000zz", 4, 200);
    assert!(
        message(format!("{good}{bad_hex}\n"))
            .starts_with("trace line 2: (records 1) pages hold lowercase hex digits only")
    );
    let short = record("r2", 20, "abc", 4, 200);
    assert!(message(format!("{good}{short}\n")).contains("pages take 16 hex digits each"));
    let long = record("r2", 20, &format!("{A}{B}"), 7, 200);
    assert_eq!(
        message(format!("{good}{long}\n")),
        "trace line 2: (records 1) 2 pages of 4 tokens are more than the prompt's 7 tokens"
    );
    let mut other_size = record("r2", 20, A, 8, 200);
    other_size["replay"]["block_size"] = json!(8);
    assert!(
        message(format!("{good}{other_size}\n"))
            .contains("pages of 8 tokens after records with pages of 4")
    );
    let huge = record("r2", 20, "", MAX_PROMPT_TOKENS + 1, 200);
    assert!(message(format!("{good}{huge}\n")).contains("the prompt is longer than"));
    assert!(message(format!("{good}not json\n")).starts_with("trace line 2: (records 1) "));
    let late = record("r2", 10 + MAX_AT_US + 1, A, 4, 200);
    assert!(message(format!("{good}{late}\n")).contains("the arrivals span more than"));
    let upper = record("r2", 20, "00000000000000AA", 4, 200);
    assert!(message(format!("{good}{upper}\n")).contains("lowercase hex digits only"));
    let signed = record("r2", 20, "+00000000000000a", 4, 200);
    assert!(message(format!("{good}{signed}\n")).contains("lowercase hex digits only"));
    let mut odd_pick = record("r2", 20, A, 4, 200);
    odd_pick["pick"] = json!("e0");
    assert!(message(format!("{good}{odd_pick}\n")).contains("pick: "));
}

#[test]
fn only_an_answer_that_ended_well_is_served_and_refusals_of_any_kind_are_rejected() {
    let mut cut = record("r2", 20, A, 4, 200);
    cut["result"]["outcome"] = json!("server_error");
    let mut left = record("r3", 30, A, 4, 200);
    left["result"]["outcome"] = json!("cancelled");
    let mut queue_full = record("r4", 40, A, 4, 503);
    queue_full["result"]["code"] = json!("queue_full");
    let mut tenant = record("r5", 50, A, 4, 429);
    tenant["result"]["code"] = json!("tenant_over_cap");
    let mut endless = record("r6", 60, A, 4, 200);
    endless["result"]["duration_ms"] = json!(1e300);
    endless["result"]["cached_tokens"] = json!(u64::MAX);
    let mut short = record("r7", 70, "", 3, 200);
    short["replay"]["block_size"] = json!(64);
    // Records of another kind without a replay object are skipped, whatever they hold.
    let other = json!({"pick": "anything", "result": 7});
    let text = lines(&[
        record("r1", 10, A, 4, 200),
        cut,
        left,
        queue_full,
        tenant,
        endless,
        short,
        other,
    ]);
    let recorded = read(&text).unwrap();
    assert_eq!(recorded.not_replayable, 1);
    assert_eq!(
        recorded.page_tokens,
        Some(4),
        "a prompt under a page sets no size"
    );
    let happened = recorded.happened.outcomes();
    let served: Vec<bool> = happened.iter().map(|o| o.ttft_us.is_some()).collect();
    assert_eq!(served, [true, false, false, false, false, true, true]);
    assert!(happened[1].failed && happened[2].failed);
    assert!(happened[3].rejected && happened[4].rejected);
    assert_eq!(
        happened[5].finished_us,
        Some(50 + MAX_AT_US),
        "held to the span"
    );
    assert_eq!(happened[5].cached_tokens, 4, "never more than the prompt");
    let summary = recorded.happened.summary("recorded", 0);
    assert_eq!((summary.rejected, summary.failed), (2, 2));
}

#[test]
fn a_retried_request_is_the_last_engine_picked_for_it() {
    let mut retried = record("r1", 10, A, 4, 200);
    retried["result"]["retries"] = json!([
        {"failed": "E0", "reason": "status_503", "then": {"plain": {"engine": "E7", "reason": "round_robin"}}},
        {"failed": "E7", "reason": "connect", "then": {"plain": {"engine": "E9", "reason": "round_robin"}}},
    ]);
    let recorded = read(&lines(&[retried])).unwrap();
    let outcome = &recorded.happened.outcomes()[0];
    assert_eq!(recorded.happened.engines()[outcome.engine.unwrap()], "E9");
    assert_eq!(outcome.reason.as_deref(), Some("round_robin"));
}

use super::*;
use crate::trace::Segment;

fn request(at_us: u64) -> TraceRequest {
    TraceRequest {
        at_us,
        model: None,
        session: Some(format!("s{at_us}")),
        prompt: vec![Segment::Named {
            id: "p".into(),
            tokens: 32,
        }],
        output_tokens: 4,
    }
}

fn outcome(request: &TraceRequest, engine: usize, ttft_us: Option<u64>) -> Outcome {
    let mut outcome = Outcome::arrived(request);
    outcome.engine = Some(engine);
    outcome.reason = Some("cache_hit".into());
    outcome.ttft_us = ttft_us;
    outcome.finished_us = ttft_us.map(|t| request.at_us + t + 100);
    outcome.rejected = ttft_us.is_none();
    outcome
}

/// A run over engines `a` and `b`.
fn on_two_engines(outcomes: Vec<Outcome>) -> RunReport {
    RunReport::new(outcomes, vec!["a".to_owned(), "b".to_owned()])
}

/// `before` and `after` compared, named `a.yaml` and `b.yaml`.
fn compare(trace: &[TraceRequest], before: &RunReport, after: &RunReport, top: usize) -> Diff {
    let summaries = (before.summary("a.yaml", 0), after.summary("b.yaml", 0));
    Diff::of(trace, summaries, before, after, top)
}

#[test]
fn the_requests_that_moved_most_come_first_and_those_that_did_not_are_left_out() {
    let trace: Vec<TraceRequest> = (0..4).map(|i| request(i * 1000)).collect();
    let before = on_two_engines(vec![
        outcome(&trace[0], 0, Some(500)),
        outcome(&trace[1], 0, Some(500)),
        outcome(&trace[2], 0, Some(500)),
        outcome(&trace[3], 0, Some(500)),
    ]);
    let after = on_two_engines(vec![
        outcome(&trace[0], 0, Some(500)),
        outcome(&trace[1], 1, Some(900)),
        outcome(&trace[2], 1, None),
        outcome(&trace[3], 1, Some(5_500)),
    ]);
    let diff = compare(&trace, &before, &after, 10);
    let order: Vec<usize> = diff.requests.iter().map(|r| r.index).collect();
    assert_eq!(
        order,
        [2, 3, 1],
        "served in one run first, then the largest move"
    );
    assert_eq!(diff.requests[0].after.outcome, "rejected");
    assert_eq!(diff.requests[1].before.engine.as_deref(), Some("a"));
    assert_eq!(diff.requests[1].after.engine.as_deref(), Some("b"));
    assert_eq!(diff.requests[1].after.ttft_ms, Some(5.5));
    let text = diff.table();
    assert!(text.lines().next().unwrap().contains("a.yaml"), "{text}");
    let rejected = text.lines().find(|l| l.starts_with("rejected")).unwrap();
    assert!(rejected.ends_with("+1.00"), "{text}");
    assert!(
        text.contains("the 3 requests whose decisions differ most"),
        "{text}"
    );
    let top = compare(&trace, &before, &after, 1);
    assert_eq!(top.requests.len(), 1);
}

#[test]
fn the_same_run_twice_differs_in_nothing() {
    let trace: Vec<TraceRequest> = (0..3).map(|i| request(i * 1000)).collect();
    let run = RunReport::new(
        trace.iter().map(|r| outcome(r, 0, Some(700))).collect(),
        vec!["a".to_owned()],
    );
    let diff = Diff::of(
        &trace,
        (run.summary("x", 0), run.summary("y", 0)),
        &run,
        &run,
        10,
    );
    assert!(diff.requests.is_empty());
    assert!(diff.table().contains("every request went as before"));
}

#[test]
fn a_request_served_in_neither_run_comes_after_those_that_moved() {
    let trace: Vec<TraceRequest> = (0..3).map(|i| request(i * 1000)).collect();
    let before = on_two_engines(vec![
        outcome(&trace[0], 0, None),
        outcome(&trace[1], 0, Some(500)),
        outcome(&trace[2], 0, Some(500)),
    ]);
    let mut failed = outcome(&trace[0], 1, None);
    (failed.rejected, failed.failed) = (false, true);
    let after = on_two_engines(vec![
        failed,
        outcome(&trace[1], 0, Some(700)),
        outcome(&trace[2], 1, Some(500)),
    ]);
    let diff = compare(&trace, &before, &after, 10);
    let order: Vec<usize> = diff.requests.iter().map(|r| r.index).collect();
    assert_eq!(
        order,
        [1, 0, 2],
        "the move first; unserved in both and unmoved after, in trace order"
    );
    assert_eq!(diff.requests[1].after.outcome, "failed");
}

#[test]
fn a_load_spread_that_is_not_finite_prints_as_a_dash_and_long_names_widen_their_columns() {
    let trace = vec![request(0)];
    let run = RunReport::new(
        vec![outcome(&trace[0], 0, Some(700))],
        vec!["a".to_owned(), "idle".to_owned()],
    );
    let name = "a-configuration-with-a-long-name.yaml";
    let diff = Diff::of(
        &trace,
        (run.summary(name, 0), run.summary("b", 0)),
        &run,
        &run,
        10,
    );
    let text = diff.table();
    let header = text.lines().next().unwrap();
    assert!(header.contains(name), "{text}");
    let spread = text
        .lines()
        .find(|l| l.starts_with("load_max/min"))
        .unwrap();
    assert_eq!(
        spread.split_whitespace().collect::<Vec<_>>(),
        ["load_max/min", "-", "-", "-"],
        "{text}"
    );
    let served = text.lines().find(|l| l.starts_with("served")).unwrap();
    assert_eq!(served.len(), header.len(), "{text}");
}

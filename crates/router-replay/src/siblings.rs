//! How well a run kept the siblings of a new prefix together: requests opening with
//! the same segment as one that arrived shortly before them, the first of the trace
//! to open with it. Before the first one's engine announces the prefix, a router that
//! sends them elsewhere has each compute it again.

use std::collections::HashMap;
use std::time::Duration;

use crate::report::RunReport;
use crate::trace::{Segment, TraceRequest};

/// How soon after a prefix's first request a sibling arrives.
pub const SIBLING_WINDOW: Duration = Duration::from_millis(100);

/// Of the siblings of new prefixes (requests opening with the same named segment as
/// the first request to arrive with it, arriving within
/// [`SIBLING_WINDOW`] of it), the share that went to that first request's engine;
/// `None` when the trace has no sibling that was served. `report` is the run of
/// `trace`, its outcomes in trace order.
pub fn siblings_on_first_engine(trace: &[TraceRequest], report: &RunReport) -> Option<f64> {
    let window = u64::try_from(SIBLING_WINDOW.as_micros()).unwrap_or(u64::MAX);
    // Each opening segment's first request: its arrival and engine.
    let mut first: HashMap<&str, (u64, Option<usize>)> = HashMap::new();
    let (mut siblings, mut together) = (0u64, 0u64);
    // In arrival order: a closed loop may send a later request of the trace first.
    let mut sent: Vec<_> = trace.iter().zip(report.outcomes()).collect();
    sent.sort_by_key(|(_, outcome)| outcome.arrived_us);
    for (request, outcome) in sent {
        let Some(Segment::Named { id, .. }) = request.prompt.first() else {
            continue;
        };
        match first.get(id.as_str()) {
            None => {
                first.insert(id, (outcome.arrived_us, outcome.engine));
            }
            Some(&(at, engine)) => {
                if outcome.arrived_us.saturating_sub(at) > window || outcome.engine.is_none() {
                    continue;
                }
                siblings += 1;
                if engine.is_some() && outcome.engine == engine {
                    together += 1;
                }
            }
        }
    }
    (siblings > 0).then(|| together as f64 / siblings as f64)
}

#[cfg(test)]
mod tests {
    use super::siblings_on_first_engine;
    use crate::report::{Outcome, RunReport};
    use crate::trace::{Segment, TraceRequest};

    fn request(prefix: &str) -> TraceRequest {
        TraceRequest {
            at_us: 0,
            model: None,
            session: None,
            prompt: vec![Segment::Named {
                id: prefix.into(),
                tokens: 32,
            }],
            output_tokens: 1,
        }
    }

    #[test]
    fn the_first_to_arrive_leads_its_siblings_whatever_the_trace_order() {
        let trace: Vec<TraceRequest> = ["p", "p", "p", "q"].map(request).into();
        // Sent as a closed loop may send them: the trace's second request first.
        let sent = [(5_000, 1), (1_000, 0), (9_000, 0), (0, 1)];
        let outcomes = trace
            .iter()
            .zip(sent)
            .map(|(r, (arrived_us, engine))| Outcome {
                arrived_us,
                engine: Some(engine),
                ttft_us: Some(1),
                ..Outcome::arrived(r)
            })
            .collect();
        let report = RunReport::new(outcomes, vec!["a".into(), "b".into()]);
        // "p" first arrived on engine 0; of its two siblings one followed.
        assert_eq!(siblings_on_first_engine(&trace, &report), Some(0.5));
    }
}

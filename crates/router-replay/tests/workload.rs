//! The generated shared-prefix workload.

use router_replay::{Segment, SharedPrefixWorkload, uncached_capacity};

use crate::common::settings;

#[test]
fn it_has_its_requests_in_arrival_order_and_turns_extend_their_conversation() {
    let workload = SharedPrefixWorkload {
        requests: 2000,
        ..SharedPrefixWorkload::default()
    };
    let trace = workload.generate();
    assert_eq!(trace.len(), 2000);
    assert!(trace.windows(2).all(|w| w[0].at_us <= w[1].at_us));
    assert_eq!(trace, workload.generate(), "a seed gives one trace");
    let mut last: std::collections::HashMap<&str, &router_replay::TraceRequest> =
        Default::default();
    let mut later_turns = 0;
    for request in &trace {
        let session = request.session.as_deref().unwrap();
        let Segment::Named { id, .. } = &request.prompt[0] else {
            panic!("a system prompt opens every conversation")
        };
        assert!(id.starts_with("system-"), "{id}");
        if let Some(earlier) = last.insert(session, request) {
            later_turns += 1;
            let n = earlier.prompt.len();
            assert_eq!(
                request.prompt[..n],
                earlier.prompt[..],
                "the conversation so far"
            );
            assert_eq!(
                request.prompt.len(),
                n + 2,
                "the answer, then a new user message"
            );
            assert_eq!(request.prompt[n].len(), u64::from(earlier.output_tokens));
            assert!(request.at_us > earlier.at_us);
        }
    }
    assert!(later_turns > 500, "{later_turns}");
}

#[test]
fn the_rate_moves_requests_in_time_without_changing_a_token() {
    let slow = SharedPrefixWorkload {
        requests: 500,
        requests_per_sec: 10.0,
        ..SharedPrefixWorkload::default()
    };
    let fast = SharedPrefixWorkload {
        requests_per_sec: 1000.0,
        ..slow.clone()
    };
    let (slow, fast) = (slow.generate(), fast.generate());
    assert!(slow.last().unwrap().at_us > 10 * fast.last().unwrap().at_us);
    let first_turns = |t: &[router_replay::TraceRequest]| {
        t.iter()
            .filter(|r| r.prompt.len() == 2)
            .take(50)
            .map(|r| r.prompt.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(first_turns(&slow), first_turns(&fast));
}

#[test]
fn serial_prefill_caps_the_uncached_capacity_at_the_prefill_rate() {
    let trace = SharedPrefixWorkload {
        requests: 500,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    let serial = engine_sim::EngineSpec {
        max_running_requests: 256,
        ..settings().engine
    };
    let parallel = engine_sim::EngineSpec {
        serial_prefill: false,
        ..serial
    };
    let mean_prompt =
        trace.iter().map(|r| r.prompt_tokens()).sum::<u64>() as f64 / trace.len() as f64;
    let prefill_bound = serial.prefill_tokens_per_sec / mean_prompt;
    assert!((uncached_capacity(&trace, &serial) - prefill_bound).abs() < 1e-3 * prefill_bound);
    assert!(uncached_capacity(&trace, &parallel) > prefill_bound);
}

//! A closed loop of clients: at most N in flight, each session in order, no think
//! time.

use std::collections::HashMap;

use router_replay::{
    Arrivals, ClosedLoop, Outcome, ReplayError, ReplaySettings, Segment, SettingsError,
    SharedPrefixWorkload, TraceRequest, oracle_cached_tokens, replay,
};

use crate::common::{fleet, settings};

fn closed(clients: usize) -> ReplaySettings {
    ReplaySettings {
        arrivals: Arrivals::Closed { clients },
        ..settings()
    }
}

/// The most requests in flight at once: sent and not completed (a refused one
/// completes as it is sent).
fn most_in_flight(outcomes: &[Outcome]) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for o in outcomes {
        let end = o.finished_us.unwrap_or(o.arrived_us);
        if end > o.arrived_us {
            edges.push((o.arrived_us, 1));
            edges.push((end, -1));
        }
    }
    // Ends before starts at one time: a client sends as its request completes.
    edges.sort_unstable_by_key(|&(at, delta)| (at, delta));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        most = most.max(now);
    }
    most as usize
}

/// Asserts that each session's requests were sent in trace order, each once the one
/// before it completed.
fn assert_sessions_in_order(trace: &[TraceRequest], outcomes: &[Outcome]) {
    let mut last: HashMap<&str, &Outcome> = HashMap::new();
    for (request, outcome) in trace.iter().zip(outcomes) {
        let Some(session) = request.session.as_deref() else {
            continue;
        };
        if let Some(earlier) = last.insert(session, outcome) {
            let completed = earlier.finished_us.unwrap_or(earlier.arrived_us);
            assert!(
                outcome.arrived_us >= completed,
                "{session}: sent at {} before the one above completed at {completed}",
                outcome.arrived_us
            );
        }
    }
}

#[test]
fn a_closed_loop_keeps_n_in_flight_and_each_session_in_order() {
    // Far more requests than the clients can send at the trace's own times.
    let trace = SharedPrefixWorkload {
        requests: 800,
        requests_per_sec: 20.0,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    let config = fleet(4, "");
    let oracle = oracle_cached_tokens(&trace, 16);
    for clients in [1, 8, 100] {
        let run = |policy: &str| {
            let report = replay(&config, &trace, Some(policy), &closed(clients)).unwrap();
            let summary = report.summary(policy, oracle);
            (report, summary)
        };
        let (report, summary) = run("cache_aware");
        let outcomes = report.outcomes();
        assert!(
            outcomes.iter().all(|o| o.finished_us.is_some()),
            "every request served"
        );
        assert_eq!(
            most_in_flight(outcomes),
            clients,
            "{clients} clients keep {clients} requests in flight"
        );
        assert_sessions_in_order(&trace, outcomes);
        if clients == 8 {
            let (_, again) = run("cache_aware");
            assert_eq!(summary, again, "the same inputs, the same run");
        }
        if clients == 1 {
            // One client: one request at a time, in trace order.
            assert!(
                outcomes
                    .windows(2)
                    .all(|w| w[1].arrived_us == w[0].finished_us.unwrap())
            );
        }
        let (_, round_robin) = run("round_robin");
        assert_eq!(round_robin.requests, 800, "{clients}");
    }
}

#[test]
fn a_closed_loop_ignores_the_trace_times() {
    // Two requests an hour apart: a client sends the second as the first completes.
    let request = |at_us, id: &str| TraceRequest {
        at_us,
        model: None,
        session: None,
        prompt: vec![Segment::Named {
            id: id.into(),
            tokens: 100,
        }],
        output_tokens: 4,
    };
    let trace = [request(0, "a"), request(3_600_000_000, "b")];
    let report = replay(&fleet(1, ""), &trace, Some("round_robin"), &closed(1)).unwrap();
    let outcomes = report.outcomes();
    assert_eq!(outcomes[1].arrived_us, outcomes[0].finished_us.unwrap());
    assert!(outcomes[1].finished_us.unwrap() < 1_000_000);
}

#[test]
fn refused_requests_complete_at_once_and_the_loop_goes_on() {
    // One engine that admits one request: of four clients, three are refused.
    let config = fleet(
        1,
        "    policies: {plain: {type: round_robin, admission: {max_running_requests: 1}}}\n",
    );
    let trace = SharedPrefixWorkload {
        requests: 300,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    let report = replay(&config, &trace, None, &closed(4)).unwrap();
    let summary = report.summary("config", 0);
    assert!(summary.rejected > 0, "{summary:?}");
    let served = report
        .outcomes()
        .iter()
        .filter(|o| o.finished_us.is_some())
        .count() as u64;
    assert_eq!(served + summary.rejected, 300);
    assert_sessions_in_order(&trace, report.outcomes());
}

#[test]
fn clients_take_the_earliest_request_whose_session_is_free() {
    let request = |session: Option<&str>| TraceRequest {
        at_us: 0,
        model: None,
        session: session.map(str::to_owned),
        prompt: vec![],
        output_tokens: 1,
    };
    let trace = [
        request(Some("a")),
        request(Some("a")),
        request(Some("a")),
        request(None),
        request(Some("b")),
        request(None),
    ];
    let mut clients = ClosedLoop::new(&trace, 3);
    let sent =
        |clients: &mut ClosedLoop<'_>| std::iter::from_fn(|| clients.send()).collect::<Vec<_>>();
    assert_eq!(
        sent(&mut clients),
        [0, 3, 4],
        "a's second waits for its first"
    );
    clients.completed(3);
    assert_eq!(sent(&mut clients), [5]);
    clients.completed(0);
    assert_eq!(sent(&mut clients), [1], "a's second, before anything later");
    clients.completed(4);
    assert_eq!(
        sent(&mut clients),
        [0usize; 0],
        "a's third waits for its second"
    );
    clients.completed(1);
    assert_eq!(sent(&mut clients), [2]);
    assert!(!clients.done());
    clients.completed(5);
    clients.completed(2);
    assert!(clients.done());
}

#[test]
fn a_closed_loop_has_1_to_65536_clients() {
    let trace = SharedPrefixWorkload {
        requests: 1,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    for clients in [0, 65_537] {
        let error = replay(&fleet(1, ""), &trace, None, &closed(clients)).unwrap_err();
        assert!(
            matches!(error, ReplayError::Settings(SettingsError::Clients { .. })),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            format!("configuration: a closed loop must have 1 to 65536 clients, not {clients}")
        );
    }
}

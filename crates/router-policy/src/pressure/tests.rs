use std::cmp::Ordering::{Equal, Greater, Less};

use router_state::{NativeAggregate, ReportedLoad};
use tokio::time::Instant;

use super::*;

#[derive(Clone, Copy)]
struct Load {
    queue_ms: Option<f64>,
    uncached: u64,
    waiting: u64,
    running: u64,
    used_kv: u64,
    max_kv: Option<u64>,
    max_running: u64,
    in_flight: u64,
    native: bool,
}

const BASE: Load = Load {
    queue_ms: None,
    uncached: 0,
    waiting: 0,
    running: 0,
    used_kv: 0,
    max_kv: Some(1000),
    max_running: 64,
    in_flight: 0,
    native: true,
};

fn observe(l: Load) -> EngineObservation {
    EngineObservation {
        reported: Some(ReportedLoad {
            running_requests: l.running,
            waiting_requests: l.waiting,
            used_kv_tokens: l.used_kv,
            max_kv_tokens: l.max_kv,
            native: l.native.then_some(NativeAggregate {
                waiting_uncached_tokens: l.uncached,
                total_tokens: 0,
                max_running_requests: l.max_running,
                prefill_tokens_per_sec: None,
                prefill_queue_ms: l.queue_ms,
            }),
            received_at: Instant::now(),
        }),
        in_flight: l.in_flight,
        dispatched_since_report: 0,
    }
}

fn cmp(stage: Role, a: Load, b: Load) -> (std::cmp::Ordering, Basis) {
    compare(stage, &observe(a), &observe(b), 1000)
}

#[test]
fn prefill_orders_queue_time_then_uncached_waiting_running_then_local() {
    let busy_queue = Load {
        queue_ms: Some(50.0),
        uncached: 0,
        ..BASE
    };
    let idle_queue = Load {
        queue_ms: Some(10.0),
        uncached: 9000,
        waiting: 9,
        ..BASE
    };
    assert_eq!(
        cmp(Role::Prefill, idle_queue, busy_queue),
        (Less, Basis::Reported),
        "queue time first"
    );
    let unknown_queue = Load {
        queue_ms: None,
        uncached: 100,
        ..BASE
    };
    assert_eq!(
        cmp(Role::Prefill, idle_queue, unknown_queue),
        (Greater, Basis::Reported),
        "queue time only when both have it; then uncached tokens"
    );
    let few_waiting = Load {
        uncached: 100,
        waiting: 1,
        running: 9,
        ..BASE
    };
    let many_waiting = Load {
        uncached: 100,
        waiting: 2,
        running: 0,
        ..BASE
    };
    assert_eq!(
        cmp(Role::Plain, few_waiting, many_waiting).0,
        Less,
        "waiting requests before running"
    );
    let running = Load { running: 3, ..BASE };
    assert_eq!(
        cmp(Role::Plain, running, Load { running: 4, ..BASE }).0,
        Less
    );
    let tie_busy_locally = Load {
        in_flight: 5,
        ..BASE
    };
    assert_eq!(
        cmp(Role::Plain, tie_busy_locally, BASE),
        (Greater, Basis::Reported),
        "ties go to local in-flight"
    );
    assert_eq!(cmp(Role::Plain, BASE, BASE), (Equal, Basis::Reported));
}

#[test]
fn decode_orders_waiting_running_usage_then_kv_tokens() {
    let a = Load {
        waiting: 1,
        running: 50,
        ..BASE
    };
    let b = Load {
        waiting: 2,
        running: 0,
        ..BASE
    };
    assert_eq!(cmp(Role::Decode, a, b).0, Less, "waiting first");
    let a = Load {
        running: 3,
        used_kv: 900,
        ..BASE
    };
    let b = Load {
        running: 4,
        used_kv: 0,
        ..BASE
    };
    assert_eq!(cmp(Role::Decode, a, b).0, Less, "running second");
    let small_full = Load {
        used_kv: 500,
        max_kv: Some(1000),
        ..BASE
    };
    let big_half = Load {
        used_kv: 600,
        max_kv: Some(2000),
        ..BASE
    };
    assert_eq!(
        cmp(Role::Decode, big_half, small_full).0,
        Less,
        "usage fraction before raw tokens"
    );
    let same_fraction_more = Load {
        used_kv: 1000,
        max_kv: Some(2000),
        ..BASE
    };
    assert_eq!(
        cmp(Role::Decode, small_full, same_fraction_more).0,
        Less,
        "equal fractions fall to tokens in use"
    );
    let decode_ignores_uncached = Load {
        uncached: 10_000,
        ..BASE
    };
    assert_eq!(cmp(Role::Decode, decode_ignores_uncached, BASE).0, Equal);
}

#[test]
fn without_fresh_native_reports_with_capacity_only_local_in_flight_counts() {
    let quiet_locally = Load {
        in_flight: 1,
        waiting: 100,
        ..BASE
    };
    let busy_locally = Load {
        in_flight: 2,
        ..BASE
    };
    let variants = [
        Load {
            native: false,
            ..busy_locally
        },
        Load {
            max_kv: None,
            ..busy_locally
        },
        Load {
            max_running: 0,
            ..busy_locally
        },
    ];
    for other in variants {
        assert_eq!(
            cmp(Role::Prefill, quiet_locally, other),
            (Less, Basis::Local)
        );
        assert_eq!(
            cmp(Role::Decode, quiet_locally, other),
            (Less, Basis::Local)
        );
    }
    let missing = EngineObservation {
        in_flight: 3,
        ..EngineObservation::UNKNOWN
    };
    assert_eq!(
        compare(Role::Plain, &observe(quiet_locally), &missing, 1000),
        (Less, Basis::Local)
    );
}

#[test]
fn dispatches_the_report_has_not_seen_count_as_queued_prefill_work() {
    let measured = |queue_ms: f64, dispatched: u64| {
        let mut o = observe(Load {
            queue_ms: Some(queue_ms),
            ..BASE
        });
        if let Some(native) = o.reported.as_mut().and_then(|r| r.native.as_mut()) {
            native.prefill_tokens_per_sec = Some(10_000.0);
        }
        o.dispatched_since_report = dispatched;
        o.in_flight = dispatched;
        o
    };
    // 20 ms queued and nothing sent since, against 5 ms queued and two requests of
    // 1000 tokens sent since (2 x 100 ms at 10k tokens a second).
    let (quiet, hit) = (measured(20.0, 0), measured(5.0, 2));
    assert_eq!(hit.corrected_prefill_queue_ms(1000), Some(205.0));
    assert_eq!(compare(Role::Plain, &quiet, &hit, 1000).0, Less);
    assert_eq!(
        compare(Role::Plain, &quiet, &hit, 0).0,
        Greater,
        "requests of no uncached tokens add no work"
    );
    let unmeasured = observe(Load {
        queue_ms: Some(5.0),
        ..BASE
    });
    assert_eq!(
        EngineObservation {
            dispatched_since_report: 2,
            ..unmeasured
        }
        .corrected_prefill_queue_ms(1000),
        Some(5.0),
        "without a measured speed the report stands"
    );
}

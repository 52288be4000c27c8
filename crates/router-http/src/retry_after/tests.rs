use std::num::NonZeroU32;
use std::sync::Arc;

use router_buckets::{BucketAttempt, SelectError};
use router_policy::{LimitExceeded, PickError, Rejection};
use router_state::{EngineId, EngineReportedLoadTable, LoadReport, NativeLoad, Role};
use tokio::time::Instant;

use super::{MAX_SECONDS, MIN_SECONDS, seconds};

/// A table where each engine has two reports whose counters show 100,000 prefill
/// tokens a second, then `waiting` uncached tokens waiting.
fn table(engines: &[(&str, u64)]) -> EngineReportedLoadTable {
    let table = EngineReportedLoadTable::default();
    let report = |waiting: u64, tokens: u64, busy_us: u64| LoadReport {
        running_requests: 4,
        waiting_requests: 9,
        used_kv_tokens: 100,
        max_kv_tokens: Some(1 << 20),
        dp_rank: None,
        native: Some(NativeLoad {
            waiting_uncached_tokens: waiting,
            total_tokens: 100,
            max_running_requests: 4,
            prefill_uncached_tokens_total: tokens,
            prefill_busy_us_total: busy_us,
        }),
    };
    for (engine, waiting) in engines {
        let id = EngineId::from(*engine);
        table.register(&id, NonZeroU32::MIN);
        for (tokens, busy) in [(0, 0), (100_000, 1_000_000)] {
            table
                .ingest(&id, 0, report(*waiting, tokens, busy), Instant::now())
                .unwrap();
        }
    }
    table
}

fn refused_by(engines: &[&str]) -> SelectError {
    let rejection = |engine: &&str| Rejection {
        engine: EngineId::from(*engine),
        exceeded: LimitExceeded {
            limit: "max_waiting_requests",
            observed: 9,
            cap: 8,
        },
    };
    SelectError::AtCapacity {
        attempts: vec![BucketAttempt {
            bucket: Arc::from("b"),
            error: PickError::NoAdmissibleEngine {
                stage: Role::Plain,
                rejections: engines.iter().map(rejection).collect(),
            },
            took: None,
        }],
    }
}

#[tokio::test(start_paused = true)]
async fn the_soonest_drain_of_the_refusing_engines_rounded_up_within_bounds() {
    // 450,000 tokens at 100,000 a second: 4.5 s; 1,200,000: 12 s; 10^8: 1000 s.
    let load = table(&[
        ("a", 450_000),
        ("b", 1_200_000),
        ("c", 100_000_000),
        ("d", 0),
    ]);
    let snapshot = load.snapshot();
    assert_eq!(seconds(&refused_by(&["a", "b"]), &snapshot), 5);
    assert_eq!(seconds(&refused_by(&["b"]), &snapshot), 12);
    assert_eq!(seconds(&refused_by(&["c"]), &snapshot), MAX_SECONDS);
    assert_eq!(seconds(&refused_by(&["d"]), &snapshot), MIN_SECONDS);
    assert_eq!(
        seconds(&refused_by(&["unknown"]), &snapshot),
        MIN_SECONDS,
        "no estimate: the shortest wait"
    );
    assert_eq!(seconds(&refused_by(&["unknown", "b"]), &snapshot), 12);
}

#[tokio::test(start_paused = true)]
async fn a_stale_report_gives_no_estimate() {
    let load = table(&[("a", 450_000)]);
    tokio::time::advance(router_state::DEFAULT_FRESHNESS * 2).await;
    assert_eq!(seconds(&refused_by(&["a"]), &load.snapshot()), MIN_SECONDS);
}

use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{Instant, advance};

use super::*;
use crate::EngineId;
use crate::test_util::{basic_report, encode_load_stat, with_native};

/// Payloads encoded by the real SGLang 0.5.23 publisher (see `gen_load_stat.py`).
fn golden(name: &str) -> Vec<u8> {
    let fixtures = include_str!("../../../../testdata/sglang/load_stat.txt");
    let hex = fixtures
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("fixture {name} missing"));
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("fixture is hex"))
        .collect()
}

fn native(waiting_uncached: u64, tokens_total: u64, busy_us_total: u64) -> NativeLoad {
    NativeLoad {
        waiting_uncached_tokens: waiting_uncached,
        total_tokens: 9000,
        max_running_requests: 64,
        prefill_uncached_tokens_total: tokens_total,
        prefill_busy_us_total: busy_us_total,
    }
}

fn id(s: &str) -> EngineId {
    EngineId::from(s)
}

fn feed(table: &EngineReportedLoadTable, engine: &str, rank: u32, report: LoadReport) {
    table
        .ingest(&id(engine), rank, report, Instant::now())
        .expect("a registered engine and a rank in range");
}

fn reported(table: &EngineReportedLoadTable, engine: &str) -> Option<ReportedLoad> {
    table.snapshot().observe(&id(engine)).reported
}

fn native_of(table: &EngineReportedLoadTable, engine: &str) -> NativeAggregate {
    reported(table, engine)
        .expect("a fresh report")
        .native
        .expect("a native aggregate")
}

fn two(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

#[test]
fn decodes_a_native_report_from_the_real_publisher() {
    let report = LoadReport::decode(&golden("native_rank1")).unwrap();
    assert_eq!(
        report,
        LoadReport {
            running_requests: 3,
            waiting_requests: 2,
            used_kv_tokens: 4096,
            max_kv_tokens: Some(65536),
            dp_rank: Some(1),
            native: Some(NativeLoad {
                waiting_uncached_tokens: 1500,
                total_tokens: 9000,
                max_running_requests: 64,
                prefill_uncached_tokens_total: 120_000,
                prefill_busy_us_total: 4_000_000,
            }),
        }
    );
    let large = LoadReport::decode(&golden("native_large_counters")).unwrap();
    assert_eq!(large.dp_rank, None);
    let n = large.native.unwrap();
    assert_eq!(n.prefill_busy_us_total, u64::MAX);
    assert_eq!(n.prefill_uncached_tokens_total, i64::MAX as u64);
}

#[test]
fn decodes_the_six_field_basic_report_and_maps_zero_capacity_to_unknown() {
    let basic = LoadReport::decode(&golden("basic_six")).unwrap();
    assert_eq!(
        basic,
        LoadReport {
            dp_rank: Some(0),
            ..basic_report(5, 1, 800, 32768)
        }
    );
    assert_eq!(
        LoadReport::decode(&golden("basic_six_nil_rank"))
            .unwrap()
            .dp_rank,
        None
    );
    let defaults = LoadReport::decode(&golden("defaults_only")).unwrap();
    assert_eq!(
        defaults.max_kv_tokens, None,
        "capacity 0 means unknown, never zero"
    );
}

#[test]
fn rejects_a_partial_native_extension() {
    let err = LoadReport::decode(&golden("partial_seven")).unwrap_err();
    assert_eq!(err, LoadDecodeError::PartialNative(1));
    assert_eq!(
        err.to_string(),
        "native load extension has 1 of its 5 fields"
    );
    assert_eq!(err.reason(), "partial_native");
}

#[test]
fn the_test_encoder_matches_the_publisher_byte_for_byte() {
    for name in [
        "native_rank1",
        "native_large_counters",
        "defaults_only",
        "basic_six",
        "basic_six_nil_rank",
    ] {
        let bytes = golden(name);
        let report = LoadReport::decode(&bytes).unwrap();
        assert_eq!(encode_load_stat(&report), bytes, "re-encoding {name}");
    }
}

#[test]
fn rejects_malformed_payloads_with_a_reason() {
    let cases: [(&[u8], &str); 5] = [
        (&[0xc1], "malformed"),                   // reserved byte
        (&[0x81, 0xa1, b'a', 0x01], "malformed"), // a map, not an array
        (
            &[0x92, 0xa4, b'L', b'o', b'a', b'd', 0x01],
            "unexpected_tag",
        ),
        (
            &[
                0x93, 0xa8, b'L', b'o', b'a', b'd', b'S', b't', b'a', b't', 1, 2,
            ],
            "too_short",
        ),
        (
            &[
                0x96, 0xa8, b'L', b'o', b'a', b'd', b'S', b't', b'a', b't', 1, 0xff, 1, 1, 0,
            ],
            "malformed",
        ),
    ];
    for (bytes, reason) in cases {
        let err = LoadReport::decode(bytes).unwrap_err();
        assert_eq!(err.reason(), reason, "{bytes:02x?} gave {err}");
    }
    let err = LoadReport::decode(&[0x92, 0xa4, b'L', b'o', b'a', b'd', 0x01]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "load report tag is \"Load\", expected \"LoadStat\""
    );
    assert_eq!(
        LoadReport::decode(&[
            0x93, 0xa8, b'L', b'o', b'a', b'd', b'S', b't', b'a', b't', 1, 2
        ])
        .unwrap_err()
        .to_string(),
        "load report has 3 elements, a basic report needs 6"
    );
}

#[test]
fn ignores_elements_appended_after_the_native_fields() {
    let mut bytes = encode_load_stat(&with_native(basic_report(1, 2, 3, 4), native(5, 6, 7)));
    bytes[0] = 0x9c; // 12 elements
    bytes.extend_from_slice(&[0xa3, b'n', b'e', b'w']);
    let report = LoadReport::decode(&bytes).unwrap();
    assert_eq!(report.native.unwrap().prefill_busy_us_total, 7);
}

#[tokio::test(start_paused = true)]
async fn a_missing_report_reads_as_none_and_in_flight_is_always_known() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), NonZeroU32::MIN);
    let guard = table.acquire(&id("a"));
    let seen = table.snapshot().observe(&id("a"));
    assert_eq!(seen.reported, None);
    assert_eq!(
        seen.metrics(),
        EngineMetrics {
            inflight_requests: 1,
            ..EngineMetrics::default()
        }
    );
    drop(guard);
    assert_eq!(
        table.snapshot().observe(&id("zz")),
        EngineObservation::UNKNOWN
    );
}

#[tokio::test(start_paused = true)]
async fn a_report_goes_stale_after_the_freshness_window() {
    let table = EngineReportedLoadTable::new(LoadTableConfig {
        freshness: Duration::from_secs(5),
    });
    table.register(&id("a"), NonZeroU32::MIN);
    feed(&table, "a", 0, basic_report(4, 2, 100, 1000));
    advance(Duration::from_millis(4999)).await;
    let fresh = table.snapshot().observe(&id("a")).metrics();
    assert_eq!(
        (
            fresh.running_requests,
            fresh.waiting_requests,
            fresh.kv_tokens
        ),
        (Some(4), Some(2), Some(100))
    );
    assert_eq!(
        fresh.pending_prefill_tokens, None,
        "basic reports carry no pending prefill"
    );
    let captured = table.snapshot();
    advance(Duration::from_millis(1)).await;
    assert!(
        captured.observe(&id("a")).reported.is_some(),
        "a snapshot keeps its capture time"
    );
    assert_eq!(
        table.snapshot().observe(&id("a")).reported,
        None,
        "stale after 5 s"
    );
}

#[tokio::test(start_paused = true)]
async fn an_engine_is_aggregated_only_when_every_rank_is_fresh() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), two(2));
    let t0 = Instant::now();
    table
        .ingest(&id("a"), 0, basic_report(1, 2, 10, 100), t0)
        .unwrap();
    assert_eq!(
        table.snapshot().observe(&id("a")).reported,
        None,
        "rank 1 missing"
    );
    advance(Duration::from_secs(3)).await;
    feed(&table, "a", 1, basic_report(3, 4, 20, 200));
    let load = reported(&table, "a").unwrap();
    assert_eq!(
        (
            load.running_requests,
            load.waiting_requests,
            load.used_kv_tokens
        ),
        (4, 6, 30)
    );
    assert_eq!(load.max_kv_tokens, Some(300));
    assert_eq!(
        load.received_at, t0,
        "the aggregate is as old as its oldest rank"
    );
    advance(Duration::from_secs(2)).await;
    assert_eq!(
        table.snapshot().observe(&id("a")).reported,
        None,
        "rank 0 went stale"
    );
    let err = table
        .ingest(&id("a"), 2, basic_report(0, 0, 0, 0), Instant::now())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "engine a has 2 data-parallel ranks; rank 2 is out of range"
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_capacity_on_any_rank_leaves_the_sum_unknown() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), two(2));
    feed(&table, "a", 0, basic_report(1, 0, 10, 100));
    feed(&table, "a", 1, basic_report(1, 0, 10, 0));
    assert_eq!(reported(&table, "a").unwrap().max_kv_tokens, None);
}

#[tokio::test(start_paused = true)]
async fn derives_prefill_speed_and_queue_time_from_native_counters() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), NonZeroU32::MIN);
    let report = |uncached, tokens, busy| {
        with_native(basic_report(1, 1, 10, 100), native(uncached, tokens, busy))
    };
    feed(&table, "a", 0, report(500, 1000, 1_000_000));
    let first = native_of(&table, "a");
    assert_eq!(
        first.prefill_tokens_per_sec, None,
        "one sample gives no speed"
    );
    assert_eq!(first.prefill_queue_ms, None);
    feed(&table, "a", 0, report(2000, 5000, 3_000_000));
    let second = native_of(&table, "a");
    assert_eq!(
        second.prefill_tokens_per_sec,
        Some(2000.0),
        "4000 tokens in 2 s"
    );
    assert_eq!(
        second.prefill_queue_ms,
        Some(1000.0),
        "2000 waiting tokens at 2000/s"
    );
    assert_eq!(
        table.snapshot().observe(&id("a")).metrics().kv_tokens,
        Some(9000),
        "native total tokens"
    );
    feed(&table, "a", 0, report(2000, 5000, 3_000_000));
    let idle = native_of(&table, "a");
    assert_eq!(
        idle.prefill_tokens_per_sec, None,
        "counters that did not advance give no speed"
    );
}

#[tokio::test(start_paused = true)]
async fn counters_going_backwards_reset_the_speed_baseline() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), NonZeroU32::MIN);
    let report = |tokens, busy| with_native(basic_report(1, 1, 10, 100), native(100, tokens, busy));
    feed(&table, "a", 0, report(10_000, 5_000_000));
    feed(&table, "a", 0, report(200, 100_000));
    let restarted = native_of(&table, "a");
    assert_eq!(
        restarted.prefill_tokens_per_sec, None,
        "a restarted publisher's counters give no speed"
    );
    feed(&table, "a", 0, report(1200, 600_000));
    let next = native_of(&table, "a");
    assert_eq!(
        next.prefill_tokens_per_sec,
        Some(2000.0),
        "measured from the restarted baseline"
    );
}

#[tokio::test(start_paused = true)]
async fn speed_is_summed_only_when_every_rank_has_one() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), two(2));
    let report = |tokens, busy| with_native(basic_report(1, 1, 10, 100), native(300, tokens, busy));
    for (rank, tokens) in [(0, 1000), (1, 1000)] {
        table
            .ingest(&id("a"), rank, report(tokens, 1_000_000), Instant::now())
            .unwrap();
    }
    feed(&table, "a", 0, report(2000, 2_000_000));
    let partial = native_of(&table, "a");
    assert_eq!(
        partial.prefill_tokens_per_sec, None,
        "rank 1 has no speed yet"
    );
    feed(&table, "a", 1, report(4000, 2_000_000));
    let both = native_of(&table, "a");
    assert_eq!(both.prefill_tokens_per_sec, Some(4000.0), "1000/s + 3000/s");
    assert_eq!(both.waiting_uncached_tokens, 600);
    assert_eq!(both.prefill_queue_ms, Some(150.0));
}

#[tokio::test(start_paused = true)]
async fn a_mixed_basic_and_native_engine_has_no_native_aggregate() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), two(2));
    table
        .ingest(
            &id("a"),
            0,
            with_native(basic_report(1, 1, 10, 100), native(5, 1, 1)),
            Instant::now(),
        )
        .unwrap();
    feed(&table, "a", 1, basic_report(1, 1, 10, 100));
    let seen = table.snapshot().observe(&id("a"));
    assert_eq!(seen.reported.unwrap().native, None);
    assert_eq!(seen.metrics().pending_prefill_tokens, None);
    assert_eq!(
        seen.metrics().kv_tokens,
        Some(20),
        "falls back to KV tokens in use"
    );
}

#[tokio::test(start_paused = true)]
async fn dispatches_since_the_report_correct_reported_load() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), NonZeroU32::MIN);
    let before = table.acquire(&id("a"));
    feed(&table, "a", 0, basic_report(2, 1, 10, 100));
    let guards: Vec<_> = (0..3).map(|_| table.acquire(&id("a"))).collect();
    let seen = table.snapshot().observe(&id("a"));
    assert_eq!((seen.in_flight, seen.dispatched_since_report), (4, 3));
    assert_eq!(seen.corrected_reported_requests(), Some(6));
    let metrics = seen.metrics();
    assert_eq!(
        (metrics.running_requests, metrics.waiting_requests),
        (Some(5), Some(4)),
        "admission reads the reported counts with the unseen dispatches on each"
    );
    drop(guards);
    drop(before);
    let seen = table.snapshot().observe(&id("a"));
    assert_eq!(
        (seen.in_flight, seen.dispatched_since_report),
        (0, 3),
        "completions do not undo dispatches"
    );
    let metrics = seen.metrics();
    assert_eq!(
        (metrics.running_requests, metrics.waiting_requests),
        (Some(2), Some(1)),
        "but a request that ended is on the engine no more: nothing is added"
    );
    assert_eq!(seen.corrected_reported_requests(), Some(3));
    feed(&table, "a", 0, basic_report(2, 1, 10, 100));
    assert_eq!(
        table.snapshot().observe(&id("a")).dispatched_since_report,
        0
    );
}

#[tokio::test(start_paused = true)]
async fn registration_controls_which_reports_apply() {
    let table = EngineReportedLoadTable::default();
    let err = table
        .ingest(&id("a"), 0, basic_report(1, 1, 1, 1), Instant::now())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "engine a is not registered in the load table"
    );
    table.register(&id("a"), NonZeroU32::MIN);
    feed(&table, "a", 0, basic_report(1, 1, 1, 1));
    table.register(&id("a"), NonZeroU32::MIN);
    assert!(
        table.snapshot().observe(&id("a")).reported.is_some(),
        "same rank count keeps reports"
    );
    table.register(&id("a"), two(2));
    assert_eq!(
        table.snapshot().observe(&id("a")).reported,
        None,
        "new rank count forgets reports"
    );
    let guard = table.acquire(&id("a"));
    assert!(table.unregister(&id("a")));
    assert!(!table.unregister(&id("a")));
    assert_eq!(table.in_flight(&id("a")), 0);
    drop(guard);
}

#[test]
fn guards_for_unregistered_engines_still_count() {
    let table = EngineReportedLoadTable::default();
    let guard = table.acquire(&id("new"));
    assert_eq!(table.in_flight(&id("new")), 1);
    drop(guard);
    assert_eq!(table.in_flight(&id("new")), 0);
}

#[test]
fn a_reservation_counts_only_below_its_cap() {
    let table = EngineReportedLoadTable::default();
    let first = table.try_reserve(&id("a"), 2).expect("room for two");
    let second = table.try_reserve(&id("a"), 2).expect("room for one more");
    assert_eq!(table.try_reserve(&id("a"), 2).err(), Some(2));
    assert_eq!(
        table.in_flight(&id("a")),
        2,
        "a refused reservation counts nothing"
    );
    drop(first);
    let third = table
        .try_reserve(&id("a"), 2)
        .expect("a released slot is free again");
    drop((second, third));
    assert_eq!(table.in_flight(&id("a")), 0);
}

#[test]
fn a_guard_given_a_rank_counts_there_until_it_drops() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), two(2));
    let guard = table
        .try_reserve(&id("a"), 4)
        .unwrap()
        .dispatch()
        .with_rank(1);
    assert_eq!(
        table.least_loaded_rank(&id("a")),
        Some(0),
        "rank 1 holds it"
    );
    let guard = guard.with_rank(0);
    assert_eq!(
        table.least_loaded_rank(&id("a")),
        Some(1),
        "moved to rank 0"
    );
    drop(guard);
    assert_eq!(table.least_loaded_rank(&id("a")), Some(0));
    assert_eq!(table.in_flight(&id("a")), 0);
}

#[test]
fn reservations_on_many_threads_never_pass_the_cap() {
    const CAP: u64 = 3;
    let table = std::sync::Arc::new(EngineReportedLoadTable::default());
    let most = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (table, most) = (std::sync::Arc::clone(&table), std::sync::Arc::clone(&most));
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    if let Ok(reservation) = table.try_reserve(&id("a"), CAP) {
                        most.fetch_max(
                            table.in_flight(&id("a")),
                            std::sync::atomic::Ordering::SeqCst,
                        );
                        drop(reservation.dispatch());
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!((1..=CAP).contains(&most), "{most} in flight at once");
    assert_eq!(table.in_flight(&id("a")), 0);
}

#[test]
fn the_capacity_listener_hears_releases_reports_and_registrations() {
    let table = EngineReportedLoadTable::default();
    let heard = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = std::sync::Arc::clone(&heard);
    table.on_capacity(Some(Box::new(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    })));
    let count = || heard.load(std::sync::atomic::Ordering::Relaxed);
    table.register(&id("a"), two(1));
    assert_eq!(count(), 1, "an engine joined");
    let guard = table.acquire(&id("a"));
    assert_eq!(count(), 1, "taking a slot frees nothing");
    drop(guard);
    assert_eq!(count(), 2, "a release");
    feed(&table, "a", 0, basic_report(1, 0, 0, 100));
    assert_eq!(count(), 3, "a report");
    drop(table.try_reserve(&id("a"), 1).unwrap());
    assert_eq!(
        count(),
        3,
        "a reservation never dispatched is not a release"
    );
    drop(table.try_reserve(&id("a"), 1).unwrap().dispatch());
    assert_eq!(count(), 4, "a dispatched one is");
    table.on_capacity(None);
    drop(table.acquire(&id("a")));
    assert_eq!(count(), 4, "a cleared listener hears nothing");
}

#[test]
fn only_a_dispatched_reservation_counts_as_dispatched_since_the_report() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("a"), two(1));
    feed(&table, "a", 0, basic_report(1, 0, 0, 100));
    let undispatched = table.try_reserve(&id("a"), 8).unwrap();
    let observed = table.snapshot().observe(&id("a"));
    assert_eq!(
        (observed.in_flight, observed.dispatched_since_report),
        (1, 0)
    );
    drop(undispatched);
    let guard = table.try_reserve(&id("a"), 8).unwrap().dispatch();
    let observed = table.snapshot().observe(&id("a"));
    assert_eq!(
        (observed.in_flight, observed.dispatched_since_report),
        (1, 1)
    );
    drop(guard);
}

#[derive(Debug, Clone)]
enum Op {
    /// Take a guard for engine `n % 3` and keep it.
    Acquire(usize),
    /// Drop the `n`-th live guard (modulo the count).
    Release(usize),
    /// A fallible operation takes a guard and fails; `?` drops it.
    FailAfterAcquire(usize),
    /// A future takes a guard, is polled once, then cancelled by dropping it.
    CancelledFuture(usize),
    /// A task holding a guard panics; unwinding drops it.
    PanicWhileHolding(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..3).prop_map(Op::Acquire),
        any::<usize>().prop_map(Op::Release),
        (0usize..3).prop_map(Op::FailAfterAcquire),
        (0usize..3).prop_map(Op::CancelledFuture),
        (0usize..3).prop_map(Op::PanicWhileHolding),
    ]
}

fn fail_after_acquire(
    table: &EngineReportedLoadTable,
    engine: &EngineId,
) -> Result<(), &'static str> {
    let _guard = table.acquire(engine);
    Err("upstream failed")
}

proptest! {
    #[test]
    fn in_flight_counts_exactly_the_live_guards(ops in proptest::collection::vec(op(), 0..64)) {
        let table = EngineReportedLoadTable::default();
        let engines = [id("e0"), id("e1"), id("e2")];
        let mut live: Vec<(usize, InflightGuard)> = Vec::new();
        for op in ops {
            match op {
                Op::Acquire(e) => live.push((e, table.acquire(&engines[e]))),
                Op::Release(n) if !live.is_empty() => drop(live.swap_remove(n % live.len())),
                Op::Release(_) => {}
                Op::FailAfterAcquire(e) => prop_assert!(fail_after_acquire(&table, &engines[e]).is_err()),
                Op::CancelledFuture(e) => {
                    let mut fut = Box::pin(async {
                        let _guard = table.acquire(&engines[e]);
                        std::future::pending::<()>().await;
                    });
                    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                    prop_assert!(fut.as_mut().poll(&mut cx).is_pending());
                    prop_assert_eq!(table.in_flight(&engines[e]), live.iter().filter(|(x, _)| *x == e).count() as u64 + 1);
                    drop(fut);
                }
                Op::PanicWhileHolding(e) => {
                    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let _guard = table.acquire(&engines[e]);
                        panic!("handler panicked");
                    }));
                    prop_assert!(unwound.is_err());
                }
            }
            for (e, engine) in engines.iter().enumerate() {
                let expected = live.iter().filter(|(x, _)| *x == e).count() as u64;
                prop_assert_eq!(table.in_flight(engine), expected, "in-flight of {} equals its live guards", engine);
            }
        }
        live.clear();
        for engine in &engines {
            prop_assert_eq!(table.in_flight(engine), 0, "in-flight returns to zero once every guard is gone");
        }
    }
}

#[test]
fn snapshots_and_guards_can_cross_await_points_in_send_futures() {
    fn send<T: Send + Sync>() {}
    send::<LoadSnapshot>();
    send::<InflightGuard>();
    send::<Reservation>();
    send::<EngineReportedLoadTable>();
}

#[tokio::test(start_paused = true)]
async fn the_least_loaded_rank_weighs_fresh_reports_and_requests_in_flight() {
    let table = EngineReportedLoadTable::new(LoadTableConfig {
        freshness: Duration::from_secs(5),
    });
    table.register(&id("dp"), two(2));
    table.register(&id("one"), NonZeroU32::MIN);
    assert_eq!(
        table.least_loaded_rank(&id("one")),
        None,
        "one rank: none named"
    );
    assert_eq!(table.least_loaded_rank(&id("unknown")), None);
    assert_eq!(
        table.least_loaded_rank(&id("dp")),
        Some(0),
        "a tie: the lowest"
    );
    let first = table.acquire_rank(&id("dp"), 0);
    assert_eq!(table.least_loaded_rank(&id("dp")), Some(1));
    let second = table.acquire_rank(&id("dp"), 1);
    assert_eq!(table.in_flight(&id("dp")), 2, "the engine counts both");
    drop(first);
    assert_eq!(table.least_loaded_rank(&id("dp")), Some(0));
    drop(second);
    feed(&table, "dp", 0, basic_report(3, 1, 0, 0));
    feed(&table, "dp", 1, basic_report(1, 0, 0, 0));
    assert_eq!(
        table.least_loaded_rank(&id("dp")),
        Some(1),
        "rank 0 reports 4"
    );
    let _held: Vec<_> = (0..2).map(|_| table.acquire_rank(&id("dp"), 1)).collect();
    assert_eq!(
        table.least_loaded_rank(&id("dp")),
        Some(1),
        "2 in flight is less than rank 0's reported 4"
    );
    advance(Duration::from_secs(5)).await;
    assert_eq!(
        table.least_loaded_rank(&id("dp")),
        Some(0),
        "stale reports leave the 2 in flight on rank 1"
    );
    assert_eq!(table.in_flight(&id("dp")), 2);
}

#[tokio::test(start_paused = true)]
async fn time_per_token_is_a_moving_average_that_goes_stale() {
    let table = EngineReportedLoadTable::default();
    table.register(&id("e"), NonZeroU32::MIN);
    let tpot = |table: &EngineReportedLoadTable| table.snapshot().tpot(&id("e"));
    assert_eq!(tpot(&table), None, "never measured");
    table.observe_tpot(&id("e"), Duration::from_millis(40));
    assert_eq!(tpot(&table), Some(Duration::from_millis(40)));
    table.observe_tpot(&id("e"), Duration::from_millis(80));
    assert_eq!(
        tpot(&table),
        Some(Duration::from_millis(50)),
        "a quarter of the way to the new measurement"
    );
    table.observe_tpot(&id("unknown"), Duration::from_millis(1));
    assert_eq!(table.snapshot().tpot(&id("unknown")), None);
    advance(TPOT_FRESHNESS).await;
    assert_eq!(tpot(&table), None, "stale");
    table.observe_tpot(&id("e"), Duration::from_millis(10));
    assert_eq!(
        tpot(&table),
        Some(Duration::from_millis(10)),
        "a stale estimate is replaced, not averaged"
    );
}

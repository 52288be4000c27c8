//! Fixtures shared by the policy tests.

use std::sync::Arc;

use router_policy::{AdmissionLimits, Pick, PickError, PickRequest, Policy, RequestFacts};
use router_state::test_util::{basic_report, fleet, with_native};
use router_state::{Engine, EngineReportedLoadTable, NativeLoad, Role};
use tokio::time::Instant;

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

pub(crate) fn engines(n: usize) -> Vec<Arc<Engine>> {
    fleet("m", Role::Plain, "e", n)
}

pub(crate) fn staged(role: Role, n: usize) -> Vec<Arc<Engine>> {
    fleet("m", role, "e", n)
}

pub(crate) fn request(stage: Role) -> PickRequest<'static> {
    PickRequest::new(RequestFacts::new("m", 100), stage, "bucket")
}

pub(crate) fn table(engines: &[Arc<Engine>]) -> Arc<EngineReportedLoadTable> {
    let table = Arc::new(EngineReportedLoadTable::default());
    for e in engines {
        table.register(e.id(), e.dp_size());
    }
    table
}

/// A fresh native report with valid capacity and the given queue shape.
pub(crate) fn report_native(
    table: &EngineReportedLoadTable,
    engine: &Engine,
    waiting: u64,
    running: u64,
) {
    let native = NativeLoad {
        waiting_uncached_tokens: waiting * 100,
        total_tokens: (waiting + running) * 100,
        max_running_requests: 64,
        prefill_uncached_tokens_total: 0,
        prefill_busy_us_total: 0,
    };
    let report = with_native(
        basic_report(running, waiting, running * 100, 100_000),
        native,
    );
    table
        .ingest(engine.id(), 0, report, Instant::now())
        .expect("registered engine");
}

/// A fresh basic report.
pub(crate) fn report_basic(
    table: &EngineReportedLoadTable,
    engine: &Engine,
    waiting: u64,
    running: u64,
) {
    let report = basic_report(running, waiting, running * 100, 100_000);
    table
        .ingest(engine.id(), 0, report, Instant::now())
        .expect("registered engine");
}

pub(crate) fn caps(max_inflight: u64) -> Arc<AdmissionLimits> {
    Arc::new(AdmissionLimits {
        max_inflight_requests: Some(max_inflight),
        ..Default::default()
    })
}

pub(crate) fn no_caps() -> Arc<AdmissionLimits> {
    Arc::new(AdmissionLimits::default())
}

pub(crate) fn pick(
    rt: &tokio::runtime::Runtime,
    policy: &dyn Policy,
    engines: &[Arc<Engine>],
    stage: Role,
) -> Result<Pick, PickError> {
    let request = request(stage);
    rt.block_on(policy.pick(engines, &request))
}

pub(crate) fn ids(picks: &[Pick]) -> Vec<&str> {
    picks.iter().map(|p| p.engine.id().as_str()).collect()
}

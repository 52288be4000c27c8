//! Fixtures shared by the policy tests.

use std::sync::Arc;

use router_policy::test_kit::Reported;
use router_policy::{AdmissionLimits, Pick, PickError, PickRequest, Policy, RequestFacts};
use router_state::test_util::fleet;
use router_state::{Engine, EngineReportedLoadTable, Role};
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
    report(table, engine, true, waiting, running);
}

/// A fresh basic report.
pub(crate) fn report_basic(
    table: &EngineReportedLoadTable,
    engine: &Engine,
    waiting: u64,
    running: u64,
) {
    report(table, engine, false, waiting, running);
}

fn report(
    table: &EngineReportedLoadTable,
    engine: &Engine,
    native: bool,
    waiting: u64,
    running: u64,
) {
    let reported = Reported {
        native,
        waiting,
        running,
    };
    table
        .ingest(engine.id(), 0, reported.load_report(), Instant::now())
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

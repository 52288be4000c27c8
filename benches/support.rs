//! Helpers shared by the benches.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use router_state::test_util::{basic_report, with_native};
use router_state::{Engine, EngineReportedLoadTable, NativeLoad};

/// Polls a future that completes without waiting (every local policy's, a local
/// source's lookup).
pub(crate) fn ready<T>(future: impl Future<Output = T>) -> T {
    match std::pin::pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => panic!("a local policy or source never waits"),
    }
}

/// Registers the engines and gives each a fresh native report with distinct load.
pub(crate) fn loaded_table(engines: &[Arc<Engine>]) -> Arc<EngineReportedLoadTable> {
    let table = Arc::new(EngineReportedLoadTable::default());
    let now = tokio::time::Instant::now();
    for (i, engine) in engines.iter().enumerate() {
        table.register(engine.id(), engine.dp_size());
        let i = i as u64;
        let native = NativeLoad {
            waiting_uncached_tokens: (i * 37) % 1000,
            total_tokens: 5000 + i,
            max_running_requests: 256,
            prefill_uncached_tokens_total: 1000 * i,
            prefill_busy_us_total: 1000 * i,
        };
        let report = with_native(basic_report(i % 7, i % 5, 1000 + i, 100_000), native);
        table
            .ingest(engine.id(), 0, report, now)
            .expect("registered");
    }
    table
}

//! Replays a request trace through the router's real selection code against engines
//! modelled as engine-sim models them, on a virtual clock.
//!
//! A replay builds the router a configuration describes (its buckets, groups and
//! policies, load table, prefix indexes and affinity store, as `switchyard serve`
//! builds them), then feeds it the trace's requests at their arrival times. Each pick
//! goes to a modelled engine ([`engine_sim`]'s scheduling, cache and timing: running
//! slots, a waiting queue, prefill per uncached token, decode per token, LRU eviction),
//! whose load reports and KV events reach the router encoded as the engines publish
//! them. The same inputs give the same [`Summary`], to the byte once printed.
//!
//! ```
//! use router_replay::{ReplaySettings, SharedPrefixWorkload, oracle_cached_tokens, replay};
//! use router_config::{EngineConfig, ModelConfig, RouterConfig};
//!
//! let engines = (0..4).map(|i| EngineConfig::new(format!("e{i}"), format!("http://e{i}:8000"))).collect();
//! let config = RouterConfig::new(vec![ModelConfig::new("m", engines)]);
//! let trace = SharedPrefixWorkload { requests: 200, ..Default::default() }.generate();
//! let settings = ReplaySettings::default();
//! let report = replay(&config, &trace, Some("round_robin"), &settings)?;
//! let summary = report.summary("round_robin", oracle_cached_tokens(&trace, 16));
//! assert_eq!(summary.requests, 200);
//! assert_eq!(summary.rejected, 0);
//! # Ok::<(), router_replay::ReplayError>(())
//! ```

mod calibrate;
mod closed_loop;
mod diff;
mod engine;
mod error;
mod host;
mod policies;
mod records;
mod report;
mod router;
mod siblings;
mod sim;
mod trace;
mod workload;

pub use calibrate::{
    CAPACITY_RANGE, Calibration, CalibrationError, MIN_CALIBRATION_ANSWERS, calibrate, fit_capacity,
};
pub use closed_loop::{ClosedLoop, MAX_CLIENTS};
pub use diff::{Decision, Diff, RequestDiff};
pub use error::{ModelDefect, ReplayError, SettingsError, TraceMismatch};
pub use policies::{seeded, with_policy};
pub use records::{Recorded, read_records};
pub use report::{Outcome, PERCENTILES, RunReport, Summary, oracle_cached_tokens, table};
pub use router::selection;
pub use siblings::{SIBLING_WINDOW, siblings_on_first_engine};
pub use sim::{Arrivals, HostTier, LaggingFeeds, ReplaySettings};
pub use trace::{
    MAX_AT_US, MAX_LINE_BYTES, MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, MAX_REQUESTS, MAX_TRACE_BYTES,
    PageHashes, Segment, TraceError, TraceRequest, read_trace, write_trace,
};
pub use workload::{
    AgentWorkload, BurstWorkload, DocumentWorkload, Popularity, SharedPrefixWorkload, Workload,
    uncached_capacity,
};

use router_config::RouterConfig;

/// Replays `trace` through the router `config` describes, with every policy of type
/// `policy` when one is given (see [`with_policy`]); policies that draw random numbers
/// and name no seed get `settings.seed`.
///
/// # Errors
/// See [`ReplayError`].
pub fn replay(
    config: &RouterConfig,
    trace: &[TraceRequest],
    policy: Option<&str>,
    settings: &ReplaySettings,
) -> Result<RunReport, ReplayError> {
    let config = match policy {
        Some(name) => with_policy(config, name)?,
        None => config.clone(),
    };
    settings.check()?;
    let config = seeded(&config, settings.seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    runtime.block_on(async {
        let router = router::Router::build(&config)?;
        sim::run(&router, trace, settings).await
    })
}

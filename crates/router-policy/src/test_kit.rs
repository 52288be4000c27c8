//! A kit for property tests of engine selection (feature `test-kit`): proptest
//! strategies for engines, their load and requests, a [`Scenario`] that sets a fleet
//! and its load up, and the naive reference models ([`reference`]) this crate's own
//! property tests check every policy against. A gateway runs the same properties
//! against its own policies, or against these with its own admission, in its CI.
//!
//! ```
//! use proptest::prelude::*;
//! use router_policy::test_kit::{Scenario, admission_limits, engine_loads, reference};
//! use router_policy::{LeastLoadPolicy, PickRequest, Policy, RequestFacts};
//! use router_state::Role;
//! use std::sync::Arc;
//!
//! proptest!(ProptestConfig::with_cases(16), |(loads in engine_loads(1..8), limits in admission_limits())| {
//!     let scenario = Scenario::new("m", Role::Plain, &loads);
//!     let policy = LeastLoadPolicy::new(Arc::clone(&scenario.load), Arc::new(limits));
//!     let request = PickRequest::new(RequestFacts::new("m", 100), Role::Plain, "bucket");
//!     let outcome = scenario.block_on(policy.pick(&scenario.engines, &request));
//!     reference::check_pick(&scenario, &limits, &outcome, true).map_err(TestCaseError::fail)?;
//! });
//! ```

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use router_state::test_util::{basic_report, fleet, with_native};
use router_state::{
    Engine, EngineMetrics, EngineReportedLoadTable, InflightGuard, LoadReport, LoadTableConfig,
    NativeLoad, Role,
};
use tokio::time::Instant;

use crate::{AdmissionLimits, RequestFacts};

pub mod reference;

/// How long a scenario's load reports count as fresh: longer than any test runs.
const REPORTS_FRESH_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// What one engine reports, as the load feed would carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// Whether the report carries SGLang's native extension (queued tokens).
    pub native: bool,
    /// Requests waiting in the engine's queue.
    pub waiting: u64,
    /// Requests running on the engine.
    pub running: u64,
}

impl Reported {
    /// The report as the engine's load feed carries it: 100 tokens a request in KV
    /// (of 100,000) and, with the native extension, in the queue (64 running at most).
    pub fn load_report(&self) -> LoadReport {
        let basic = basic_report(self.running, self.waiting, self.running * 100, 100_000);
        if !self.native {
            return basic;
        }
        with_native(
            basic,
            NativeLoad {
                waiting_uncached_tokens: self.waiting * 100,
                total_tokens: (self.waiting + self.running) * 100,
                max_running_requests: 64,
                prefill_uncached_tokens_total: 0,
                prefill_busy_us_total: 0,
            },
        )
    }
}

/// One engine's load: the router's own requests in flight to it, and its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLoad {
    /// Requests the router has in flight to the engine.
    pub in_flight: usize,
    /// The engine's last report, if it sent one.
    pub report: Option<Reported>,
}

/// A request's size, from which [`RequestFacts`] are made for a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// The request's output limit, if it sets one.
    pub max_output_tokens: Option<u64>,
}

impl RequestShape {
    /// The request's facts for `model`.
    ///
    /// # Panics
    /// Never for shapes [`request_shape`] generates (their output limits are in range).
    pub fn facts<'a>(&self, model: &'a str) -> RequestFacts<'a> {
        RequestFacts::new(model, self.input_tokens)
            .with_max_output_tokens(self.max_output_tokens)
            .expect("generated output limits are in range")
    }
}

/// An engine's role: plain, prefill or decode.
pub fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Plain), Just(Role::Prefill), Just(Role::Decode)]
}

/// One engine's load: 0 to 3 requests in flight, and no report or a basic or native
/// one with up to 7 waiting and 7 running requests.
pub fn engine_load() -> impl Strategy<Value = EngineLoad> {
    (
        0usize..4,
        proptest::option::of((any::<bool>(), 0u64..8, 0u64..8)),
    )
        .prop_map(|(in_flight, report)| EngineLoad {
            in_flight,
            report: report.map(|(native, waiting, running)| Reported {
                native,
                waiting,
                running,
            }),
        })
}

/// The load of a fleet of `engines` engines.
pub fn engine_loads(engines: Range<usize>) -> impl Strategy<Value = Vec<EngineLoad>> {
    proptest::collection::vec(engine_load(), engines)
}

/// Admission caps on running, waiting and in-flight requests, each unset or small
/// enough for generated loads to reach.
pub fn admission_limits() -> impl Strategy<Value = AdmissionLimits> {
    (
        proptest::option::of(1u64..8),
        proptest::option::of(1u64..8),
        proptest::option::of(1u64..4),
    )
        .prop_map(|(running, waiting, inflight)| AdmissionLimits {
            max_running_requests: running,
            max_waiting_requests: waiting,
            max_inflight_requests: inflight,
            ..Default::default()
        })
}

/// A request of 1 to 32,767 prompt tokens, with or without an output limit.
pub fn request_shape() -> impl Strategy<Value = RequestShape> {
    (1u64..32_768, proptest::option::of(1u64..4_096)).prop_map(
        |(input_tokens, max_output_tokens)| RequestShape {
            input_tokens,
            max_output_tokens,
        },
    )
}

/// A fleet of one model and role with its load applied: the engines (`e0`, `e1`, ...),
/// the load table, and the in-flight guards that hold the generated in-flight counts.
///
/// A scenario owns a current-thread runtime to run picks on ([`Scenario::block_on`]),
/// so it is made and used outside any runtime: in a plain `#[test]` or `proptest!`,
/// not in a `#[tokio::test]`, where running or dropping a runtime panics.
#[derive(Debug)]
pub struct Scenario {
    /// The engines, sorted by id.
    pub engines: Vec<Arc<Engine>>,
    /// Their load.
    pub load: Arc<EngineReportedLoadTable>,
    runtime: tokio::runtime::Runtime,
    _guards: Vec<InflightGuard>,
}

impl Scenario {
    /// One engine of `model` and `role` for each of `loads`, with that load applied.
    ///
    /// # Panics
    /// If the current-thread runtime the scenario runs picks on cannot be built.
    pub fn new(model: &str, role: Role, loads: &[EngineLoad]) -> Self {
        let engines = fleet(model, role, "e", loads.len());
        // Reports stay fresh for the whole test, however slow the machine running it.
        let load = Arc::new(EngineReportedLoadTable::new(LoadTableConfig {
            freshness: REPORTS_FRESH_FOR,
        }));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        let mut guards = Vec::new();
        for (engine, state) in engines.iter().zip(loads) {
            load.register(engine.id(), engine.dp_size());
            guards.extend((0..state.in_flight).map(|_| load.acquire(engine.id())));
            if let Some(reported) = state.report {
                load.ingest(engine.id(), 0, reported.load_report(), Instant::now())
                    .expect("the engine was registered");
            }
        }
        Self {
            engines,
            load,
            runtime,
            _guards: guards,
        }
    }

    /// What a policy sees of `engine` now.
    pub fn metrics(&self, engine: &Engine) -> EngineMetrics {
        self.load.snapshot().observe(engine.id()).metrics()
    }

    /// Runs a pick (or any future) to completion on the scenario's runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

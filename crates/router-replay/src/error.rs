//! Why a replay could not run.

use std::fmt;

use router_policy::{ConfigError, PickError};
use router_state::kv_events::{BatchError, SkipReason};
use router_state::{EngineId, IngestError, LoadDecodeError};

use crate::closed_loop::MAX_CLIENTS;
use crate::sim::{
    MAX_FIRST_TOKEN_DELAY, MAX_HOST_PAGES, MAX_KV_DELAY, MAX_LOAD_COST, MAX_RATE, MAX_SLOTS,
    MIN_RATE,
};

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The configuration describes a router the replay cannot build: each problem
    /// with its path.
    #[error("configuration: {}", Problems(.0))]
    Config(Vec<ConfigError>),
    /// The policy type every group is to take is no policy type.
    #[error("configuration: policy {name:?}: {problem}")]
    Policy {
        /// The type asked for.
        name: String,
        /// Why it is no policy.
        problem: serde_json::Error,
    },
    /// The replay's settings are out of their bounds or do not fit the configuration.
    #[error("configuration: {0}")]
    Settings(SettingsError),
    /// A request of the trace asks for something the configuration does not serve.
    #[error("trace: request {request}: {problem}")]
    Trace {
        /// The request's line in the trace, from 1.
        request: usize,
        /// What it asks for.
        problem: TraceMismatch,
    },
    /// The modelled engines' feeds did not decode (a defect).
    #[error("engine model: {0}")]
    Model(ModelDefect),
    /// The replay's runtime could not start.
    #[error("starting the replay clock: {0}")]
    Runtime(std::io::Error),
}

// Each error's message holds the one it carries, so none is given as a `source` too:
// a chain of sources would print it twice.
impl From<SettingsError> for ReplayError {
    fn from(error: SettingsError) -> Self {
        Self::Settings(error)
    }
}

impl From<ModelDefect> for ReplayError {
    fn from(error: ModelDefect) -> Self {
        Self::Model(error)
    }
}

impl From<std::io::Error> for ReplayError {
    fn from(error: std::io::Error) -> Self {
        Self::Runtime(error)
    }
}

/// Problems joined by `; `.
struct Problems<'a>(&'a [ConfigError]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// A replay setting out of its bounds, or one the configuration does not fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The engines' running slots.
    #[error("engine slots must be 1 to {MAX_SLOTS}")]
    Slots,
    /// A prefill or decode rate.
    #[error(
        "the {stage} rate must be 0 (instant) or {MIN_RATE} to {MAX_RATE} tokens a second, not {rate}"
    )]
    Rate {
        /// `prefill` or `decode`.
        stage: &'static str,
        /// The rate given.
        rate: f64,
    },
    /// The engines' KV cache.
    #[error("the engines' KV cache must hold at least one page")]
    KvCapacity,
    /// Lagging feeds faster than the others.
    #[error("lagging feeds must take at least the KV-event delay of the others")]
    LaggingDelay,
    /// A KV-event delay.
    #[error("KV-event delays must be at most {} s", MAX_KV_DELAY.as_secs())]
    KvDelay,
    /// The host tier's size.
    #[error("the host tier must hold at most {MAX_HOST_PAGES} pages")]
    HostPages,
    /// The first-token delay.
    #[error("the first-token delay must be at most {} s", MAX_FIRST_TOKEN_DELAY.as_secs())]
    FirstTokenDelay,
    /// A first-token delay with a closed loop.
    #[error(
        "a first-token delay (calibration's) is replayed with open arrivals only: a closed loop's clients would not wait for it"
    )]
    DelayInClosedLoop,
    /// The host tier's load cost.
    #[error(
        "the host load cost must be 0 to {MAX_LOAD_COST} (a share of prefill time), not {cost}"
    )]
    HostLoadCost {
        /// The cost given.
        cost: f64,
    },
    /// A closed loop's clients.
    #[error("a closed loop must have 1 to {MAX_CLIENTS} clients, not {clients}")]
    Clients {
        /// The clients asked for.
        clients: usize,
    },
    /// A model's page size is not the engines'.
    #[error("model {model} has block_size {block_size} but the engines' page size is {page_size}")]
    PageSize {
        /// The model.
        model: String,
        /// Its block size.
        block_size: u32,
        /// The engines' page size.
        page_size: u32,
    },
    /// More lagging feeds than engines.
    #[error("{lagging} lagging feeds, but the configuration has {engines} engines")]
    LaggingFeeds {
        /// The lagging feeds asked for.
        lagging: usize,
        /// The engines configured.
        engines: usize,
    },
    /// More engines without KV events than engines.
    #[error("{silent} engines without KV events, but the configuration has {engines} engines")]
    SilentEngines {
        /// The silent engines asked for.
        silent: usize,
        /// The engines configured.
        engines: usize,
    },
}

/// What a trace's request asks for that the configuration does not serve.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceMismatch {
    /// It names no model, and several are served.
    #[error("it names no model and the configuration serves several")]
    NoModel,
    /// It names a model that is not served.
    #[error("model {0:?} is not one the configuration serves")]
    UnknownModel(String),
    /// Selection stopped on it (its prompt and output overflow a token count, say).
    #[error("{0}")]
    Refused(PickError),
}

/// A defect of the engine model: what it published did not reach the router.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelDefect {
    /// A load report did not decode.
    #[error("a load report did not decode: {0}")]
    LoadReport(LoadDecodeError),
    /// The load table refused a report.
    #[error("{0}")]
    Ingest(IngestError),
    /// A KV-event batch did not decode.
    #[error("a KV-event batch did not decode: {0}")]
    KvBatch(BatchError),
    /// The prefix index skipped an event.
    #[error("the index skipped an event of engine {engine}: {}", .reason.as_str())]
    Skipped {
        /// The engine that published it.
        engine: EngineId,
        /// Why it was skipped.
        reason: SkipReason,
    },
}

//! A gateway's routing core built from Switchyard's selection crates in code: two
//! length buckets of plain engines, one group each with its own policy and admission
//! caps, fed with load numbers the gateway measures itself.

use std::sync::Arc;

use router_buckets::{Bucket, BucketError, BucketGroups, BucketResolver, EngineGroup, TokenLimits};
use router_buckets::{EnginePicks, SelectError};
use router_policy::{AdmissionLimits, LeastLoadPolicy, PowerOfTwoPolicy, RequestFacts};
use router_state::{
    Engine, EngineId, EngineRegistry, EngineReportedLoadTable, InflightGuard, IngestError,
    LoadReport, RegistryError, Role,
};
use tokio::time::Instant;

/// The one model this gateway serves.
pub const MODEL: &str = "chat";

/// Prompts up to this many tokens go to the short bucket's engines first.
pub const SHORT_PROMPT_TOKENS: u64 = 4096;

/// The short bucket's cap on requests waiting at one engine.
pub const MAX_WAITING: u64 = 4;

/// A request routed to an engine; the engine counts it in flight until this is dropped.
#[derive(Debug)]
pub struct Routed {
    /// The engine picked.
    pub engine: EngineId,
    /// The bucket it came from.
    pub bucket: Arc<str>,
    _in_flight: InflightGuard,
}

/// Why a gateway could not be built.
#[derive(Debug)]
pub enum BuildError {
    /// An engine was refused by the registry.
    Registry(RegistryError),
    /// A bucket was refused.
    Bucket(BucketError),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Registry(e) => write!(f, "an engine was refused: {e}"),
            BuildError::Bucket(e) => write!(f, "a bucket was refused: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// The routing core: engines, their load, and the bucket resolver.
#[derive(Debug)]
pub struct Gateway {
    registry: EngineRegistry,
    load: Arc<EngineReportedLoadTable>,
    resolver: BucketResolver,
}

impl Gateway {
    /// A gateway over `short` engines (for prompts up to [`SHORT_PROMPT_TOKENS`],
    /// least load first, at most [`MAX_WAITING`] waiting) and `long` engines (any
    /// prompt, power of two, no caps), given as `(id, url)`.
    ///
    /// # Errors
    /// A refused engine (a bad id or URL, or one listed twice) or bucket.
    pub fn new(short: &[(&str, &str)], long: &[(&str, &str)]) -> Result<Self, BuildError> {
        let registry = EngineRegistry::new();
        let load = Arc::new(EngineReportedLoadTable::default());
        for (id, url) in short.iter().chain(long) {
            let engine = Engine::new(*id, *url, MODEL, Role::Plain);
            load.register(engine.id(), engine.dp_size());
            registry.add(engine).map_err(BuildError::Registry)?;
        }
        let ids = |engines: &[(&str, &str)]| -> Vec<EngineId> {
            engines.iter().map(|(id, _)| (*id).into()).collect()
        };
        let capped = Arc::new(AdmissionLimits {
            max_waiting_requests: Some(MAX_WAITING),
            ..AdmissionLimits::default()
        });
        let least_load = Arc::new(LeastLoadPolicy::new(Arc::clone(&load), capped));
        let power_of_two = Arc::new(PowerOfTwoPolicy::new(
            Arc::clone(&load),
            Arc::new(AdmissionLimits::default()),
        ));
        let short_bucket = Bucket::new(
            "short",
            0,
            TokenLimits {
                min: 0,
                max: Some(SHORT_PROMPT_TOKENS),
            },
            None,
            BucketGroups::Plain(EngineGroup::with_members(least_load, ids(short))),
        )
        .map_err(BuildError::Bucket)?;
        let long_bucket = Bucket::new(
            "long",
            0,
            TokenLimits::default(),
            None,
            BucketGroups::Plain(EngineGroup::with_members(power_of_two, ids(long))),
        )
        .map_err(BuildError::Bucket)?;
        let resolver =
            BucketResolver::new(vec![short_bucket, long_bucket]).map_err(BuildError::Bucket)?;
        Ok(Self {
            registry,
            load,
            resolver,
        })
    }

    /// Records what the gateway measured of `engine`: requests running and waiting.
    ///
    /// # Errors
    /// The engine is not one of the gateway's.
    pub fn report(&self, engine: &str, running: u64, waiting: u64) -> Result<(), IngestError> {
        let report = LoadReport {
            running_requests: running,
            waiting_requests: waiting,
            used_kv_tokens: 0,
            max_kv_tokens: None,
            dp_rank: None,
            native: None,
        };
        self.load.ingest(&engine.into(), 0, report, Instant::now())
    }

    /// Picks an engine for a prompt of `input_tokens`, counted in flight until the
    /// answer is dropped.
    ///
    /// # Errors
    /// No bucket fits the request or admits it.
    pub async fn route(&self, input_tokens: u64) -> Result<Routed, SelectError> {
        let request = RequestFacts::new(MODEL, input_tokens);
        let selection = self
            .resolver
            .select(&self.registry.snapshot(), &request)
            .await?;
        // Both buckets are plain; of a prefill/decode pair, the decode engine answers.
        let (EnginePicks::Plain(pick) | EnginePicks::Pd { decode: pick, .. }) =
            selection.pick.engines;
        Ok(Routed {
            engine: pick.engine.id().clone(),
            bucket: selection.pick.bucket,
            _in_flight: self.load.acquire(pick.engine.id()),
        })
    }
}

#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;

//! Engine-selection policies: given one engine group's candidates and a request's
//! facts, choose one engine that passes admission.
//!
//! Every policy implements the object-safe [`Policy`] trait and returns a boxed
//! future, so a policy that consults a remote prefix indexer and one that answers at
//! once share one interface. A policy owns the state handles it reads (the load table,
//! the prefix source, the affinity backend), given at construction; a request
//! carries only facts and candidates. Admission ([`EngineAdmission`],
//! [`AdmissionLimits`]) is a separate acceptance step each policy calls where its
//! algorithm needs it, so ordering (the policy) and acceptance (the caps) stay apart.
//! This crate does no network I/O of its own.
//!
//! ```
//! use std::sync::Arc;
//! use router_policy::{AdmissionLimits, PickRequest, Policy, PowerOfTwoPolicy, RequestFacts};
//! use router_state::{EngineReportedLoadTable, Role, Engine};
//!
//! let load = Arc::new(EngineReportedLoadTable::default());
//! let caps = AdmissionLimits { max_inflight_requests: Some(8), ..Default::default() };
//! let policy = PowerOfTwoPolicy::with_seed(Arc::clone(&load), Arc::new(caps), 7);
//!
//! let engines: Vec<Arc<Engine>> = ["A1", "A2", "A3"]
//!     .into_iter()
//!     .map(|id| Arc::new(Engine::new(id, format!("http://{id}:8000"), "chat", Role::Plain)))
//!     .collect();
//! // A1 is busy: power-of-two prefers an idle engine whenever A1 is sampled.
//! let _busy: Vec<_> = (0..4).map(|_| load.acquire(engines[0].id())).collect();
//!
//! let request = PickRequest::new(RequestFacts::new("chat", 512), Role::Plain, "any-length");
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let pick = policy.pick(&engines, &request).await?;
//! assert_ne!(pick.engine.id().as_str(), "A1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod admission;
mod affinity;
mod cache;
mod cache_aware;
mod config;
mod config_error;
mod dropped;
mod error;
mod explain;
mod facts;
mod future;
mod least_load;
mod pick;
mod policy;
mod power_of_two;
mod pressure;
mod random;
mod rng;
mod round_robin;
mod settings;
mod walk;

#[cfg(feature = "test-kit")]
pub mod test_kit;

pub use admission::{AdmissionDecision, AdmissionError, AdmissionLimits, EngineAdmission};
pub use affinity::{
    SessionAwareConfig, SessionAwarePolicy, StickyConfig, StickyFallback, StickyPolicy,
};
pub use cache::{
    CacheLookup, CacheQueryError, CacheSource, Estimated, EventSource, LocalCacheSource,
    MAX_PENDING_MS, MAX_ROUTED_AGE_MS, MAX_ROUTED_PAGES, PrefixHits, PrefixMemo, RoutedCacheSource,
    RoutedPagesSettings,
};
pub use cache_aware::{
    CACHE_AWARE_WINDOW, CacheAwareConfig, CacheAwarePolicy, CacheScore, CandidateBounds,
    PressureGuard, Real,
};
pub use config::PolicyConfig;
pub use config_error::{ConfigError, PolicyConfigError};
pub use dropped::{
    DROPPED_OPTIONS, DROPPED_POLICY_TYPES, DroppedOption, dropped_option, dropped_policy_type,
};
pub use error::{LimitExceeded, MAX_UNPAIRED_NAMED, PickError, Rejection, Unpaired};
pub use explain::{Explanation, Observation};
pub use facts::{RequestFacts, expected_peak};
pub use future::BoxFuture;
pub use least_load::{LEAST_LOAD_WINDOW, LeastLoadPolicy, LoadBasedConfig};
pub use pick::{Pick, PickReason};
pub use policy::{PickRequest, Policy};
pub use power_of_two::{PowerOfTwoConfig, PowerOfTwoPolicy};
pub use random::{RandomConfig, RandomPolicy};
pub use round_robin::{RoundRobinConfig, RoundRobinPolicy};
pub use settings::{AffinityBackend, PolicyHandles, PolicySettings};

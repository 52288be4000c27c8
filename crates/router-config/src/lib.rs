//! Switchyard's configuration: the YAML file's types with their JSON Schema, parsing
//! that names the path and line of an error, field checks that name the path of
//! every problem, and the one builder of the selection a configuration describes
//! ([`SelectionPlan::build`]: buckets, groups, policies with their admission caps,
//! prefix indexes), which both the router and the replay use.
//!
//! It does no I/O of its own and knows nothing of HTTP: tokenizers and the shared
//! prefix indexer's client come from the caller ([`Resources`]), as does the affinity
//! store behind [`SelectionState`].
//!
//! ```
//! use router_config::RouterConfig;
//!
//! let config = RouterConfig::from_yaml(
//!     "models: [{id: m, engines: [{id: A1, url: 'http://127.0.0.1:31011', role: plain}]}]",
//! )?;
//! assert!(config.check_fields().is_empty());
//! let bad = RouterConfig::from_yaml("models: [{id: m, block_size: 0}]")?;
//! assert_eq!(bad.check_fields()[0].to_string(), "models[0].block_size: must be at least 1");
//! # Ok::<(), router_config::ConfigError>(())
//! ```

mod admin;
mod affinity;
mod decisions;
mod discovery;
mod engine_tls;
mod flow;
mod health;
mod limits;
mod load;
mod model;
mod picker;
mod plan;
mod prefix_indexer;
mod retries;
mod router;
mod routing_headers;
mod secret;
mod timeouts;
mod traces;

pub use admin::AdminConfig;
pub use affinity::{AffinityBackendKind, AffinitySettings, RedisConfig};
pub use decisions::DecisionsConfig;
pub use discovery::{DiscoveryConfig, KubernetesConfig, KubernetesModel, KubernetesPool};
pub use engine_tls::EngineTlsConfig;
pub use flow::{
    FlowConfig, MAX_TENANT_BYTES, PriorityConfig, PriorityOrder, QueueConfig, TenantsConfig,
    check_tenant,
};
pub use health::HealthConfig;
pub use limits::{DEFAULT_TOKENIZE_CACHE_BYTES, LimitsConfig};
pub use load::LoadConfig;
pub use model::{EngineConfig, EngineRole, ModelConfig, PdProtocol, RolePolicies, ServingEngine};
pub use picker::{MAX_PICKER_STREAMS, PickerConfig, PickerTls};
pub use plan::{ModelRouting, ModelSelection, Resources, SelectionPlan, SelectionState};
pub use prefix_indexer::{MAX_INDEXERS, PrefixIndexerConfig};
pub use retries::RetryConfig;
pub use router::RouterConfig;
pub use router_policy::ConfigError;
pub use routing_headers::RoutingHeaders;
pub use secret::Secret;
pub use timeouts::TimeoutConfig;
pub use traces::TracesConfig;

/// The longest duration a `*_ms` setting takes: one day.
pub const MAX_MS: u64 = 86_400_000;

#[cfg(test)]
mod tests;

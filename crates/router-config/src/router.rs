//! The whole file: its sections, parsing with field paths, the JSON Schema, and the
//! field checks, each section checking its own.

use std::net::SocketAddr;

use router_policy::ConfigError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::validate_models;
use crate::{
    AdminConfig, AffinitySettings, DecisionsConfig, DiscoveryConfig, EngineTlsConfig, HealthConfig,
    LimitsConfig, LoadConfig, ModelConfig, PickerConfig, PrefixIndexerConfig, RetryConfig,
    RolePolicies, RoutingHeaders, TimeoutConfig, TracesConfig,
};

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// Address the router listens on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The models served; each is a set of engines and its buckets.
    pub models: Vec<ModelConfig>,
    /// Default policy per role for groups that name none (`round_robin` for plain,
    /// `power_of_two` for prefill and decode when absent).
    #[serde(default)]
    pub policies: RolePolicies,
    /// Upstream timeouts.
    #[serde(default)]
    pub timeouts: TimeoutConfig,
    /// TLS to engines at `https://` URLs: the authorities trusted besides the
    /// system's, and a client certificate; the system's authorities alone when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_tls: Option<EngineTlsConfig>,
    /// Health probes and the circuit breaker.
    #[serde(default)]
    pub health: HealthConfig,
    /// Engine load reports.
    #[serde(default)]
    pub load: LoadConfig,
    /// The engine admin API (`/workers`).
    #[serde(default)]
    pub admin: AdminConfig,
    /// Session and routing-key affinity.
    #[serde(default)]
    pub affinity: AffinitySettings,
    /// Bounds on what clients may hold.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Retries of requests an engine never started.
    #[serde(default)]
    pub retries: RetryConfig,
    /// Engines found besides the file and the admin API (Kubernetes pods).
    #[serde(default)]
    pub discovery: DiscoveryConfig,
    /// A prefix indexer shared by router replicas (`switchyard indexer`): cache-aware
    /// groups ask it instead of keeping an index of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_indexer: Option<PrefixIndexerConfig>,
    /// Decision records: a JSON-lines file of sampled routing decisions; off when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisions: Option<DecisionsConfig>,
    /// The endpoint picker of a Gateway API inference gateway (Envoy's `ext_proc`);
    /// off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picker: Option<PickerConfig>,
    /// The router's own spans, exported over OTLP; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<TracesConfig>,
    /// What answers tell clients of their routing: `all` (the default),
    /// `without_engines` or `none`.
    #[serde(default)]
    pub routing_headers: RoutingHeaders,
    /// How long in-flight requests may finish after a shutdown signal, in milliseconds.
    #[serde(default = "default_grace")]
    pub shutdown_grace_ms: u64,
}

impl RouterConfig {
    /// A configuration of `models` with every other setting at its default.
    pub fn new(models: Vec<ModelConfig>) -> Self {
        Self {
            listen: default_listen(),
            models,
            policies: RolePolicies::default(),
            timeouts: TimeoutConfig::default(),
            engine_tls: None,
            health: HealthConfig::default(),
            load: LoadConfig::default(),
            admin: AdminConfig::default(),
            affinity: AffinitySettings::default(),
            prefix_indexer: None,
            decisions: None,
            picker: None,
            traces: None,
            routing_headers: RoutingHeaders::default(),
            discovery: DiscoveryConfig::default(),
            limits: LimitsConfig::default(),
            retries: RetryConfig::default(),
            shutdown_grace_ms: default_grace(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8080))
}

fn default_grace() -> u64 {
    30_000
}

impl RouterConfig {
    /// Parses YAML; an error names the path of the field and its line.
    ///
    /// # Errors
    /// The first syntax or type error.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let deserializer = serde_norway::Deserializer::from_str(text);
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            // The YAML error may already start with (a prefix of) the path.
            let message = match message.split_once(": ") {
                Some((prefix, rest)) if !prefix.contains(' ') && path.starts_with(prefix) => {
                    rest.to_owned()
                }
                _ => message,
            };
            let path = if path == "." {
                "(root)".to_owned()
            } else {
                path
            };
            ConfigError::at(path, message)
        })
    }

    /// The configuration's JSON Schema.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(RouterConfig)).expect("a schema serializes")
    }

    /// Every problem of the fields themselves, needing no file and no network; the
    /// buckets and policies are checked by building them
    /// ([`SelectionPlan::build`](crate::SelectionPlan::build)), tokenizers and the
    /// admin token file by whoever reads them. Each section checks its own fields;
    /// the whole file is taken apart here, so a new section cannot go unchecked.
    pub fn check_fields(&self) -> Vec<ConfigError> {
        let Self {
            listen,
            models,
            policies,
            timeouts,
            engine_tls,
            health,
            load,
            admin,
            affinity,
            limits,
            retries,
            discovery,
            prefix_indexer,
            decisions,
            picker,
            traces,
            // Every value is valid.
            routing_headers: _,
            // Any grace: a longer wait than a clock can tell is waiting for good.
            shutdown_grace_ms: _,
        } = self;
        let mut errors = Vec::new();
        affinity.validate(&mut errors);
        retries.validate(&mut errors);
        if let Some(decisions) = decisions {
            decisions.validate(&mut errors);
        }
        if let Some(traces) = traces {
            traces.validate(&mut errors);
        }
        let model_ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        discovery.validate(&model_ids, &mut errors);
        discovery.validate_objectives(models, &mut errors);
        if let Some(indexer) = prefix_indexer {
            indexer.validate(&mut errors);
        }
        timeouts.validate(&mut errors);
        if let Some(engine_tls) = engine_tls {
            engine_tls.validate(&mut errors);
        }
        limits.validate(&mut errors);
        health.validate(&mut errors);
        load.validate(&mut errors);
        admin.validate_listen(*listen, &mut errors);
        if let Some(picker) = picker {
            picker.validate(*listen, admin.listen, models, discovery, &mut errors);
        }
        if models.is_empty() {
            errors.push(ConfigError::at("models", "must list at least one model"));
        }
        policies.validate("policies", &mut errors);
        validate_models(models, &mut errors);
        errors
    }
}

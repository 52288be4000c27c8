//! The router's YAML configuration: types with JSON Schema, parsing with field paths,
//! and validation that names the path of every problem.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use router_buckets::{BucketConfig, DefaultPolicies};
use router_fleet::MAX_DP_SIZE;
use router_policy::{ConfigError, PolicyConfig};
use router_state::kv_events::IndexConfig;
use router_state::{ModelMode, Role, check_name};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// The router's own spans, exported over OTLP; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<TracesConfig>,
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
            health: HealthConfig::default(),
            load: LoadConfig::default(),
            admin: AdminConfig::default(),
            affinity: AffinitySettings::default(),
            prefix_indexer: None,
            decisions: None,
            traces: None,
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

/// One model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The `model` field clients send.
    pub id: String,
    /// Path to the model's `tokenizer.json`; the chat template comes from the
    /// `tokenizer_config.json` beside it, used when a bucket bounds prompt length or
    /// a policy reads prompts. Absent (or unused) = prompt length estimated from size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// KV page size in tokens, for prefix hashing.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Most KV pages the model's prefix index keeps (`cache_aware` groups); past it
    /// the least recently matched pages are forgotten. About 117 bytes per page.
    #[serde(default = "default_prefix_index_pages")]
    pub prefix_index_pages: usize,
    /// The model's engines.
    #[serde(default)]
    pub engines: Vec<EngineConfig>,
    /// Buckets; absent = one catch-all bucket over every engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<BucketConfig>>,
    /// Default policies of this model's groups, overriding the router-wide ones.
    #[serde(default)]
    pub policies: RolePolicies,
    /// How the model's prefill and decode engines hand a request over.
    #[serde(default)]
    pub pd_protocol: PdProtocol,
}

/// How a model's prefill and decode engines hand a request over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PdProtocol {
    /// SGLang's bootstrap rendezvous: both legs sent at once, with the prefill
    /// engine's bootstrap address and one fresh bootstrap room.
    #[default]
    Sglang,
    /// vLLM's `kv_transfer_params` (its NIXL connector, as vLLM's own proxy drives
    /// it): the prefill leg first, for one token and not streamed; the
    /// `kv_transfer_params` of its answer then go with the decode leg, whose answer
    /// the client gets.
    Vllm,
}

impl ModelConfig {
    /// A model of `engines` with one catch-all bucket and default settings.
    pub fn new(id: impl Into<String>, engines: Vec<EngineConfig>) -> Self {
        Self {
            id: id.into(),
            tokenizer: None,
            block_size: default_block_size(),
            prefix_index_pages: default_prefix_index_pages(),
            engines,
            buckets: None,
            policies: RolePolicies::default(),
            pd_protocol: PdProtocol::default(),
        }
    }
}

fn default_block_size() -> u32 {
    16
}

/// The smallest prefix index accepted: below it eviction would run on every batch.
const MIN_PREFIX_INDEX_PAGES: usize = 1024;

fn default_prefix_index_pages() -> usize {
    IndexConfig::default().max_nodes
}

/// One engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Unique id across the router; appears in headers, metrics and errors.
    pub id: String,
    /// Base URL, e.g. `http://10.0.0.7:30000`.
    pub url: String,
    /// Plain, prefill or decode; absent = read from the engine's `/server_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<EngineRole>,
    /// A prefill engine's bootstrap port; absent = from `/server_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Data-parallel ranks; absent = from `/server_info`, else 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_size: Option<u32>,
    /// Base port of the engine's `LoadStat` feed (rank r = base + r); absent = from
    /// `/server_info`'s `kv_events` block, else no feed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_port: Option<u16>,
    /// Base port of the engine's KV-event publisher (rank r = base + r), for
    /// cache-aware routing; absent = from `/server_info`'s `kv_events` block (vLLM,
    /// which has no `/server_info`, needs it set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_port: Option<u16>,
    /// Base port of the engine's KV-event replay socket; absent = from
    /// `/server_info`, else gaps cannot be repaired and clear the engine's entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_replay_port: Option<u16>,
}

impl EngineConfig {
    /// An engine at `url` whose role, ports and ranks come from its `/server_info`.
    pub fn new(id: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            url: url.into(),
            role: None,
            bootstrap_port: None,
            dp_size: None,
            load_port: None,
            kv_port: None,
            kv_replay_port: None,
        }
    }
}

/// An engine role in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EngineRole {
    /// Serves whole requests.
    Plain,
    /// The prefill side of a PD pair.
    Prefill,
    /// The decode side of a PD pair.
    Decode,
}

impl From<EngineRole> for Role {
    fn from(role: EngineRole) -> Self {
        match role {
            EngineRole::Plain => Role::Plain,
            EngineRole::Prefill => Role::Prefill,
            EngineRole::Decode => Role::Decode,
        }
    }
}

/// Default policies per role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolePolicies {
    /// For plain groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<PolicyConfig>,
    /// For prefill groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PolicyConfig>,
    /// For decode groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<PolicyConfig>,
}

impl RolePolicies {
    /// These defaults over `fallback`.
    pub fn over(&self, fallback: &DefaultPolicies) -> DefaultPolicies {
        DefaultPolicies {
            plain: self.plain.clone().unwrap_or_else(|| fallback.plain.clone()),
            prefill: self
                .prefill
                .clone()
                .unwrap_or_else(|| fallback.prefill.clone()),
            decode: self
                .decode
                .clone()
                .unwrap_or_else(|| fallback.decode.clone()),
        }
    }
}

/// Upstream timeouts; each gives the client a 504.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutConfig {
    /// Connecting to an engine, in milliseconds.
    #[serde(default = "default_connect")]
    pub connect_ms: u64,
    /// From sending a request to the engine's response head, in milliseconds.
    #[serde(default = "default_first_byte")]
    pub first_byte_ms: u64,
    /// Longest silence between two body chunks of a response, in milliseconds.
    #[serde(default = "default_idle")]
    pub idle_ms: u64,
    /// How long an idle engine connection is kept for reuse, in milliseconds; keep
    /// it below the engines' keep-alive timeout (uvicorn's is 5 s).
    #[serde(default = "default_pool_idle")]
    pub pool_idle_ms: u64,
    /// How long a client may take to send a request head, counted from its first
    /// byte (from the accept, for a connection's first request), in milliseconds;
    /// then the connection is closed.
    #[serde(default = "default_client_header")]
    pub client_header_ms: u64,
    /// How long a kept-alive client connection may sit idle between a response and
    /// the next request's first byte, in milliseconds; then it is closed.
    #[serde(default = "default_client_idle")]
    pub client_idle_ms: u64,
    /// How long a client may take to send a whole request body, in milliseconds;
    /// then it gets a 408.
    #[serde(default = "default_client_body")]
    pub client_body_ms: u64,
    /// How long a client may accept no byte of an answer (a stream it stopped
    /// reading), in milliseconds; then the connection is closed, the engine legs are
    /// cancelled and the engines' in-flight slots released.
    #[serde(default = "default_client_write")]
    pub client_write_ms: u64,
}

fn default_connect() -> u64 {
    2_000
}
fn default_first_byte() -> u64 {
    300_000
}
fn default_idle() -> u64 {
    120_000
}
fn default_pool_idle() -> u64 {
    4_000
}
fn default_client_header() -> u64 {
    10_000
}
fn default_client_idle() -> u64 {
    60_000
}
fn default_client_body() -> u64 {
    30_000
}
fn default_client_write() -> u64 {
    30_000
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        Self {
            connect_ms: default_connect(),
            first_byte_ms: default_first_byte(),
            idle_ms: default_idle(),
            pool_idle_ms: default_pool_idle(),
            client_header_ms: default_client_header(),
            client_idle_ms: default_client_idle(),
            client_body_ms: default_client_body(),
            client_write_ms: default_client_write(),
        }
    }
}

/// The longest duration a `*_ms` setting takes: one day.
pub(crate) const MAX_MS: u64 = 86_400_000;

/// The shortest interval between reads of an engine's `/metrics`.
const MIN_METRICS_INTERVAL_MS: u64 = 10;

/// The most prompts `limits.tokenize_concurrency` lets be tokenized at once.
const MAX_TOKENIZE_CONCURRENCY: usize = 1024;

/// The fewest bytes `limits.tokenize_cache_bytes` allows, but for 0 (no cache): less
/// would keep no long prompt's prefix.
const MIN_TOKENIZE_CACHE_BYTES: u64 = 1 << 20;

/// The most bytes `limits.tokenize_cache_bytes` allows.
const MAX_TOKENIZE_CACHE_BYTES: u64 = 16 << 30;

/// The most client connections `limits.max_connections` allows.
const MAX_CONNECTIONS: usize = 1 << 20;

/// Bounds on what clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Most client connections open at once; more wait in the listen backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// The largest message an engine's ZeroMQ feeds may send (load reports, KV-event
    /// batches, replays), in bytes; a larger one closes the feed's connection before
    /// it is read, and the feed reconnects.
    #[serde(default = "default_zmq_max_message_bytes")]
    pub zmq_max_message_bytes: usize,
    /// Prompts tokenized at once, each on a thread of its own (this many threads,
    /// apart from those serving requests); absent = one per core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenize_concurrency: Option<usize>,
    /// Bytes of long prompts' prefixes' token ids kept per model (0: none), so the
    /// next turn of a conversation, which sends the whole history again, tokenizes
    /// only what is new (byte-level BPE tokenizers).
    #[serde(default = "default_tokenize_cache_bytes")]
    pub tokenize_cache_bytes: usize,
}

fn default_tokenize_cache_bytes() -> usize {
    crate::tokenize::DEFAULT_PREFIX_CACHE_BYTES
}

fn default_max_connections() -> usize {
    4096
}

fn default_zmq_max_message_bytes() -> usize {
    router_state::DEFAULT_MAX_FEED_MESSAGE_BYTES
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(),
            zmq_max_message_bytes: default_zmq_max_message_bytes(),
            tokenize_concurrency: None,
            tokenize_cache_bytes: default_tokenize_cache_bytes(),
        }
    }
}

/// Health probes (`GET /health`) and the circuit breaker fed by dispatch failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Time between probes of an engine, in milliseconds.
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// A probe's timeout, in milliseconds.
    #[serde(default = "default_probe_timeout")]
    pub timeout_ms: u64,
    /// Consecutive failed probes that make an engine unhealthy.
    #[serde(default = "default_failures")]
    pub failure_threshold: u32,
    /// Consecutive passed probes that make an unhealthy engine healthy again.
    #[serde(default = "default_successes")]
    pub success_threshold: u32,
    /// Consecutive failed dispatches that open an engine's breaker.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker waits before one half-open probe, in milliseconds.
    #[serde(default = "default_cooldown")]
    pub breaker_cooldown_ms: u64,
}

fn default_interval() -> u64 {
    2_000
}
fn default_probe_timeout() -> u64 {
    2_000
}
fn default_failures() -> u32 {
    3
}
fn default_successes() -> u32 {
    2
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_cooldown() -> u64 {
    10_000
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_ms: default_interval(),
            timeout_ms: default_probe_timeout(),
            failure_threshold: default_failures(),
            success_threshold: default_successes(),
            breaker_failures: default_breaker_failures(),
            breaker_cooldown_ms: default_cooldown(),
        }
    }
}

/// Engine load reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadConfig {
    /// How long a rank's report stays fresh after receipt, in milliseconds.
    #[serde(default = "default_freshness")]
    pub freshness_ms: u64,
    /// How often an engine that serves no `/server_info` (vLLM, which has no
    /// `LoadStat` feed) has its load read from its `/metrics`, in milliseconds; 0
    /// never reads it.
    #[serde(default = "default_metrics_interval")]
    pub metrics_interval_ms: u64,
}

fn default_freshness() -> u64 {
    5_000
}

fn default_metrics_interval() -> u64 {
    1_000
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            freshness_ms: default_freshness(),
            metrics_interval_ms: default_metrics_interval(),
        }
    }
}

/// Where a router's cache-aware groups look prompts up when replicas share one
/// prefix indexer.
///
/// ```yaml
/// prefix_indexer: {url: "http://10.0.0.5:30100", timeout_ms: 50}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrefixIndexerConfig {
    /// The indexer's base URL, `http://host:port`.
    pub url: String,
    /// Longest wait for a lookup, in milliseconds (1 to 10000); past it the pick is
    /// `cache_unavailable` and the cache-miss fallback runs.
    #[serde(default = "default_indexer_timeout")]
    pub timeout_ms: u64,
}

fn default_indexer_timeout() -> u64 {
    50
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
    /// buckets, policies and tokenizers are checked by building them
    /// ([`RouterConfig::validate`]).
    pub fn check_fields(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        self.affinity.validate(&mut errors);
        self.retries.validate(&mut errors);
        if let Some(decisions) = &self.decisions {
            decisions.validate(&mut errors);
        }
        if let Some(traces) = &self.traces {
            traces.validate(&mut errors);
        }
        let models: Vec<&str> = self.models.iter().map(|m| m.id.as_str()).collect();
        self.discovery.validate(&models, &mut errors);
        if let Some(indexer) = &self.prefix_indexer {
            if let Err(e) = router_upstream::check_engine_url(&indexer.url) {
                errors.push(ConfigError::at("prefix_indexer.url", e));
            }
            if !(1..=10_000).contains(&indexer.timeout_ms) {
                errors.push(ConfigError::at(
                    "prefix_indexer.timeout_ms",
                    "must be 1 to 10000",
                ));
            }
        }
        for (field, value) in [
            ("timeouts.connect_ms", self.timeouts.connect_ms),
            ("timeouts.first_byte_ms", self.timeouts.first_byte_ms),
            ("timeouts.idle_ms", self.timeouts.idle_ms),
            ("timeouts.pool_idle_ms", self.timeouts.pool_idle_ms),
            ("timeouts.client_header_ms", self.timeouts.client_header_ms),
            ("timeouts.client_idle_ms", self.timeouts.client_idle_ms),
            ("timeouts.client_body_ms", self.timeouts.client_body_ms),
            ("timeouts.client_write_ms", self.timeouts.client_write_ms),
            ("limits.max_connections", self.limits.max_connections as u64),
            (
                "limits.zmq_max_message_bytes",
                self.limits.zmq_max_message_bytes as u64,
            ),
            ("health.interval_ms", self.health.interval_ms),
            ("health.timeout_ms", self.health.timeout_ms),
            (
                "health.failure_threshold",
                u64::from(self.health.failure_threshold),
            ),
            (
                "health.success_threshold",
                u64::from(self.health.success_threshold),
            ),
            (
                "health.breaker_failures",
                u64::from(self.health.breaker_failures),
            ),
            ("load.freshness_ms", self.load.freshness_ms),
        ] {
            if value == 0 {
                errors.push(ConfigError::at(field, "must be at least 1"));
            } else if field.ends_with("_ms") && value > MAX_MS {
                errors.push(ConfigError::at(
                    field,
                    format_args!("must be at most {MAX_MS} (one day)"),
                ));
            }
        }
        let interval = self.load.metrics_interval_ms;
        if interval != 0 && !(MIN_METRICS_INTERVAL_MS..=MAX_MS).contains(&interval) {
            errors.push(ConfigError::at(
                "load.metrics_interval_ms",
                format_args!(
                    "must be 0 (never read /metrics) or between {MIN_METRICS_INTERVAL_MS} and {MAX_MS} (one day)"
                ),
            ));
        }
        if let Some(n) = self.limits.tokenize_concurrency
            && !(1..=MAX_TOKENIZE_CONCURRENCY).contains(&n)
        {
            errors.push(ConfigError::at(
                "limits.tokenize_concurrency",
                format_args!("must be between 1 and {MAX_TOKENIZE_CONCURRENCY}"),
            ));
        }
        let cache = self.limits.tokenize_cache_bytes as u64;
        if cache != 0 && !(MIN_TOKENIZE_CACHE_BYTES..=MAX_TOKENIZE_CACHE_BYTES).contains(&cache) {
            errors.push(ConfigError::at(
                "limits.tokenize_cache_bytes",
                format_args!(
                    "must be 0 (no cache) or between {MIN_TOKENIZE_CACHE_BYTES} (1 MiB) and {MAX_TOKENIZE_CACHE_BYTES} (16 GiB)"
                ),
            ));
        }
        if self.limits.max_connections > MAX_CONNECTIONS {
            errors.push(ConfigError::at(
                "limits.max_connections",
                format_args!("must be at most {MAX_CONNECTIONS}"),
            ));
        }
        if self
            .admin
            .listen
            .is_some_and(|admin| admin == self.listen && admin.port() != 0)
        {
            errors.push(ConfigError::at(
                "admin.listen",
                "must differ from listen; omit it to serve the admin API on the public address",
            ));
        }
        if self.models.is_empty() {
            errors.push(ConfigError::at("models", "must list at least one model"));
        }
        for (role, policy) in [
            ("plain", &self.policies.plain),
            ("prefill", &self.policies.prefill),
            ("decode", &self.policies.decode),
        ] {
            if let Some(Err(e)) = policy.as_ref().map(PolicyConfig::validate) {
                errors.push(ConfigError::at(format!("policies.{role}"), e.to_string()));
            }
        }
        let mut model_ids: BTreeMap<&str, usize> = BTreeMap::new();
        let mut engine_ids: BTreeMap<&str, String> = BTreeMap::new();
        for (m, model) in self.models.iter().enumerate() {
            let at = |field: &str| format!("models[{m}].{field}");
            if let Err(e) = check_name(&model.id) {
                errors.push(ConfigError::at(at("id"), e));
            } else if let Some(first) = model_ids.insert(&model.id, m) {
                errors.push(ConfigError::at(
                    at("id"),
                    format!("duplicate model id {:?} (also models[{first}])", model.id),
                ));
            }
            for (b, bucket) in model.buckets.iter().flatten().enumerate() {
                // Bucket ids reach metric labels too; an empty one is the bucket
                // checks' to report.
                if !bucket.id.is_empty()
                    && let Err(e) = check_name(&bucket.id)
                {
                    errors.push(ConfigError::at(at(&format!("buckets[{b}].id")), e));
                }
            }
            if model.block_size == 0 {
                errors.push(ConfigError::at(at("block_size"), "must be at least 1"));
            }
            if model.prefix_index_pages < MIN_PREFIX_INDEX_PAGES {
                errors.push(ConfigError::at(
                    at("prefix_index_pages"),
                    format!("must be at least {MIN_PREFIX_INDEX_PAGES}"),
                ));
            }
            let mut mode: Option<(ModelMode, usize)> = None;
            for (e, engine) in model.engines.iter().enumerate() {
                let at = |field: &str| format!("models[{m}].engines[{e}].{field}");
                if let Err(e) = check_name(&engine.id) {
                    errors.push(ConfigError::at(at("id"), e));
                } else if let Some(first) = engine_ids.insert(&engine.id, at("id")) {
                    errors.push(ConfigError::at(
                        at("id"),
                        format!("duplicate engine id {:?} (also {first})", engine.id),
                    ));
                }
                if let Err(message) = router_upstream::check_engine_url(&engine.url) {
                    errors.push(ConfigError::at(at("url"), message.to_string()));
                }
                match engine.dp_size {
                    Some(0) => errors.push(ConfigError::at(at("dp_size"), "must be at least 1")),
                    Some(n) if n > MAX_DP_SIZE => errors.push(ConfigError::at(
                        at("dp_size"),
                        format_args!("must be at most {MAX_DP_SIZE}"),
                    )),
                    _ => {}
                }
                if let Some(role) = engine.role {
                    let this = ModelMode::of(role.into());
                    match mode {
                        Some((existing, first)) if existing != this => errors.push(ConfigError::at(
                            at("role"),
                            format!(
                                "a {} engine cannot join a model served by {} engines (models[{m}].engines[{first}]); \
                                 a model is either all plain or all prefill/decode",
                                Role::from(role),
                                existing.as_str()
                            ),
                        )),
                        Some(_) => {}
                        None => mode = Some((this, e)),
                    }
                }
            }
            for (role, policy) in [
                ("plain", &model.policies.plain),
                ("prefill", &model.policies.prefill),
                ("decode", &model.policies.decode),
            ] {
                if let Some(Err(e)) = policy.as_ref().map(PolicyConfig::validate) {
                    errors.push(ConfigError::at(
                        at(&format!("policies.{role}")),
                        e.to_string(),
                    ));
                }
            }
        }
        errors
    }
}

mod admin;
mod affinity;
mod decisions;
mod discovery;
mod retries;
mod traces;
mod validated;

pub(crate) use admin::AdminAccess;
pub use admin::AdminConfig;
pub use affinity::{AffinityBackendKind, AffinitySettings, RedisConfig};
pub use discovery::{DiscoveryConfig, KubernetesConfig, KubernetesModel};

pub use decisions::DecisionsConfig;
pub use retries::RetryConfig;
pub use traces::TracesConfig;
pub use validated::ValidatedConfig;
pub(crate) use validated::{
    AffinityHeaders, ClientLimits, ModelPlan, ModelRouting, RestartOnly, SharedState, engine_spec,
    roster,
};

#[cfg(test)]
mod tests;

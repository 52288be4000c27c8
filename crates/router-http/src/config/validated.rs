//! A configuration that passed every check, in the form the running router needs:
//! durations instead of milliseconds, the shared state the policies hold, loaded
//! tokenizers and built buckets. Startup consumes it, so the state and tokenizers
//! are made once and `switchyard config check` cannot disagree with startup. Only
//! the buckets of a model with engines whose role introspection tells are built
//! again at startup, with those roles.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use router_buckets::{
    BucketConfig, BucketResolver, DefaultPolicies, ModelRoster, build_resolver, group_policies,
};
use router_fleet::{EngineSpec, HealthPolicy};
use router_policy::{AffinityBackend, CacheSource, ConfigError, LocalCacheSource, PolicyHandles};
use router_state::affinity::AffinityStore;
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::{EngineId, EngineReportedLoadTable, LoadTableConfig, Role};
use router_upstream::{Upstream, UpstreamTimeouts};

use super::{
    AdminAccess, AdminConfig, AffinitySettings, DecisionsConfig, DiscoveryConfig, EngineConfig,
    HealthConfig, LimitsConfig, LoadConfig, ModelConfig, PrefixIndexerConfig, RetryConfig,
    RouterConfig, TimeoutConfig, TracesConfig,
};
use crate::indexer::RemoteCacheSource;
use crate::tokenize::ChatTokenizer;

/// A checked configuration, ready to start a router from
/// ([`start_validated`](crate::start_validated)).
#[derive(Debug)]
pub struct ValidatedConfig {
    pub(crate) listen: SocketAddr,
    pub(crate) shutdown_grace: Duration,
    pub(crate) upstream: UpstreamTimeouts,
    pub(crate) idle_timeout: Duration,
    pub(crate) client: ClientLimits,
    /// Prompts tokenized at once.
    pub(crate) tokenize_concurrency: usize,
    pub(crate) retries: super::RetryConfig,
    /// Where decision records go, if anywhere.
    pub(crate) decisions: Option<DecisionsConfig>,
    /// Where the router's spans go, when configured.
    pub(crate) traces: Option<TracesConfig>,
    pub(crate) health: HealthPolicy,
    pub(crate) max_feed_message_bytes: usize,
    /// How often a vLLM engine's `/metrics` is read; `None`: never.
    pub(crate) metrics_interval: Option<Duration>,
    pub(crate) load: Arc<EngineReportedLoadTable>,
    /// The bindings the router holds; `None` for rendezvous, which binds nothing.
    pub(crate) affinity: Option<Arc<dyn AffinityStore>>,
    pub(crate) sweep_interval: Duration,
    pub(crate) affinity_headers: AffinityHeaders,
    pub(crate) admin: AdminAccess,
    /// Where the admin API is served instead of the public address, if anywhere.
    pub(crate) admin_listen: Option<SocketAddr>,
    /// The policies of a model that first appears at runtime, and their state.
    pub(crate) defaults: DefaultPolicies,
    pub(crate) handles: PolicyHandles,
    pub(crate) models: Vec<ModelPlan>,
    /// The sections a reload cannot change.
    pub(crate) restart_only: RestartOnly,
    /// Pods discovered as engines.
    #[cfg(feature = "kubernetes")]
    pub(crate) kubernetes: Option<router_fleet::kubernetes::KubernetesSettings>,
}

/// The state a configuration's policies are built around: made anew for a router
/// that starts, the running router's own for a reload, so load reports, bindings
/// and prefix-index entries survive it.
#[derive(Debug, Clone)]
pub(crate) struct SharedState {
    pub(crate) load: Arc<EngineReportedLoadTable>,
    pub(crate) backend: Option<AffinityBackend>,
    pub(crate) affinity: Option<Arc<dyn AffinityStore>>,
    /// Each cache-aware model's prefix index, kept by a model whose index settings
    /// are unchanged.
    pub(crate) prefix_indexes: HashMap<String, Arc<PrefixIndex>>,
    /// The tokenizers loaded, by file: a model naming the same file takes its
    /// tokenizer (and the prefixes it keeps) instead of loading it again.
    pub(crate) tokenizers: HashMap<PathBuf, Arc<ChatTokenizer>>,
}

impl SharedState {
    /// Fresh state for `config`; `None` backend when the affinity section is invalid
    /// (its field check reports why).
    fn new(config: &RouterConfig) -> Self {
        let (backend, affinity) = match config.affinity.backend() {
            Ok((backend, store)) => (Some(backend), store),
            Err(_) => (None, None),
        };
        Self {
            load: Arc::new(EngineReportedLoadTable::new(LoadTableConfig {
                freshness: Duration::from_millis(config.load.freshness_ms),
            })),
            backend,
            affinity,
            prefix_indexes: HashMap::new(),
            tokenizers: HashMap::new(),
        }
    }
}

/// The sections of a configuration a reload cannot change: they shape the
/// listeners, the upstream client, the fleet's probes and feeds, or the state every
/// policy holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RestartOnly {
    listen: SocketAddr,
    timeouts: TimeoutConfig,
    health: HealthConfig,
    load: LoadConfig,
    admin: AdminConfig,
    /// The token in force, so a token file whose token changed is a change.
    admin_access: AdminAccess,
    affinity: AffinitySettings,
    limits: LimitsConfig,
    retries: RetryConfig,
    prefix_indexer: Option<PrefixIndexerConfig>,
    decisions: Option<DecisionsConfig>,
    traces: Option<TracesConfig>,
    discovery: DiscoveryConfig,
    shutdown_grace_ms: u64,
}

impl RestartOnly {
    fn of(config: &RouterConfig, admin_access: AdminAccess) -> Self {
        Self {
            listen: config.listen,
            timeouts: config.timeouts,
            health: config.health,
            load: config.load,
            admin: config.admin.clone(),
            admin_access,
            affinity: config.affinity.clone(),
            limits: config.limits,
            retries: config.retries,
            prefix_indexer: config.prefix_indexer.clone(),
            decisions: config.decisions.clone(),
            traces: config.traces.clone(),
            discovery: config.discovery.clone(),
            shutdown_grace_ms: config.shutdown_grace_ms,
        }
    }

    /// One error for each section `next` changes.
    pub(crate) fn changes(&self, next: &Self) -> Vec<ConfigError> {
        let changed = [
            ("listen", self.listen != next.listen),
            ("timeouts", self.timeouts != next.timeouts),
            ("health", self.health != next.health),
            ("load", self.load != next.load),
            (
                "admin",
                self.admin != next.admin || self.admin_access != next.admin_access,
            ),
            ("affinity", self.affinity != next.affinity),
            ("limits", self.limits != next.limits),
            ("retries", self.retries != next.retries),
            ("prefix_indexer", self.prefix_indexer != next.prefix_indexer),
            ("decisions", self.decisions != next.decisions),
            ("traces", self.traces != next.traces),
            ("discovery", self.discovery != next.discovery),
            (
                "shutdown_grace_ms",
                self.shutdown_grace_ms != next.shutdown_grace_ms,
            ),
        ];
        changed
            .into_iter()
            .filter(|(_, changed)| *changed)
            .map(|(section, _)| {
                ConfigError::at(
                    section,
                    "changed: it takes effect only at a restart (a reload changes models and policies)",
                )
            })
            .collect()
    }
}

/// What a client connection may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientLimits {
    /// To send a request head, from its first byte (a new connection's, from the
    /// accept).
    pub(crate) header: Duration,
    /// Between requests on a kept-alive connection.
    pub(crate) idle: Duration,
    /// To send a whole request body.
    pub(crate) body: Duration,
    /// To accept a byte of an answer.
    pub(crate) write: Duration,
    /// Connections open at once.
    pub(crate) max_connections: usize,
}

/// Where session and routing keys come from, and how long they may be.
#[derive(Debug)]
pub(crate) struct AffinityHeaders {
    pub(crate) session: String,
    pub(crate) routing_key: String,
    pub(crate) max_key_bytes: usize,
}

/// One model, checked: what startup registers and routes.
#[derive(Debug)]
pub(crate) struct ModelPlan {
    pub(crate) id: String,
    /// The tokenizer's file, when the model names one.
    pub(crate) tokenizer_path: Option<PathBuf>,
    pub(crate) tokenizer: Option<Arc<ChatTokenizer>>,
    pub(crate) engines: Vec<EngineSpec>,
    /// Kept by the fleet before the engines join, so their KV events feed it.
    pub(crate) prefix_index: Option<Arc<PrefixIndex>>,
    pub(crate) routing: ModelRouting,
    pub(crate) pd_protocol: super::PdProtocol,
}

/// A model's buckets: built, or to build once introspection has told the roles its
/// configuration leaves out.
#[derive(Debug)]
pub(crate) enum ModelRouting {
    /// Every engine declares its role: the resolver validation built.
    Built(BucketResolver),
    /// Checked with the declared roles; built again with the discovered ones.
    AfterIntrospection {
        buckets: Option<Vec<BucketConfig>>,
        defaults: Box<DefaultPolicies>,
        handles: PolicyHandles,
    },
}

impl ValidatedConfig {
    /// How many models are configured.
    pub fn model_count(&self) -> usize {
        self.models.len()
    }

    /// How many engines are configured.
    pub fn engine_count(&self) -> usize {
        self.models.iter().map(|m| m.engines.len()).sum()
    }
}

impl RouterConfig {
    /// Checks every field, loads the tokenizers and builds what the router runs on
    /// (no engine is contacted). Engines without a configured role are accepted in
    /// any group: their role is read at startup.
    ///
    /// # Errors
    /// Every problem found, each with its path.
    pub fn validate(self) -> Result<ValidatedConfig, Vec<ConfigError>> {
        let shared = SharedState::new(&self);
        self.validate_with(shared)
    }

    /// [`validate`](Self::validate) around `shared` instead of fresh state.
    pub(crate) fn validate_with(
        self,
        shared: SharedState,
    ) -> Result<ValidatedConfig, Vec<ConfigError>> {
        let mut errors = self.check_fields();
        let admin = self.admin.access(&mut errors);
        let restart_only = RestartOnly::of(&self, admin.clone());
        let SharedState {
            load,
            backend,
            affinity,
            prefix_indexes,
            tokenizers,
        } = shared;
        let handles = PolicyHandles::new(Arc::clone(&load)).with_affinity(backend);
        let defaults = self.policies.over(&DefaultPolicies::default());
        let mut models = Vec::with_capacity(self.models.len());
        for (m, model) in self.models.iter().enumerate() {
            let kept = Kept {
                index: prefix_indexes.get(&model.id).cloned(),
                tokenizers: &tokenizers,
                indexer: self.prefix_indexer.as_ref(),
            };
            match plan_model(
                model,
                &handles,
                &defaults,
                self.limits.tokenize_cache_bytes,
                kept,
            ) {
                Ok(plan) => models.push(plan),
                Err(problems) => {
                    let at = format!("models[{m}]");
                    errors.extend(problems.into_iter().map(|e| e.within(&at)));
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let affinity_settings = self.affinity;
        Ok(ValidatedConfig {
            listen: self.listen,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            upstream: UpstreamTimeouts {
                connect: Duration::from_millis(self.timeouts.connect_ms),
                first_byte: Duration::from_millis(self.timeouts.first_byte_ms),
                pool_idle: Duration::from_millis(self.timeouts.pool_idle_ms),
            },
            idle_timeout: Duration::from_millis(self.timeouts.idle_ms),
            retries: self.retries,
            decisions: self.decisions.clone(),
            traces: self.traces.clone(),
            tokenize_concurrency: self.limits.tokenize_concurrency.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            }),
            client: ClientLimits {
                header: Duration::from_millis(self.timeouts.client_header_ms),
                idle: Duration::from_millis(self.timeouts.client_idle_ms),
                body: Duration::from_millis(self.timeouts.client_body_ms),
                write: Duration::from_millis(self.timeouts.client_write_ms),
                max_connections: self.limits.max_connections,
            },
            health: health_policy(&self.health),
            max_feed_message_bytes: self.limits.zmq_max_message_bytes,
            metrics_interval: (self.load.metrics_interval_ms > 0)
                .then(|| Duration::from_millis(self.load.metrics_interval_ms)),
            load,
            affinity,
            sweep_interval: Duration::from_millis(affinity_settings.sweep_interval_ms),
            affinity_headers: AffinityHeaders {
                session: affinity_settings.session_header,
                routing_key: affinity_settings.routing_key_header,
                max_key_bytes: affinity_settings.max_key_bytes,
            },
            admin,
            admin_listen: self.admin.listen,
            defaults,
            handles,
            models,
            restart_only,
            #[cfg(feature = "kubernetes")]
            kubernetes: self.discovery.kubernetes(),
        })
    }
}

/// What a reload keeps of the running router for a model, and the shared indexer.
struct Kept<'a> {
    /// The model's prefix index.
    index: Option<Arc<PrefixIndex>>,
    /// The tokenizers loaded, by file.
    tokenizers: &'a HashMap<PathBuf, Arc<ChatTokenizer>>,
    /// The prefix indexer asked instead of a local index, if any.
    indexer: Option<&'a PrefixIndexerConfig>,
}

/// Loads the model's tokenizer (keeping up to `prefix_cache_bytes` of its prompts'
/// prefixes; the one `kept` for its file, if any), gives it a prefix index when a
/// cache-aware group reads one (the one `kept`, when its settings are the same), and
/// builds (or checks) its buckets. Paths are within the model.
fn plan_model(
    model: &ModelConfig,
    handles: &PolicyHandles,
    defaults: &DefaultPolicies,
    prefix_cache_bytes: usize,
    kept: Kept<'_>,
) -> Result<ModelPlan, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let tokenizer = match &model.tokenizer {
        Some(path) if kept.tokenizers.contains_key(path) => kept.tokenizers.get(path).cloned(),
        Some(path) => match ChatTokenizer::load(path) {
            Ok(t) => Some(Arc::new(t.with_prefix_cache(prefix_cache_bytes))),
            Err(e) => {
                errors.push(ConfigError::at("tokenizer", e));
                None
            }
        },
        None => None,
    };
    let defaults = model.policies.over(defaults);
    let cache_aware = group_policies(model.buckets.as_deref(), &defaults)
        .iter()
        .any(|(_, policy)| policy.needs_prefix_source());
    // Without a tokenizer there are no token ids to hash: the cache-aware policy's
    // construction says what is missing.
    let index_config = IndexConfig {
        block_size: model.block_size,
        max_nodes: model.prefix_index_pages,
    };
    let indexed = cache_aware && model.tokenizer.is_some();
    let prefix_index = (indexed && kept.indexer.is_none()).then(|| {
        kept.index
            .filter(|index| index.config() == index_config)
            .unwrap_or_else(|| Arc::new(PrefixIndex::new(index_config)))
    });
    let source: Option<Arc<dyn CacheSource>> = match (&prefix_index, kept.indexer) {
        (Some(index), _) => Some(Arc::new(LocalCacheSource::new(Arc::clone(index)))),
        (None, Some(indexer)) if indexed => {
            // Field validation named a URL that is no base URL.
            router_upstream::authority(&indexer.url).map(|authority| {
                let timeout = Duration::from_millis(indexer.timeout_ms);
                let upstream = Upstream::new(UpstreamTimeouts {
                    connect: timeout,
                    first_byte: timeout,
                    pool_idle: Duration::from_secs(4),
                });
                Arc::new(RemoteCacheSource::new(
                    &model.id,
                    model.block_size,
                    authority,
                    upstream,
                    timeout,
                )) as Arc<dyn CacheSource>
            })
        }
        _ => None,
    };
    let handles = handles.clone().with_prefix_source(source);
    let engines: Vec<EngineSpec> = model
        .engines
        .iter()
        .map(|e| engine_spec(e, &model.id))
        .collect();
    let roster = roster(&engines, |_| None);
    let resolver = build_resolver(model.buckets.as_deref(), &roster, &defaults, &handles);
    let routing = match resolver {
        Err(e) => {
            errors.push(e);
            return Err(errors);
        }
        Ok(resolver) if engines.iter().all(|e| e.role.is_some()) => ModelRouting::Built(resolver),
        Ok(_) => ModelRouting::AfterIntrospection {
            buckets: model.buckets.clone(),
            defaults: Box::new(defaults),
            handles,
        },
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(ModelPlan {
        id: model.id.clone(),
        tokenizer_path: model.tokenizer.clone(),
        tokenizer,
        engines,
        prefix_index,
        routing,
        pd_protocol: model.pd_protocol,
    })
}

/// The roster of a model's engines: declared roles, else `discovered(id)`, else not
/// known yet.
pub(crate) fn roster(
    engines: &[EngineSpec],
    discovered: impl Fn(&EngineId) -> Option<Role>,
) -> ModelRoster {
    let (known, unknown): (Vec<_>, Vec<_>) = engines
        .iter()
        .map(|e| (e.id.clone(), e.role.or_else(|| discovered(&e.id))))
        .partition(|(_, role)| role.is_some());
    ModelRoster::new(known.into_iter().filter_map(|(id, role)| Some((id, role?))))
        .with_unknown_roles(unknown.into_iter().map(|(id, _)| id))
}

/// An engine of `model` as the fleet takes it.
pub(crate) fn engine_spec(config: &EngineConfig, model: &str) -> EngineSpec {
    let mut spec = EngineSpec::new(config.id.as_str(), config.url.as_str(), model)
        .with_role(config.role.map(Into::into));
    spec.bootstrap_port = config.bootstrap_port;
    spec.dp_size = config.dp_size;
    spec.load_port = config.load_port;
    spec.kv_port = config.kv_port;
    spec.kv_replay_port = config.kv_replay_port;
    spec
}

fn health_policy(health: &HealthConfig) -> HealthPolicy {
    HealthPolicy {
        interval: Duration::from_millis(health.interval_ms),
        probe_timeout: Duration::from_millis(health.timeout_ms),
        failure_threshold: health.failure_threshold,
        success_threshold: health.success_threshold,
        breaker_failures: health.breaker_failures,
        breaker_cooldown: Duration::from_millis(health.breaker_cooldown_ms),
    }
}

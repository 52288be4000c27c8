//! A configuration that passed every check, in the form the running router needs:
//! durations instead of milliseconds, the admin token's digest, loaded tokenizers
//! and the selection [`SelectionPlan::build`] made of it. Startup consumes it, so the
//! state and tokenizers are made once and `switchyard config check` cannot disagree
//! with startup. Only the buckets of a model with engines whose role introspection
//! tells are built again at startup, with those roles.

mod engine_tls;
mod restart_only;
mod serving;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use router_buckets::DefaultPolicies;
use router_config::{
    DecisionsConfig, EngineConfig, FlowConfig, HealthConfig, ModelConfig, ModelSelection,
    PdProtocol, RetryConfig, RouterConfig, RoutingHeaders, SelectionPlan, TracesConfig,
};
use router_fleet::{EngineSpec, HealthPolicy};
use router_policy::{ConfigError, PolicyHandles};
use router_state::EngineReportedLoadTable;
use router_state::affinity::AffinityStore;
use router_tokenize::ChatTokenizer;
use router_upstream::{EngineTls, Upstream, UpstreamTimeouts};

use crate::access::AdminAccess;
use crate::metrics::IndexerMetrics;
pub(crate) use restart_only::RestartOnly;
use serving::Serving;
pub(crate) use serving::{ModelTokenizer, SharedState};

/// A checked configuration, ready to start a router from
/// ([`start_validated`](crate::start_validated)).
#[derive(Debug)]
pub struct ValidatedConfig {
    pub(crate) listen: SocketAddr,
    pub(crate) shutdown_grace: Duration,
    pub(crate) upstream: UpstreamTimeouts,
    /// How engines at `https://` URLs are reached.
    pub(crate) engine_tls: EngineTls,
    pub(crate) idle_timeout: Duration,
    pub(crate) client: ClientLimits,
    /// Prompts tokenized at once.
    pub(crate) tokenize_concurrency: usize,
    /// Bytes request bodies may take at once (`limits.body_memory_bytes`).
    pub(crate) body_memory_bytes: usize,
    pub(crate) retries: RetryConfig,
    /// Where decision records go, if anywhere.
    pub(crate) decisions: Option<DecisionsConfig>,
    /// Where the router's spans go, when configured.
    pub(crate) traces: Option<TracesConfig>,
    /// What answers tell clients of their routing.
    pub(crate) routing_headers: RoutingHeaders,
    pub(crate) health: HealthPolicy,
    pub(crate) max_feed_message_bytes: usize,
    /// What all engine feeds may hold together (`limits.zmq_memory_bytes`).
    pub(crate) feed_memory_bytes: usize,
    /// How often a vLLM engine's `/metrics` is read; `None`: never.
    pub(crate) metrics_interval: Option<Duration>,
    pub(crate) load: Arc<EngineReportedLoadTable>,
    /// The bindings the router holds; `None` for rendezvous, which binds nothing.
    pub(crate) affinity: Option<Arc<dyn AffinityStore>>,
    /// What the links to the shared prefix indexers count in.
    pub(crate) indexer_metrics: IndexerMetrics,
    pub(crate) sweep_interval: Duration,
    pub(crate) affinity_headers: AffinityHeaders,
    pub(crate) admin: AdminAccess,
    /// Where the admin API is served instead of the public address, if anywhere.
    pub(crate) admin_listen: Option<SocketAddr>,
    /// The endpoint picker's address, stream bound and token, when it is served.
    #[cfg(feature = "picker")]
    pub(crate) picker: Option<crate::api::picker::PickerSettings>,
    /// The policies of a model that first appears at runtime, and their state.
    pub(crate) defaults: DefaultPolicies,
    pub(crate) handles: PolicyHandles,
    pub(crate) models: Vec<ModelPlan>,
    /// The sections a reload cannot change.
    pub(crate) restart_only: RestartOnly,
    /// Pods discovered as engines.
    #[cfg(feature = "kubernetes")]
    pub(crate) kubernetes: Option<router_fleet::kubernetes::KubernetesSettings>,
    /// The pools' InferenceObjectives give priorities (`discovery.kubernetes.objectives`).
    #[cfg(feature = "kubernetes")]
    pub(crate) objectives_from_cluster: bool,
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
    /// Each socket's send buffer (`SO_SNDBUF`); `None`: the kernel's sizing.
    pub(crate) send_buffer: Option<usize>,
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
    /// Its buckets, tokenizer and prefix index.
    pub(crate) selection: ModelSelection<Arc<ChatTokenizer>>,
    /// The tokenizer's file, when the model names one.
    pub(crate) tokenizer_path: Option<PathBuf>,
    pub(crate) engines: Vec<EngineSpec>,
    pub(crate) pd_protocol: PdProtocol,
    /// Its flow control (`flow`).
    pub(crate) flow: FlowConfig,
    /// Its page size, in tokens (`block_size`).
    pub(crate) block_size: u32,
}

impl ModelPlan {
    fn new(config: &ModelConfig, selection: ModelSelection<Arc<ChatTokenizer>>) -> Self {
        Self {
            selection,
            tokenizer_path: config.tokenizer.clone(),
            engines: config
                .engines
                .iter()
                .map(|e| engine_spec(e, &config.id))
                .collect(),
            pd_protocol: config.pd_protocol,
            flow: config.flow.clone(),
            block_size: config.block_size,
        }
    }
}

impl ValidatedConfig {
    /// Checks every field of `config`, reads the admin and picker tokens (and the
    /// picker's TLS files) and the tokenizers, and builds what the router runs on
    /// (no engine is contacted). Engines without a
    /// configured role are accepted in any group: their role is read at startup.
    ///
    /// # Errors
    /// Every problem found, each with its path.
    pub fn validate(config: RouterConfig) -> Result<Self, Vec<ConfigError>> {
        let shared = SharedState::new(&config);
        Self::around(config, shared)
    }

    /// [`validate`](Self::validate) around `shared` instead of fresh state.
    pub(crate) fn around(
        config: RouterConfig,
        shared: SharedState,
    ) -> Result<Self, Vec<ConfigError>> {
        let mut errors = config.check_fields();
        if cfg!(not(feature = "picker")) && config.picker.is_some() {
            errors.push(ConfigError::at(
                "picker",
                "this build has no endpoint picker (router-http's feature `picker`, which the released binary enables)",
            ));
        }
        let admin = AdminAccess::of(&config.admin, &mut errors);
        #[cfg(feature = "picker")]
        let picker = config
            .picker
            .as_ref()
            .map(|picker| crate::api::picker::PickerSettings::of(picker, &mut errors));
        let engine_tls = engine_tls::load(config.engine_tls.as_ref(), &mut errors);
        let restart_only = RestartOnly::of(&config);
        let SharedState {
            selection: state,
            affinity,
            tokenizers,
            indexer_metrics,
        } = shared;
        let mut serving = Serving::new(
            tokenizers,
            config.limits.tokenize_cache_bytes,
            engine_tls.clone(),
            indexer_metrics.clone(),
        )
        .with_indexer_token(&config, &mut errors);
        let (plan, engine_tls) = match (
            SelectionPlan::build(&config, &state, &mut serving),
            engine_tls,
        ) {
            (Ok(plan), Some(engine_tls)) if errors.is_empty() => (plan, engine_tls),
            (Ok(_), _) => return Err(errors),
            (Err(problems), _) => {
                errors.extend(problems);
                return Err(errors);
            }
        };
        let models = config
            .models
            .iter()
            .zip(plan.models)
            .map(|(model, selection)| ModelPlan::new(model, selection))
            .collect();
        let affinity_settings = &config.affinity;
        Ok(Self {
            listen: config.listen,
            shutdown_grace: Duration::from_millis(config.shutdown_grace_ms),
            upstream: UpstreamTimeouts {
                connect: Duration::from_millis(config.timeouts.connect_ms),
                first_byte: Duration::from_millis(config.timeouts.first_byte_ms),
                pool_idle: Duration::from_millis(config.timeouts.pool_idle_ms),
            },
            engine_tls,
            idle_timeout: Duration::from_millis(config.timeouts.idle_ms),
            client: client_limits(&config),
            tokenize_concurrency: config.limits.tokenize_concurrency.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            }),
            body_memory_bytes: config.limits.body_memory_bytes,
            retries: config.retries,
            decisions: config.decisions.clone(),
            traces: config.traces.clone(),
            routing_headers: config.routing_headers,
            health: health_policy(&config.health),
            max_feed_message_bytes: config.limits.zmq_max_message_bytes,
            feed_memory_bytes: config.limits.feed_memory_bytes(),
            metrics_interval: (config.load.metrics_interval_ms > 0)
                .then(|| Duration::from_millis(config.load.metrics_interval_ms)),
            load: state.load,
            affinity,
            indexer_metrics,
            sweep_interval: Duration::from_millis(affinity_settings.sweep_interval_ms),
            affinity_headers: AffinityHeaders {
                session: affinity_settings.session_header.clone(),
                routing_key: affinity_settings.routing_key_header.clone(),
                max_key_bytes: affinity_settings.max_key_bytes,
            },
            admin,
            admin_listen: config.admin.listen,
            #[cfg(feature = "picker")]
            picker,
            defaults: plan.defaults,
            handles: plan.handles,
            models,
            restart_only,
            #[cfg(feature = "kubernetes")]
            kubernetes: serving::kubernetes(&config.discovery),
            #[cfg(feature = "kubernetes")]
            objectives_from_cluster: config
                .discovery
                .kubernetes
                .as_ref()
                .is_some_and(|k| k.objectives),
        })
    }

    /// The client to engines: the configured timeouts, and TLS for `https://`
    /// engines.
    pub(crate) fn upstream(&self) -> Upstream {
        Upstream::new(self.upstream).with_tls(self.engine_tls.clone())
    }

    /// How many models are configured.
    pub fn model_count(&self) -> usize {
        self.models.len()
    }

    /// How many engines are configured.
    pub fn engine_count(&self) -> usize {
        self.models.iter().map(|m| m.engines.len()).sum()
    }
}

/// What a client connection may take.
fn client_limits(config: &RouterConfig) -> ClientLimits {
    ClientLimits {
        header: Duration::from_millis(config.timeouts.client_header_ms),
        idle: Duration::from_millis(config.timeouts.client_idle_ms),
        body: Duration::from_millis(config.timeouts.client_body_ms),
        write: Duration::from_millis(config.timeouts.client_write_ms),
        send_buffer: Some(config.limits.client_send_buffer_bytes).filter(|&bytes| bytes > 0),
        max_connections: config.limits.max_connections,
    }
}

fn health_policy(health: &HealthConfig) -> HealthPolicy {
    HealthPolicy {
        interval: Duration::from_millis(health.interval_ms),
        probe_timeout: Duration::from_millis(health.timeout_ms),
        failure_threshold: health.failure_threshold,
        success_threshold: health.success_threshold,
        breaker_failures: health.breaker_failures,
        breaker_cooldown: Duration::from_millis(health.breaker_cooldown_ms),
        max_ejected_percent: health.max_ejected_percent,
    }
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

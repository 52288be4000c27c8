//! Application context: the fleet, the routing tables and the shared services of the
//! request path, built once at startup.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use router_buckets::{DefaultPolicies, build_resolver, group_policies};
use router_fleet::{Change, EngineSpec, Fleet, FleetEvent, HealthPolicy};
use router_policy::{CacheSource, LocalCacheSource, PolicyHandles};
use router_state::affinity::{AffinityStore, SweeperHandle};
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::{EngineReportedLoadTable, LoadTableConfig};
use router_upstream::{Upstream, UpstreamTimeouts};

use crate::config::{
    AffinitySettings, ConfigError, EngineConfig, HealthConfig, ModelConfig, RouterConfig, roster_of,
};
use crate::metrics::Metrics;
use crate::routing::{ModelRoute, Routing};
use crate::tokenize::ChatTokenizer;

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration has problems; each names its path.
    #[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Config(Vec<ConfigError>),
    /// The listener could not be bound.
    #[error("binding {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// Where session and routing keys come from, and how long they may be.
#[derive(Debug)]
pub(crate) struct AffinityHeaders {
    pub(crate) session: String,
    pub(crate) routing_key: String,
    pub(crate) max_key_bytes: usize,
}

/// The shared services of a running router.
#[derive(Debug)]
pub struct AppContext {
    pub(crate) fleet: Arc<Fleet>,
    pub(crate) routing: Arc<Routing>,
    pub(crate) upstream: Upstream,
    pub(crate) metrics: Metrics,
    /// Session and routing-key bindings.
    pub(crate) affinity: Arc<AffinityStore>,
    _sweeper: SweeperHandle,
    pub(crate) affinity_headers: AffinityHeaders,
    pub(crate) admin_token: Option<String>,
    pub(crate) idle_timeout: Duration,
    rng: Mutex<Xoshiro256PlusPlus>,
}

impl AppContext {
    /// Validates `config`, loads tokenizers, introspects and registers every engine,
    /// starts their feeds and builds every model's buckets.
    ///
    /// # Errors
    /// Every configuration problem found, each with its path.
    pub async fn new(config: RouterConfig) -> Result<Arc<Self>, StartError> {
        let errors = config.validate();
        if !errors.is_empty() {
            return Err(StartError::Config(errors));
        }
        let load = Arc::new(EngineReportedLoadTable::new(LoadTableConfig {
            freshness: Duration::from_millis(config.load.freshness_ms),
        }));
        let affinity = Arc::new(AffinityStore::new(config.affinity.store_config()));
        let sweeper =
            affinity.spawn_sweeper(Duration::from_millis(config.affinity.sweep_interval_ms));
        let handles =
            PolicyHandles::new(Arc::clone(&load)).with_affinity_store(Some(Arc::clone(&affinity)));
        let defaults = config.policies.over(&DefaultPolicies::default());
        let upstream = Upstream::new(UpstreamTimeouts {
            connect: Duration::from_millis(config.timeouts.connect_ms),
            first_byte: Duration::from_millis(config.timeouts.first_byte_ms),
        });
        let fleet = Arc::new(Fleet::new(
            upstream.clone(),
            load,
            health_policy(&config.health),
        ));
        let mut errors = Vec::new();
        let mut routes = HashMap::new();
        for (m, model) in config.models.iter().enumerate() {
            match build_model(&fleet, &handles, &defaults, model).await {
                Ok(route) => drop(routes.insert(model.id.clone(), Arc::new(route))),
                Err(problems) => errors.extend(problems.into_iter().map(|e| ConfigError {
                    path: format!("models[{m}].{}", e.path),
                    message: e.message,
                })),
            }
        }
        if !errors.is_empty() {
            return Err(StartError::Config(errors));
        }
        let routing = Arc::new(Routing::new(routes, defaults, handles));
        observe_fleet(&fleet, &routing, &affinity);
        let AffinitySettings {
            session_header,
            routing_key_header,
            max_key_bytes,
            ..
        } = config.affinity;
        let metrics = Metrics::new(&fleet, &affinity);
        Ok(Arc::new(Self {
            fleet,
            metrics,
            routing,
            upstream,
            affinity,
            _sweeper: sweeper,
            affinity_headers: AffinityHeaders {
                session: session_header,
                routing_key: routing_key_header,
                max_key_bytes,
            },
            admin_token: config.admin.token,
            idle_timeout: Duration::from_millis(config.timeouts.idle_ms),
            rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(seed())),
        }))
    }

    /// The engines and what is known of them.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// The session and routing-key bindings.
    pub fn affinity(&self) -> &Arc<AffinityStore> {
        &self.affinity
    }

    /// A fresh bootstrap room in `[0, 2^63)`.
    pub(crate) fn next_room(&self) -> u64 {
        self.rng.lock().next_u64() >> 1
    }

    /// A fresh request id.
    pub(crate) fn next_request_id(&self) -> String {
        format!("{:016x}", self.rng.lock().next_u64())
    }
}

/// Keeps the routing tables and the bindings in step with the fleet: a model that
/// first appears at runtime gets a catch-all bucket; a removed engine's bindings go.
fn observe_fleet(fleet: &Fleet, routing: &Arc<Routing>, affinity: &Arc<AffinityStore>) {
    let (routing, affinity) = (Arc::clone(routing), Arc::clone(affinity));
    fleet.on_change(move |event| match event {
        FleetEvent::Added(engine) => {
            if let Err(e) = routing.serve_new_model(engine) {
                tracing::warn!(model = engine.model(), error = %e, "the new model cannot be routed");
            }
        }
        FleetEvent::Removed(engine) => drop(affinity.remove_engine(engine.id())),
        _ => {}
    });
}

/// Loads the model's tokenizer, registers its engines (introspecting them
/// concurrently) and builds its buckets. Errors carry paths within the model.
async fn build_model(
    fleet: &Fleet,
    handles: &PolicyHandles,
    defaults: &DefaultPolicies,
    model: &ModelConfig,
) -> Result<ModelRoute, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let tokenizer = match &model.tokenizer {
        Some(path) => match ChatTokenizer::load(path) {
            Ok(t) => Some(Arc::new(t)),
            Err(e) => {
                errors.push(ConfigError::at("tokenizer", e));
                None
            }
        },
        None => None,
    };
    let model_defaults = model.policies.over(defaults);
    let handles = model_handles(fleet, handles, model, tokenizer.is_some(), &model_defaults);
    let applied = futures_util::future::join_all(
        model
            .engines
            .iter()
            .map(|e| fleet.apply(Change::Upsert(engine_spec(e, &model.id)))),
    )
    .await;
    let mut discovered = HashMap::new();
    for (e, (engine, applied)) in model.engines.iter().zip(applied).enumerate() {
        match applied {
            Ok(registered) => drop(discovered.insert(engine.id.clone(), registered.role())),
            Err(error) => errors.push(ConfigError::at(format!("engines[{e}]"), error.to_string())),
        }
    }
    let roster = roster_of(model, |id| discovered.get(id).copied());
    let resolver = build_resolver(model.buckets.as_deref(), &roster, &model_defaults, &handles)
        .map_err(|e| ConfigError::at(e.path, e.message));
    match resolver {
        Ok(resolver) if errors.is_empty() => Ok(ModelRoute {
            id: Arc::from(model.id.as_str()),
            resolver,
            tokenizer,
        }),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.push(e);
            Err(errors)
        }
    }
}

/// The policy handles of `model`: with a prefix index (kept by the fleet before the
/// model's engines join, so their KV events feed it) when one of its groups runs a
/// cache-aware policy and the model has a tokenizer to produce token ids. Without a
/// tokenizer the policy's construction reports what is missing.
fn model_handles(
    fleet: &Fleet,
    handles: &PolicyHandles,
    model: &ModelConfig,
    tokenized: bool,
    defaults: &DefaultPolicies,
) -> PolicyHandles {
    let cache_aware = group_policies(model.buckets.as_deref(), defaults)
        .iter()
        .any(|(_, policy)| policy.needs_prefix_source());
    if !(cache_aware && tokenized) {
        return handles.clone();
    }
    let index = Arc::new(PrefixIndex::new(IndexConfig {
        block_size: model.block_size,
        max_nodes: model.prefix_index_pages,
    }));
    fleet.keep_prefix_index(&model.id, Arc::clone(&index));
    let source: Arc<dyn CacheSource> = Arc::new(LocalCacheSource::new(index));
    handles.clone().with_prefix_source(Some(source))
}

/// An engine of `model` as the fleet takes it.
pub(crate) fn engine_spec(config: &EngineConfig, model: &str) -> EngineSpec {
    EngineSpec::new(config.id.as_str(), config.url.as_str(), model)
        .with_role(config.role.map(Into::into))
        .with_ports(
            config.bootstrap_port,
            config.dp_size,
            config.load_port,
            config.kv_port,
            config.kv_replay_port,
        )
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

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher, RandomState};
    RandomState::new().build_hasher().finish()
}

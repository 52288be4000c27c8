//! Application context: the fleet, the routing tables and the shared services of the
//! request path, started once from a validated configuration.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use router_config::RoutingHeaders;
use router_fleet::{Change, EngineSpec, Fleet, FleetEvent};
use router_policy::ConfigError;
use router_state::affinity::{AffinityStore, SweeperHandle, spawn_sweeper};
use router_state::{EngineId, Role};
use router_tokenize::{ChatTokenizer, TokenizePool};
use router_upstream::Upstream;

use crate::access::AdminAccess;
use crate::budget::BodyBudget;
use crate::decisions::DecisionLog;
use crate::flow::{ClusterObjectives, ModelFlow};
use crate::metrics::Metrics;
use crate::retries::RetryBudget;
use crate::routing::{ModelRoute, Routing};
use crate::spans::Spans;
use crate::validated::{AffinityHeaders, ModelPlan, ModelTokenizer, RestartOnly, ValidatedConfig};

/// Why the router could not start. Each message holds the error it carries, which is
/// no `source` too (a chain of sources would print it twice).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration has problems; each names its path.
    #[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Config(Vec<ConfigError>),
    /// The listener could not be bound.
    #[error("binding {addr}: {problem}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        problem: std::io::Error,
    },
    /// The span exporter could not be built.
    #[error("starting the span exporter for traces.otlp_endpoint: {0}")]
    Traces(String),
    /// The decision records' file could not be opened.
    #[error("opening the decision records' file {path}: {problem}")]
    Decisions {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        problem: std::io::Error,
    },
}

/// The shared services of a running router.
#[derive(Debug)]
pub struct AppContext {
    pub(crate) fleet: Arc<Fleet>,
    pub(crate) routing: Arc<Routing>,
    pub(crate) upstream: Upstream,
    pub(crate) metrics: Arc<Metrics>,
    /// Session and routing-key bindings; `None` for rendezvous, which binds nothing.
    pub(crate) affinity: Option<Arc<dyn AffinityStore>>,
    _sweeper: Option<SweeperHandle>,
    pub(crate) affinity_headers: AffinityHeaders,
    /// Who may use the admin API; a reload replaces it.
    pub(crate) admin: ArcSwap<AdminAccess>,
    pub(crate) idle_timeout: Duration,
    /// How long a client may take to send a whole request body.
    pub(crate) client_body_timeout: Duration,
    /// The memory request bodies may take at once.
    pub(crate) body_budget: BodyBudget,
    /// Prompts tokenized at once, on the blocking pool.
    pub(crate) tokenizing: TokenizePool,
    /// The router-wide retry budget.
    pub(crate) retries: RetryBudget,
    /// Where sampled decisions are recorded, when configured.
    pub(crate) decisions: Option<Arc<DecisionLog>>,
    /// Where the router's spans go, when configured.
    pub(crate) spans: Option<Arc<Spans>>,
    /// What answers tell clients of their routing.
    pub(crate) routing_headers: RoutingHeaders,
    /// The priorities the cluster's InferenceObjectives give, for the models whose
    /// objectives discovery reads (`discovery.kubernetes.objectives`).
    pub(crate) objectives: ClusterObjectives,
    /// What the configuration file brought; a reload holds it while it runs.
    pub(crate) configured: tokio::sync::Mutex<Configured>,
    rng: Mutex<Xoshiro256PlusPlus>,
}

/// What the configuration file brought, as opposed to engines and models the
/// admin API added: a reload replaces only these.
#[derive(Debug)]
pub(crate) struct Configured {
    pub(crate) restart_only: RestartOnly,
    pub(crate) engines: HashMap<EngineId, EngineSpec>,
    pub(crate) models: HashSet<String>,
    /// The models' tokenizers, by model and file.
    pub(crate) tokenizers: HashMap<ModelTokenizer, Arc<ChatTokenizer>>,
}

impl Configured {
    pub(crate) fn of(config: &ValidatedConfig) -> Self {
        Self {
            restart_only: config.restart_only.clone(),
            engines: config
                .models
                .iter()
                .flat_map(|m| m.engines.iter().map(|e| (e.id.clone(), e.clone())))
                .collect(),
            models: config
                .models
                .iter()
                .map(|m| m.selection.id.clone())
                .collect(),
            tokenizers: config
                .models
                .iter()
                .filter_map(|m| {
                    let key = (m.selection.id.clone(), m.tokenizer_path.clone()?);
                    Some((key, Arc::clone(m.selection.tokenizer.as_ref()?)))
                })
                .collect(),
        }
    }
}

impl AppContext {
    /// Registers every engine of `config` (introspecting them), starts their feeds,
    /// and builds the buckets that waited for the engines' roles.
    ///
    /// # Errors
    /// Engines that could not join, and buckets their discovered roles do not fit,
    /// each with its path.
    pub async fn new(config: ValidatedConfig) -> Result<Arc<Self>, StartError> {
        let configured = Configured::of(&config);
        let upstream = config.upstream();
        let fleet = Arc::new(
            Fleet::new(upstream.clone(), config.load, config.health)
                .with_max_feed_message_bytes(config.max_feed_message_bytes)
                .with_feed_memory_bytes(config.feed_memory_bytes)
                .with_metrics_interval(config.metrics_interval),
        );
        let mut errors = Vec::new();
        let mut routes = HashMap::new();
        for (m, model) in config.models.into_iter().enumerate() {
            let id = model.selection.id.clone();
            let discovered = register(&fleet, &model).await;
            match route(model, &discovered, None) {
                Ok(route) => drop(routes.insert(id, Arc::new(route))),
                Err(problems) => {
                    let at = format!("models[{m}]");
                    errors.extend(problems.into_iter().map(|e| e.within(&at)));
                }
            }
        }
        if !errors.is_empty() {
            return Err(StartError::Config(errors));
        }
        let routing = Arc::new(Routing::new(routes, config.defaults, config.handles));
        fleet.set_breaker_groups(routing.listed_groups());
        let rooms = routing.rooms().clone();
        fleet
            .load()
            .on_capacity(Some(Box::new(move || rooms.capacity_freed())));
        let affinity = config.affinity;
        if let Some(store) = &affinity
            && !store.connect().await
        {
            tracing::warn!(
                "the affinity store's backend did not answer at startup: bindings are local until it does"
            );
        }
        let metrics = Arc::new(Metrics::new(
            &fleet,
            affinity.clone(),
            &routing,
            config.indexer_metrics.clone(),
        ));
        observe_fleet(&fleet, &routing, affinity.clone(), &metrics);
        let decisions = match &config.decisions {
            Some(decisions) => Some(Arc::new(
                DecisionLog::open(decisions, metrics.decision_records.clone()).map_err(
                    |problem| StartError::Decisions {
                        path: decisions.path.clone(),
                        problem,
                    },
                )?,
            )),
            None => None,
        };
        let spans = match config.traces.clone() {
            // The exporter's HTTP client blocks: it is built off the runtime's threads.
            Some(traces) => Some(Arc::new(
                tokio::task::spawn_blocking({
                    let counts = metrics.spans.clone();
                    move || Spans::start(&traces, counts)
                })
                .await
                .map_err(|e| StartError::Traces(e.to_string()))?
                .map_err(StartError::Traces)?,
            )),
            None => None,
        };
        Ok(Arc::new(Self {
            fleet,
            routing,
            upstream,
            metrics,
            _sweeper: affinity
                .clone()
                .map(|store| spawn_sweeper(store, config.sweep_interval)),
            affinity,
            affinity_headers: config.affinity_headers,
            admin: ArcSwap::from_pointee(config.admin),
            idle_timeout: config.idle_timeout,
            client_body_timeout: config.client.body,
            body_budget: BodyBudget::new(config.body_memory_bytes),
            tokenizing: TokenizePool::new(config.tokenize_concurrency),
            retries: RetryBudget::new(&config.retries),
            decisions,
            spans,
            routing_headers: config.routing_headers,
            objectives: ClusterObjectives::default(),
            configured: tokio::sync::Mutex::new(configured),
            rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(seed())),
        }))
    }

    /// The engines and what is known of them.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// The session and routing-key bindings; `None` for rendezvous, which binds
    /// nothing.
    pub fn affinity(&self) -> Option<&Arc<dyn AffinityStore>> {
        self.affinity.as_ref()
    }

    /// The requests waiting in `model`'s queue, by priority band (the most urgent
    /// first); `None` for a model without a queue.
    pub fn queue_depth(&self, model: &str) -> Option<Vec<usize>> {
        Some(self.routing.get(model)?.flow.as_ref()?.room()?.depth())
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

/// Keeps the routing tables, the bindings and the metrics in step with the fleet: a
/// model that first appears at runtime gets a catch-all bucket; a removed engine's
/// bindings, pick series and regret series go.
fn observe_fleet(
    fleet: &Fleet,
    routing: &Arc<Routing>,
    affinity: Option<Arc<dyn AffinityStore>>,
    metrics: &Metrics,
) {
    let routing = Arc::clone(routing);
    let (picks, regret) = (metrics.picks.clone(), metrics.regret.clone());
    fleet.on_change(move |event| match event {
        FleetEvent::Added(engine) => {
            if let Err(e) = routing.serve_new_model(engine) {
                tracing::warn!(model = engine.model(), error = %e, "the new model cannot be routed");
            }
        }
        FleetEvent::Removed(engine) => {
            if let Some(store) = &affinity {
                store.remove_engine(engine.id());
            }
            picks.forget(engine.id().as_str());
            regret.forget(engine.id().as_str());
        }
        _ => {}
    });
}

/// What registering a model's engines found: each engine's role, or why it could
/// not join (with its path within the model).
pub(crate) type Registered = Vec<Result<Role, ConfigError>>;

/// Keeps the model's prefix index (before its engines join, so their KV events feed
/// it) and registers its engines, introspecting them concurrently.
pub(crate) async fn register(fleet: &Fleet, model: &ModelPlan) -> Registered {
    fleet.keep_prefix_index(&model.selection.id, model.selection.prefix_index.clone());
    futures_util::future::join_all(
        model
            .engines
            .iter()
            .map(|spec| fleet.apply(Change::Upsert(spec.clone()))),
    )
    .await
    .into_iter()
    .enumerate()
    .map(|(e, applied)| {
        applied
            .map(|engine| engine.role())
            .map_err(|error| ConfigError::at(format!("engines[{e}]"), error))
    })
    .collect()
}

/// The model's route, its buckets built with the roles `registered` found; `previous`
/// is its flow control before a reload, kept when its section is unchanged. Errors
/// carry paths within the model.
pub(crate) fn route(
    model: ModelPlan,
    registered: &Registered,
    previous: Option<Arc<ModelFlow>>,
) -> Result<ModelRoute, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut discovered = HashMap::new();
    for (spec, joined) in model.engines.iter().zip(registered) {
        match joined {
            Ok(role) => drop(discovered.insert(spec.id.clone(), *role)),
            Err(error) => errors.push(error.clone()),
        }
    }
    let resolver = model
        .selection
        .routing
        .resolve(|id| discovered.get(id).copied());
    match resolver {
        Ok(resolver) if errors.is_empty() => {
            Ok(
                ModelRoute::new(&model.selection.id, resolver, model.selection.tokenizer)
                    .with_block_size(model.block_size)
                    .with_pd_protocol(model.pd_protocol)
                    .with_flow(&model.flow, previous),
            )
        }
        Ok(_) => Err(errors),
        Err(e) => {
            errors.push(e);
            Err(errors)
        }
    }
}

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher, RandomState};
    RandomState::new().build_hasher().finish()
}

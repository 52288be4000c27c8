//! Application context: the shared services, started once, and engine lifecycle
//! (introspection, registration, load feeds, health).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use router_buckets::{
    BucketResolver, DefaultPolicies, ModelRoster, build_resolver, group_policies,
};
use router_policy::{CacheSource, LocalCacheSource, PolicyHandles};
use router_state::affinity::{AffinityStore, SweeperHandle};
use router_state::kv_events::{
    IndexConfig, KvFeedStats, KvSource, PrefixIndex, spawn_kv_subscriber,
};
use router_state::{
    Engine, EngineId, EngineRegistry, EngineReportedLoadTable, FeedHandle, FeedStats, Health,
    LoadFeedSource, LoadTableConfig, Role, spawn_load_subscriber,
};
use tokio::time::Instant;

use crate::config::{ConfigError, EngineConfig, RouterConfig, roster_of};
use crate::health::HealthBook;
use crate::metrics::Metrics;
use crate::tokenize::ChatTokenizer;
use router_upstream::{FeedEndpoint, KvFeedEndpoint, ServerInfo, Upstream, UpstreamTimeouts};

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

/// A model's routing: its buckets and, when configured, its tokenizer.
#[derive(Debug)]
pub(crate) struct ModelRoute {
    /// The model id, shared by every metric label of the model.
    pub(crate) id: Arc<str>,
    pub(crate) resolver: BucketResolver,
    pub(crate) tokenizer: Option<Arc<ChatTokenizer>>,
}

/// What the router keeps per engine beyond the registry.
#[derive(Debug)]
struct EngineRuntime {
    config: EngineConfig,
    /// Whether `/server_info` was read; retried once the engine becomes healthy.
    introspected: bool,
    _feeds: Vec<FeedHandle>,
}

/// The shared services of a running router.
#[derive(Debug)]
pub struct AppContext {
    pub(crate) registry: Arc<EngineRegistry>,
    pub(crate) load: Arc<EngineReportedLoadTable>,
    pub(crate) routes: ArcSwap<HashMap<String, Arc<ModelRoute>>>,
    pub(crate) health: HealthBook,
    pub(crate) upstream: Upstream,
    pub(crate) metrics: Metrics,
    pub(crate) feed_stats: Arc<FeedStats>,
    /// Counters of every KV-event subscriber.
    pub(crate) kv_stats: Arc<KvFeedStats>,
    /// The prefix index of each model with a cache-aware policy.
    pub(crate) prefix_indexes: Mutex<HashMap<String, Arc<PrefixIndex>>>,
    /// Session and routing-key bindings.
    pub(crate) affinity: Arc<AffinityStore>,
    _sweeper: SweeperHandle,
    pub(crate) admin_token: Option<String>,
    pub(crate) idle_timeout: Duration,
    pub(crate) config: RouterConfig,
    handles: PolicyHandles,
    defaults: DefaultPolicies,
    engines: Mutex<HashMap<EngineId, EngineRuntime>>,
    /// Each engine's `host:port`, parsed once.
    authorities: ArcSwap<HashMap<EngineId, Arc<str>>>,
    rng: Mutex<Xoshiro256PlusPlus>,
}

impl AppContext {
    /// Validates `config`, loads tokenizers, introspects and registers every engine,
    /// starts their load feeds and builds every model's buckets.
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
        let ctx = Arc::new(Self {
            registry: Arc::new(EngineRegistry::new()),
            load,
            routes: ArcSwap::default(),
            health: HealthBook::new(config.health),
            upstream,
            metrics: Metrics::new(),
            feed_stats: Arc::default(),
            kv_stats: Arc::default(),
            prefix_indexes: Mutex::default(),
            affinity,
            _sweeper: sweeper,
            admin_token: config.admin.token.clone(),
            idle_timeout: Duration::from_millis(config.timeouts.idle_ms),
            handles,
            defaults,
            engines: Mutex::default(),
            authorities: ArcSwap::default(),
            rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(seed())),
            config,
        });
        let mut errors = Vec::new();
        let mut routes = HashMap::new();
        for (m, model) in ctx.config.models.iter().enumerate() {
            let tokenizer = match &model.tokenizer {
                Some(path) => match ChatTokenizer::load(path) {
                    Ok(t) => Some(Arc::new(t)),
                    Err(e) => {
                        errors.push(ConfigError::at(format!("models[{m}].tokenizer"), e));
                        None
                    }
                },
                None => None,
            };
            let model_defaults = model.policies.over(&ctx.defaults);
            let handles = ctx.model_handles(model, tokenizer.is_some(), &model_defaults);
            let infos = futures_util::future::join_all(
                model
                    .engines
                    .iter()
                    .map(|e| ctx.upstream.server_info(&e.url)),
            )
            .await;
            let mut discovered = HashMap::new();
            for (e, (engine, info)) in model.engines.iter().zip(infos).enumerate() {
                match ctx.register(engine, &model.id, info) {
                    Ok(role) => drop(discovered.insert(engine.id.clone(), role)),
                    Err(message) => errors.push(ConfigError::at(
                        format!("models[{m}].engines[{e}]"),
                        message,
                    )),
                }
            }
            let roster = roster_of(model, |id| discovered.get(id).copied());
            match build_resolver(model.buckets.as_deref(), &roster, &model_defaults, &handles) {
                Ok(resolver) => drop(routes.insert(
                    model.id.clone(),
                    Arc::new(ModelRoute {
                        id: Arc::from(model.id.as_str()),
                        resolver,
                        tokenizer,
                    }),
                )),
                Err(e) => errors.push(ConfigError::at(
                    format!("models[{m}].{}", e.path),
                    e.message,
                )),
            }
        }
        if !errors.is_empty() {
            return Err(StartError::Config(errors));
        }
        ctx.routes.store(Arc::new(routes));
        Ok(ctx)
    }

    /// The policy handles of `model`: with a prefix index (created here, before the
    /// model's engines register and subscribe to it) when one of its groups runs a
    /// cache-aware policy and the model has a tokenizer to produce token ids. Without
    /// a tokenizer the policy's construction reports what is missing.
    fn model_handles(
        &self,
        model: &crate::config::ModelConfig,
        tokenized: bool,
        defaults: &DefaultPolicies,
    ) -> PolicyHandles {
        let cache_aware = group_policies(model.buckets.as_deref(), defaults)
            .iter()
            .any(|(_, policy)| policy.needs_prefix_source());
        if !(cache_aware && tokenized) {
            return self.handles.clone();
        }
        let index = Arc::new(PrefixIndex::new(IndexConfig {
            block_size: model.block_size,
            max_nodes: model.prefix_index_pages,
        }));
        self.prefix_indexes
            .lock()
            .insert(model.id.clone(), Arc::clone(&index));
        let source: Arc<dyn CacheSource> = Arc::new(LocalCacheSource::new(index));
        self.handles.clone().with_prefix_source(Some(source))
    }

    /// The engine registry.
    pub fn registry(&self) -> &Arc<EngineRegistry> {
        &self.registry
    }

    /// The engine load table.
    pub fn load(&self) -> &Arc<EngineReportedLoadTable> {
        &self.load
    }

    /// Counters of the KV-event subscribers.
    pub fn kv_stats(&self) -> &Arc<KvFeedStats> {
        &self.kv_stats
    }

    /// The session and routing-key bindings.
    pub fn affinity(&self) -> &Arc<AffinityStore> {
        &self.affinity
    }

    /// The prefix index of `model`, when a cache-aware policy reads one.
    pub fn prefix_index(&self, model: &str) -> Option<Arc<PrefixIndex>> {
        self.prefix_indexes.lock().get(model).cloned()
    }

    /// Registers one engine of `model` with what introspection found (configured
    /// values win). Returns its role.
    pub(crate) fn register(
        &self,
        config: &EngineConfig,
        model: &str,
        info: Option<ServerInfo>,
    ) -> Result<Role, String> {
        let known = info.clone().unwrap_or_default();
        let role = config.role.map(Role::from).or(known.role).ok_or_else(|| {
            if info.is_some() {
                "the engine's /server_info does not say its role; set `role`".to_owned()
            } else {
                "the engine is unreachable, so its role is unknown; set `role`".to_owned()
            }
        })?;
        let dp_size = config.dp_size.or(known.dp_size).unwrap_or(1);
        let dp_size = NonZeroU32::new(dp_size).unwrap_or(NonZeroU32::MIN);
        let mut engine =
            Engine::new(config.id.as_str(), config.url.as_str(), model, role).with_dp_size(dp_size);
        if let Some(port) = config.bootstrap_port.or(known.bootstrap_port) {
            engine = engine.with_bootstrap_port(port);
        }
        let healthy = info.is_some();
        let id = engine.id().clone();
        self.registry
            .add(engine.with_health(if healthy {
                Health::Healthy
            } else {
                Health::Unhealthy
            }))
            .map_err(|e| e.to_string())?;
        self.load.register(&id, dp_size);
        self.health.insert(id.clone(), healthy);
        if let Some(authority) = router_upstream::authority(&config.url) {
            self.authorities.rcu(|authorities| {
                let mut next = HashMap::clone(authorities);
                next.insert(id.clone(), Arc::clone(&authority));
                next
            });
        }
        let mut feeds = self.start_feeds(config, &id, dp_size, known.load_feed);
        feeds.extend(self.start_kv_feeds(config, &id, model, dp_size, known.kv_feed));
        self.engines.lock().insert(
            id,
            EngineRuntime {
                config: config.clone(),
                introspected: healthy,
                _feeds: feeds,
            },
        );
        Ok(role)
    }

    fn start_feeds(
        &self,
        config: &EngineConfig,
        id: &EngineId,
        dp_size: NonZeroU32,
        advertised: Option<FeedEndpoint>,
    ) -> Vec<FeedHandle> {
        let endpoint = match (config.load_port, advertised) {
            (Some(port_base), advertised) => {
                let host = router_upstream::url_host(&config.url);
                let topic = advertised.map_or_else(|| "load".to_owned(), |a| a.topic);
                Some(FeedEndpoint {
                    host,
                    port_base,
                    topic,
                })
            }
            (None, advertised) => advertised,
        };
        let Some(endpoint) = endpoint else {
            return Vec::new();
        };
        (0..dp_size.get())
            .filter_map(|rank| {
                let source = LoadFeedSource {
                    engine: id.clone(),
                    rank,
                    endpoint: endpoint.rank_endpoint(rank)?,
                    topic: endpoint.topic.clone(),
                };
                Some(spawn_load_subscriber(
                    Arc::clone(&self.load),
                    source,
                    Arc::clone(&self.feed_stats),
                ))
            })
            .collect()
    }

    /// Subscribes to the engine's KV events, one subscriber per rank, when its model
    /// keeps a prefix index. Configured ports win over advertised ones.
    fn start_kv_feeds(
        &self,
        config: &EngineConfig,
        id: &EngineId,
        model: &str,
        dp_size: NonZeroU32,
        advertised: Option<KvFeedEndpoint>,
    ) -> Vec<FeedHandle> {
        let Some(index) = self.prefix_indexes.lock().get(model).cloned() else {
            return Vec::new();
        };
        let host = router_upstream::url_host(&config.url);
        let endpoint = match (config.kv_port, advertised) {
            (Some(port_base), advertised) => KvFeedEndpoint {
                feed: FeedEndpoint {
                    host,
                    port_base,
                    topic: advertised
                        .as_ref()
                        .map_or_else(String::new, |a| a.feed.topic.clone()),
                },
                replay_port_base: config
                    .kv_replay_port
                    .or(advertised.as_ref().and_then(|a| a.replay_port_base)),
                block_size: advertised.and_then(|a| a.block_size),
            },
            (None, Some(advertised)) => KvFeedEndpoint {
                replay_port_base: config.kv_replay_port.or(advertised.replay_port_base),
                ..advertised
            },
            (None, None) => {
                tracing::warn!(engine = %id, model, "the engine advertises no KV events and has no kv_port: cache-aware routing cannot see its cache");
                return Vec::new();
            }
        };
        let expected = index.config().block_size;
        if let Some(block_size) = endpoint.block_size.filter(|b| *b != expected) {
            tracing::warn!(engine = %id, model, block_size, expected, "the engine's KV page size differs from the model's block_size: its events will be skipped");
        }
        (0..dp_size.get())
            .filter_map(|rank| {
                let replay = |base: u16| {
                    FeedEndpoint {
                        port_base: base,
                        ..endpoint.feed.clone()
                    }
                    .rank_endpoint(rank)
                };
                let source = KvSource {
                    engine: id.clone(),
                    rank,
                    endpoint: endpoint.feed.rank_endpoint(rank)?,
                    replay_endpoint: endpoint.replay_port_base.and_then(replay),
                    topic: endpoint.feed.topic.clone(),
                };
                Some(spawn_kv_subscriber(
                    Arc::clone(&index),
                    source,
                    Arc::clone(&self.kv_stats),
                ))
            })
            .collect()
    }

    /// Adds an engine at runtime (`POST /workers`). A model not served yet gets one
    /// catch-all bucket of the engine's kind.
    pub(crate) async fn add_engine(
        &self,
        config: EngineConfig,
        model: String,
    ) -> Result<Arc<Engine>, String> {
        router_upstream::check_engine_url(&config.url).map_err(|e| format!("url: {e}"))?;
        if config.id.is_empty() || model.is_empty() {
            return Err("id and model must not be empty".into());
        }
        if self.registry.snapshot().get(&config.id).is_some() {
            return Err(format!("engine {} is already registered", config.id));
        }
        let info = self.upstream.server_info(&config.url).await;
        let role = self.register(&config, &model, info)?;
        if !self.routes.load().contains_key(&model) {
            let roster = ModelRoster::new([(EngineId::from(config.id.as_str()), role)]);
            let resolver = build_resolver(None, &roster, &self.defaults, &self.handles)
                .map_err(|e| e.to_string())?;
            self.routes.rcu(|routes| {
                let mut next = HashMap::clone(routes);
                next.entry(model.clone()).or_insert_with(|| {
                    Arc::new(ModelRoute {
                        id: Arc::from(model.as_str()),
                        resolver: resolver.clone(),
                        tokenizer: None,
                    })
                });
                next
            });
        }
        self.registry
            .snapshot()
            .get(&config.id)
            .cloned()
            .ok_or_else(|| "the engine was removed meanwhile".into())
    }

    /// Removes an engine: it leaves every candidate set, its load reports and feeds
    /// are dropped; requests already dispatched to it finish.
    pub(crate) fn remove_engine(&self, id: &str) -> Result<Arc<Engine>, String> {
        let engine = self.registry.remove(id).map_err(|e| e.to_string())?;
        self.load.unregister(engine.id());
        self.health.remove(engine.id());
        // Stop the engine's subscribers before dropping its cache entries.
        drop(self.engines.lock().remove(engine.id()));
        if let Some(index) = self.prefix_indexes.lock().get(engine.model()) {
            index.remove_engine(engine.id());
        }
        self.affinity.remove_engine(engine.id());
        self.authorities.rcu(|authorities| {
            let mut next = HashMap::clone(authorities);
            next.remove(engine.id());
            next
        });
        Ok(engine)
    }

    /// Records a dispatch outcome for the engine's breaker.
    pub(crate) fn record_dispatch(&self, id: &EngineId, succeeded: bool) {
        if let Some(routable) = self.health.record_dispatch(id, succeeded, Instant::now()) {
            self.set_routable(id, routable);
        }
    }

    fn set_routable(&self, id: &EngineId, routable: bool) {
        let health = if routable {
            Health::Healthy
        } else {
            Health::Unhealthy
        };
        if let Ok(true) = self.registry.set_health(id.as_str(), health) {
            tracing::info!(engine = %id, routable, "engine routability changed");
        }
    }

    /// Probes every engine once; engines that come back and were never introspected
    /// are introspected again so their load feeds start.
    pub(crate) async fn probe_all(&self) {
        let snapshot = self.registry.snapshot();
        let probes = snapshot.engines().map(|w| async move {
            let passed = self
                .upstream
                .probe(w.url(), self.health.probe_timeout())
                .await;
            (Arc::clone(w), passed)
        });
        for (engine, passed) in futures_util::future::join_all(probes).await {
            if let Some(routable) = self
                .health
                .record_probe(engine.id(), passed, Instant::now())
            {
                self.set_routable(engine.id(), routable);
            }
            if passed {
                self.retry_introspection(&engine).await;
            }
        }
    }

    async fn retry_introspection(&self, engine: &Engine) {
        let pending = {
            let engines = self.engines.lock();
            engines
                .get(engine.id())
                .filter(|e| !e.introspected)
                .map(|e| e.config.clone())
        };
        let Some(config) = pending else {
            return;
        };
        let Some(info) = self.upstream.server_info(engine.url()).await else {
            return;
        };
        let mut feeds = self.start_feeds(&config, engine.id(), engine.dp_size(), info.load_feed);
        feeds.extend(self.start_kv_feeds(
            &config,
            engine.id(),
            engine.model(),
            engine.dp_size(),
            info.kv_feed,
        ));
        if let Some(runtime) = self.engines.lock().get_mut(engine.id()) {
            runtime.introspected = true;
            runtime._feeds = feeds;
        }
    }

    /// The engine's `host:port`.
    pub(crate) fn engine_authority(&self, engine: &Engine) -> Option<Arc<str>> {
        match self.authorities.load().get(engine.id()) {
            Some(authority) => Some(Arc::clone(authority)),
            None => router_upstream::authority(engine.url()),
        }
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

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher, RandomState};
    RandomState::new().build_hasher().finish()
}

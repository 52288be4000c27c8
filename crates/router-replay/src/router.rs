//! The router a replay drives: the selection a configuration describes, built by the
//! builder `switchyard serve` uses ([`SelectionPlan::build`]), with the engines
//! registered and nothing listening or connected.
//!
//! A replay is one process routing token ids: no tokenizer is read, each cache-aware
//! model keeps a prefix index of its own (never a shared indexer's), bindings stay in
//! the process whatever the affinity backend (rendezvous binds none), and an engine
//! configured without a role is plain.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;

use router_config::{
    AffinityBackendKind, EngineRole, ModelConfig, PrefixIndexerConfig, Resources, RouterConfig,
    SelectionPlan, SelectionState,
};
use router_policy::{AffinityBackend, CacheSource, ConfigError};
use router_state::affinity::LocalAffinityStore;
use router_state::kv_events::PrefixIndex;
use router_state::{Engine, EngineId, EngineRegistry, EngineReportedLoadTable, Role};

use crate::ReplayError;

/// A model as the replay routes it.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) resolver: router_buckets::BucketResolver,
    /// The prefix index its cache-aware groups read, fed by its engines' KV events.
    pub(crate) index: Option<Arc<PrefixIndex>>,
    /// Tokens per page: the router's and the modelled engines'.
    pub(crate) block_size: u32,
}

/// The router's state for one replay.
#[derive(Debug)]
pub(crate) struct Router {
    pub(crate) registry: EngineRegistry,
    pub(crate) load: Arc<EngineReportedLoadTable>,
    pub(crate) models: BTreeMap<String, Model>,
    /// Every engine: its id, model, data-parallel ranks and role, in configuration
    /// order.
    pub(crate) engines: Vec<(EngineId, String, u32, Role)>,
}

/// A replay's [`Resources`]: its prompts are the trace's token ids.
struct TokenIds;

impl Resources for TokenIds {
    type Tokenizer = ();
    type Error = Infallible;

    fn tokenizer(&mut self, _model: &ModelConfig, _path: &Path) -> Result<(), Infallible> {
        Ok(())
    }

    fn token_ids(&self, _model: &ModelConfig) -> bool {
        true
    }

    fn shared_prefix_source(
        &mut self,
        _model: &ModelConfig,
        _indexer: &PrefixIndexerConfig,
    ) -> Option<Arc<dyn CacheSource>> {
        None
    }
}

/// The selection a replay of `config` routes with: every model's buckets, groups and
/// policies with their caps, as `switchyard serve` builds them from the same file
/// (see the module documentation for what a replay does differently).
///
/// # Errors
/// What the router would refuse.
pub fn selection(config: &RouterConfig) -> Result<SelectionPlan<()>, ReplayError> {
    let problems = config.check_fields();
    if !problems.is_empty() {
        return Err(ReplayError::Config(problems));
    }
    let config = replayed(config);
    // Bindings stay in the process whatever the backend: a replay is one router.
    let backend = match config.affinity.backend {
        AffinityBackendKind::Rendezvous => AffinityBackend::Rendezvous,
        AffinityBackendKind::Local | AffinityBackendKind::Redis => AffinityBackend::Store(
            Arc::new(LocalAffinityStore::new(config.affinity.store_config())),
        ),
    };
    let state = SelectionState::new(&config, Some(backend));
    SelectionPlan::build(&config, &state, &mut TokenIds).map_err(ReplayError::Config)
}

/// `config` as a replay serves it: engines without a role are plain, cache-aware
/// groups keep an index of their own.
fn replayed(config: &RouterConfig) -> RouterConfig {
    let mut config = config.clone();
    config.prefix_indexer = None;
    for engine in config.models.iter_mut().flat_map(|m| m.engines.iter_mut()) {
        engine.role.get_or_insert(EngineRole::Plain);
    }
    config
}

impl Router {
    /// Builds the router `config` describes, its engines registered.
    ///
    /// # Errors
    /// See [`selection`].
    pub(crate) fn build(config: &RouterConfig) -> Result<Self, ReplayError> {
        let plan = selection(config)?;
        let load = Arc::clone(&plan.handles.load);
        let registry = EngineRegistry::new();
        let mut engines = Vec::new();
        let mut models = BTreeMap::new();
        for (m, (model, selection)) in config.models.iter().zip(plan.models).enumerate() {
            let at = |field: String, problem: &dyn std::fmt::Display| {
                ReplayError::Config(vec![ConfigError::at(
                    format!("models[{m}]{field}"),
                    problem,
                )])
            };
            for (e, engine) in model.engines.iter().enumerate() {
                let dp = engine.dp_size.unwrap_or(1).max(1);
                // Without a role an engine is plain, as `replayed` makes it.
                let role = engine.role.map_or(Role::Plain, Role::from);
                let dp_size = NonZeroU32::new(dp).unwrap_or(NonZeroU32::MIN);
                registry
                    .add(
                        Engine::new(
                            engine.id.as_str(),
                            engine.url.as_str(),
                            model.id.as_str(),
                            role,
                        )
                        .with_dp_size(dp_size),
                    )
                    .map_err(|problem| at(format!(".engines[{e}]"), &problem))?;
                let id = EngineId::new(engine.id.as_str());
                load.register(&id, dp_size);
                engines.push((id, model.id.clone(), dp, role));
            }
            // Every replayed engine has its role: the buckets are built already.
            let resolver = selection.routing.resolve(|_| None).map_err(|problem| {
                ReplayError::Config(vec![problem.within(&format!("models[{m}]"))])
            })?;
            models.insert(
                model.id.clone(),
                Model {
                    resolver,
                    index: selection.prefix_index,
                    block_size: model.block_size,
                },
            );
        }
        Ok(Self {
            registry,
            load,
            models,
            engines,
        })
    }
}

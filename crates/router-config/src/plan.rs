//! The selection a configuration describes: each model's buckets, groups and policies
//! with their admission caps, built around shared state (the load table, the affinity
//! backend, the prefix indexes). `switchyard serve` and `switchyard replay` both build
//! it here, so a replay routes as the router it models.
//!
//! What needs I/O is given by the caller ([`Resources`]): the tokenizer files, and the
//! client of a shared prefix indexer. The state is given too ([`SelectionState`]):
//! fresh for a router that starts, the running router's own for a reload.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use router_buckets::{BucketConfig, BucketResolver, DefaultPolicies, ModelRoster};
use router_buckets::{build_resolver, group_policies};
use router_policy::{
    AffinityBackend, CacheSource, ConfigError, EventSource, LocalCacheSource, PolicyHandles,
    RoutedCacheSource,
};
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::{EngineId, EngineReportedLoadTable, LoadTableConfig, Role};

use crate::{ModelConfig, PrefixIndexerConfig, RouterConfig};

/// What a selection is built around.
#[derive(Debug, Clone)]
pub struct SelectionState {
    /// Engines' reported load and the router's in-flight counts.
    pub load: Arc<EngineReportedLoadTable>,
    /// Where affinity policies keep keys' engines; `None` when the affinity section
    /// gives none (its field check says why).
    pub affinity: Option<AffinityBackend>,
    /// Each model's prefix index to keep, by model id: a model whose index settings
    /// are unchanged keeps its entries.
    pub prefix_indexes: HashMap<String, Arc<PrefixIndex>>,
}

impl SelectionState {
    /// Fresh state for `config`: an empty load table with its freshness, no prefix
    /// index yet, and `affinity`.
    pub fn new(config: &RouterConfig, affinity: Option<AffinityBackend>) -> Self {
        Self {
            load: Arc::new(EngineReportedLoadTable::new(LoadTableConfig {
                freshness: Duration::from_millis(config.load.freshness_ms),
            })),
            affinity,
            prefix_indexes: HashMap::new(),
        }
    }
}

/// What building a selection needs from outside the configuration.
pub trait Resources {
    /// A loaded tokenizer.
    type Tokenizer;
    /// Why a tokenizer could not be loaded.
    type Error: fmt::Display;

    /// The tokenizer of `model`, held by its `tokenizer` file at `path`.
    ///
    /// # Errors
    /// The file cannot be read or is not a tokenizer.
    fn tokenizer(
        &mut self,
        model: &ModelConfig,
        path: &Path,
    ) -> Result<Self::Tokenizer, Self::Error>;

    /// Whether `model`'s prompts reach its policies as token ids, which a prefix
    /// index needs: a router's when it tokenizes them (the model names a tokenizer).
    fn token_ids(&self, model: &ModelConfig) -> bool {
        model.tokenizer.is_some()
    }

    /// What `model`'s cache-aware groups ask when router replicas share a prefix
    /// indexer; `None` when it cannot be reached at all (its URL, which the field
    /// check reports).
    fn shared_prefix_source(
        &mut self,
        model: &ModelConfig,
        indexer: &PrefixIndexerConfig,
    ) -> Option<Arc<dyn CacheSource>>;
}

/// The selection a configuration describes.
#[derive(Debug)]
pub struct SelectionPlan<T> {
    /// The policies of a model that first appears at runtime: the router-wide
    /// defaults over the built-in ones.
    pub defaults: DefaultPolicies,
    /// The state those policies are built around.
    pub handles: PolicyHandles,
    /// Each model's selection, in configuration order.
    pub models: Vec<ModelSelection<T>>,
}

/// One model's selection.
#[derive(Debug)]
pub struct ModelSelection<T> {
    /// The model id.
    pub id: String,
    /// Its tokenizer, when it names one.
    pub tokenizer: Option<T>,
    /// Its prefix index, when a cache-aware group reads one of this router's own;
    /// fed by its engines' KV events.
    pub prefix_index: Option<Arc<PrefixIndex>>,
    /// Its buckets.
    pub routing: ModelRouting,
}

/// A model's buckets: built, or to build once the engines have told the roles the
/// configuration leaves out.
#[derive(Debug)]
pub enum ModelRouting {
    /// Every engine declares its role: the buckets as built.
    Built(BucketResolver),
    /// Checked with the declared roles; built again with the discovered ones.
    AfterIntrospection {
        /// The model's buckets, as configured.
        buckets: Option<Vec<BucketConfig>>,
        /// The engines and the roles they declare.
        engines: Vec<(EngineId, Option<Role>)>,
        /// The model's default policies.
        defaults: Box<DefaultPolicies>,
        /// The state its policies are built around.
        handles: PolicyHandles,
    },
}

impl ModelRouting {
    /// The buckets, built with the roles `discovered` tells for engines that
    /// declare none (those buckets that were built already are returned as they
    /// are).
    ///
    /// # Errors
    /// The buckets do not fit the discovered roles.
    pub fn resolve(
        self,
        discovered: impl Fn(&EngineId) -> Option<Role>,
    ) -> Result<BucketResolver, ConfigError> {
        match self {
            ModelRouting::Built(resolver) => Ok(resolver),
            ModelRouting::AfterIntrospection {
                buckets,
                engines,
                defaults,
                handles,
            } => build_resolver(
                buckets.as_deref(),
                &roster(&engines, discovered),
                &defaults,
                &handles,
            ),
        }
    }
}

impl<T> SelectionPlan<T> {
    /// Builds every model's selection of `config` around `state`. Field checks are
    /// [`RouterConfig::check_fields`]'s; this reports what building finds (a
    /// tokenizer that does not load, buckets and policies the engines do not fit),
    /// each with its path.
    ///
    /// # Errors
    /// Every problem found.
    pub fn build<R>(
        config: &RouterConfig,
        state: &SelectionState,
        resources: &mut R,
    ) -> Result<Self, Vec<ConfigError>>
    where
        R: Resources<Tokenizer = T>,
    {
        let handles =
            PolicyHandles::new(Arc::clone(&state.load)).with_affinity(state.affinity.clone());
        let defaults = config.policies.over(&DefaultPolicies::default());
        let mut models = Vec::with_capacity(config.models.len());
        let mut errors = Vec::new();
        for (m, model) in config.models.iter().enumerate() {
            let built = ModelSelection::build(
                model,
                Around {
                    handles: &handles,
                    defaults: &defaults,
                    kept_index: state.prefix_indexes.get(&model.id),
                    indexer: config.prefix_indexer.as_ref(),
                },
                resources,
            );
            match built {
                Ok(selection) => models.push(selection),
                Err(problems) => {
                    let at = format!("models[{m}]");
                    errors.extend(problems.into_iter().map(|e| e.within(&at)));
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            defaults,
            handles,
            models,
        })
    }
}

/// What a model's selection is built around.
struct Around<'a> {
    handles: &'a PolicyHandles,
    /// The router-wide default policies.
    defaults: &'a DefaultPolicies,
    /// The model's prefix index to keep, if its settings are unchanged.
    kept_index: Option<&'a Arc<PrefixIndex>>,
    /// The shared prefix indexer asked instead of an index of the router's own.
    indexer: Option<&'a PrefixIndexerConfig>,
}

impl<T> ModelSelection<T> {
    /// Loads the model's tokenizer, gives it a prefix index when a cache-aware group
    /// reads one, and builds (or checks) its buckets. Paths are within the model.
    fn build<R: Resources<Tokenizer = T>>(
        model: &ModelConfig,
        around: Around<'_>,
        resources: &mut R,
    ) -> Result<Self, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let tokenizer =
            model
                .tokenizer
                .as_deref()
                .and_then(|path| match resources.tokenizer(model, path) {
                    Ok(tokenizer) => Some(tokenizer),
                    Err(e) => {
                        errors.push(ConfigError::at("tokenizer", e));
                        None
                    }
                });
        let defaults = model.policies.over(around.defaults);
        let (prefix_index, source) = prefix_source(model, &defaults, &around, resources);
        let handles = around.handles.clone().with_prefix_source(source);
        let engines: Vec<(EngineId, Option<Role>)> = model
            .engines
            .iter()
            .map(|e| (EngineId::new(e.id.as_str()), e.role.map(Role::from)))
            .collect();
        let resolver = build_resolver(
            model.buckets.as_deref(),
            &roster(&engines, |_| None),
            &defaults,
            &handles,
        );
        let routing = match resolver {
            Err(e) => {
                errors.push(e);
                return Err(errors);
            }
            Ok(resolver) if engines.iter().all(|(_, role)| role.is_some()) => {
                ModelRouting::Built(resolver)
            }
            Ok(_) => ModelRouting::AfterIntrospection {
                buckets: model.buckets.clone(),
                engines,
                defaults: Box::new(defaults),
                handles,
            },
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            id: model.id.clone(),
            tokenizer,
            prefix_index,
            routing,
        })
    }
}

/// The prefix index a model keeps and the source its cache-aware groups read: none
/// without such a group or without token ids to hash (the policy's construction
/// then says what is missing); the shared indexer when one is configured; else an
/// index of the router's own (the one kept, when its settings are the same).
fn prefix_source<R: Resources>(
    model: &ModelConfig,
    defaults: &DefaultPolicies,
    around: &Around<'_>,
    resources: &mut R,
) -> (Option<Arc<PrefixIndex>>, Option<Arc<dyn CacheSource>>) {
    let cache_aware = group_policies(model.buckets.as_deref(), defaults)
        .iter()
        .any(|(_, policy)| policy.needs_prefix_source());
    if !cache_aware || !resources.token_ids(model) {
        return (None, None);
    }
    let routed = |events: EventSource| -> Arc<dyn CacheSource> {
        let knows_publishers = matches!(events, EventSource::Local(_));
        match events {
            events if model.routed_pages.counts_routing(knows_publishers) => {
                Arc::new(RoutedCacheSource::new(
                    events,
                    model.block_size,
                    Arc::clone(&around.handles.load),
                    model.routed_pages,
                ))
            }
            EventSource::Local(index) => Arc::new(LocalCacheSource::new(index)),
            EventSource::Other(source) => source,
        }
    };
    if let Some(indexer) = around.indexer {
        let shared = resources.shared_prefix_source(model, indexer);
        return (
            None,
            shared.map(|source| routed(EventSource::Other(source))),
        );
    }
    let config = IndexConfig {
        block_size: model.block_size,
        max_nodes: model.prefix_index_pages,
        max_entries: model.prefix_index_entries,
    };
    let index = around
        .kept_index
        .filter(|index| index.config() == config)
        .cloned()
        .unwrap_or_else(|| Arc::new(PrefixIndex::new(config)));
    let source = routed(EventSource::Local(Arc::clone(&index)));
    (Some(index), Some(source))
}

/// The roster of a model's engines: declared roles, else `discovered(id)`, else not
/// known yet.
fn roster(
    engines: &[(EngineId, Option<Role>)],
    discovered: impl Fn(&EngineId) -> Option<Role>,
) -> ModelRoster {
    let (known, unknown): (Vec<_>, Vec<_>) = engines
        .iter()
        .map(|(id, role)| (id.clone(), role.or_else(|| discovered(id))))
        .partition(|(_, role)| role.is_some());
    ModelRoster::new(known.into_iter().filter_map(|(id, role)| Some((id, role?))))
        .with_unknown_roles(unknown.into_iter().map(|(id, _)| id))
}

//! The router a replay drives: a configuration's engines, buckets and policies built
//! as `switchyard serve` builds them (the same resolvers, load table, prefix indexes
//! and affinity store), with nothing listening and nothing connected.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use router_buckets::{DefaultPolicies, ModelRoster, build_resolver, group_policies};
use router_http::{EngineRole, RouterConfig};
use router_policy::{AffinityBackend, LocalCacheSource, PolicyConfig, PolicyHandles};
use router_state::affinity::LocalAffinityStore;
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_state::{
    Engine, EngineId, EngineRegistry, EngineReportedLoadTable, LoadTableConfig, Role,
};

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
    /// Every engine: its id, model and data-parallel ranks, in configuration order.
    pub(crate) engines: Vec<(EngineId, String, u32)>,
}

impl Router {
    /// Builds the router `config` describes.
    ///
    /// # Errors
    /// An engine that is not plain, or a bucket or policy the router would refuse.
    pub(crate) fn build(config: &RouterConfig) -> Result<Self, ReplayError> {
        let problems = config.check_fields();
        if !problems.is_empty() {
            let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
            return Err(ReplayError::Config(problems.join("; ")));
        }
        let load = Arc::new(EngineReportedLoadTable::new(LoadTableConfig {
            freshness: Duration::from_millis(config.load.freshness_ms),
        }));
        // Bindings stay in the process whatever the backend: a replay is one router.
        let backend = match config.affinity.backend {
            router_http::AffinityBackendKind::Rendezvous => AffinityBackend::Rendezvous,
            _ => AffinityBackend::Store(Arc::new(LocalAffinityStore::new(
                config.affinity.store_config(),
            ))),
        };
        let handles = PolicyHandles::new(Arc::clone(&load)).with_affinity(Some(backend));
        let defaults = config.policies.over(&DefaultPolicies::default());
        let registry = EngineRegistry::new();
        let mut models = BTreeMap::new();
        let mut engines = Vec::new();
        for (m, model) in config.models.iter().enumerate() {
            let at = |field: String, message: String| {
                ReplayError::Config(format!("models[{m}].{field}: {message}"))
            };
            let mut roster = Vec::new();
            for (e, engine) in model.engines.iter().enumerate() {
                if matches!(engine.role, Some(EngineRole::Prefill | EngineRole::Decode)) {
                    return Err(at(
                        format!("engines[{e}].role"),
                        "replay models plain engines; prefill/decode pairs are not replayed".into(),
                    ));
                }
                let dp = engine.dp_size.unwrap_or(1).max(1);
                let dp_size = NonZeroU32::new(dp).expect("at least 1");
                registry
                    .add(
                        Engine::new(
                            engine.id.as_str(),
                            engine.url.as_str(),
                            model.id.as_str(),
                            Role::Plain,
                        )
                        .with_dp_size(dp_size),
                    )
                    .map_err(|e| at(format!("engines[{e}]"), e.to_string()))?;
                let id = EngineId::new(engine.id.as_str());
                load.register(&id, dp_size);
                roster.push((id.clone(), Role::Plain));
                engines.push((id, model.id.clone(), dp));
            }
            let defaults = model.policies.over(&defaults);
            let indexed = group_policies(model.buckets.as_deref(), &defaults)
                .iter()
                .any(|(_, policy)| policy.needs_prefix_source());
            let index = indexed.then(|| {
                Arc::new(PrefixIndex::new(IndexConfig {
                    block_size: model.block_size,
                    max_nodes: model.prefix_index_pages,
                }))
            });
            let handles = handles
                .clone()
                .with_prefix_source(index.as_ref().map(|index| {
                    Arc::new(LocalCacheSource::new(Arc::clone(index)))
                        as Arc<dyn router_policy::CacheSource>
                }));
            let resolver = build_resolver(
                model.buckets.as_deref(),
                &ModelRoster::new(roster),
                &defaults,
                &handles,
            )
            .map_err(|e| at(String::new(), e.to_string()))?;
            models.insert(
                model.id.clone(),
                Model {
                    resolver,
                    index,
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

/// `config` with every policy of every group (and every default) of type `name`, each
/// keeping the admission caps of the policy it replaces.
///
/// # Errors
/// `name` is not a policy type.
pub fn with_policy(config: &RouterConfig, name: &str) -> Result<RouterConfig, ReplayError> {
    let fresh: PolicyConfig = serde_json::from_value(serde_json::json!({ "type": name }))
        .map_err(|e| ReplayError::Config(format!("policy {name:?}: {e}")))?;
    let swap = |slot: &mut Option<PolicyConfig>, keep_unset: bool| {
        let admission = slot.as_ref().map(|p| *p.admission());
        if slot.is_none() && keep_unset {
            return;
        }
        let mut policy = fresh.clone();
        if let Some(admission) = admission {
            *policy.admission_mut() = admission;
        }
        *slot = Some(policy);
    };
    let mut config = config.clone();
    for slot in roles(&mut config.policies) {
        swap(slot, false);
    }
    for_each_model_policy(&mut config, |slot| swap(slot, true));
    Ok(config)
}

/// `config` with every policy that draws random numbers and names no seed given
/// `seed`, so a replay draws the same numbers every time.
pub fn seeded(config: &RouterConfig, seed: u64) -> RouterConfig {
    let seed_one = |slot: &mut Option<PolicyConfig>| {
        let Some(policy) = slot else { return };
        let Ok(serde_json::Value::Object(mut fields)) = serde_json::to_value(&*policy) else {
            return;
        };
        if fields.get("seed").is_some_and(|s| !s.is_null()) {
            return;
        }
        fields.insert("seed".into(), seed.into());
        // Types without a seed refuse the field and stay as they are.
        if let Ok(with_seed) = serde_json::from_value(serde_json::Value::Object(fields)) {
            *policy = with_seed;
        }
    };
    let mut config = config.clone();
    let builtin = DefaultPolicies::default();
    for (slot, role) in
        roles(&mut config.policies)
            .into_iter()
            .zip([Role::Plain, Role::Prefill, Role::Decode])
    {
        if slot.is_none() {
            *slot = Some(builtin.for_role(role).clone());
        }
    }
    for slot in roles(&mut config.policies) {
        seed_one(slot);
    }
    for_each_model_policy(&mut config, seed_one);
    config
}

/// Applies `f` to every policy slot of every model: its role defaults and its groups'.
fn for_each_model_policy(config: &mut RouterConfig, mut f: impl FnMut(&mut Option<PolicyConfig>)) {
    for model in &mut config.models {
        for slot in roles(&mut model.policies) {
            f(slot);
        }
        for bucket in model.buckets.iter_mut().flatten() {
            let groups = &mut bucket.groups;
            let pd = groups
                .pd
                .as_mut()
                .map(|pd| [&mut pd.prefill, &mut pd.decode]);
            for group in groups.plain.iter_mut().chain(pd.into_iter().flatten()) {
                f(&mut group.policy);
            }
        }
    }
}

fn roles(policies: &mut router_http::RolePolicies) -> [&mut Option<PolicyConfig>; 3] {
    [
        &mut policies.plain,
        &mut policies.prefill,
        &mut policies.decode,
    ]
}

//! The routing tables: each model's buckets (built once, replaced whole) and
//! tokenizer, and what a model that first appears at runtime gets.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use router_buckets::{
    BucketGroups, BucketResolver, DefaultPolicies, Membership, ModelRoster, ShadowTotals,
    build_resolver,
};
use router_policy::{ConfigError, PolicyHandles};
use router_state::{Engine, EngineId, RegistrySnapshot, Role};

use router_config::{FlowConfig, ModelConfig, PdProtocol};
use router_flow::WaitingRoom;
use router_tokenize::ChatTokenizer;

use crate::flow::ModelFlow;

/// One group's shadow policy, for metrics.
#[derive(Debug)]
pub(crate) struct ShadowSeries {
    pub(crate) model: Arc<str>,
    pub(crate) bucket: String,
    pub(crate) stage: Role,
    pub(crate) policy: &'static str,
    pub(crate) totals: ShadowTotals,
}

/// A model's routing: its buckets and, when configured, its tokenizer.
#[derive(Debug)]
pub(crate) struct ModelRoute {
    /// The model id, shared by every metric label of the model.
    pub(crate) id: Arc<str>,
    pub(crate) resolver: BucketResolver,
    pub(crate) tokenizer: Option<Arc<ChatTokenizer>>,
    /// The model's tokenizer when routing reads no prompt: only replayable decision
    /// records tokenize with it, and only the requests they record.
    pub(crate) record_tokenizer: Option<Arc<ChatTokenizer>>,
    /// The model's page size, in tokens (`block_size`): what replayable records hash
    /// prompts in.
    pub(crate) block_size: u32,
    /// How its prefill and decode engines hand a request over.
    pub(crate) pd_protocol: PdProtocol,
    /// Whether a bucket has a time-per-output-token target, which streamed answers'
    /// measured pace is then kept for.
    pub(crate) measures_tpot: bool,
    /// Its flow control; `None` when its `flow` section is the default.
    pub(crate) flow: Option<Arc<ModelFlow>>,
    /// The address a gateway reaches each of its engines at, by list of engines
    /// (the endpoint picker's, computed once a list rather than once a request).
    #[cfg(feature = "picker")]
    pub(crate) gateway_addresses: router_state::EngineListMemo<Vec<GatewayAddress>>,
}

/// An engine, and the address a gateway reaches it at (`None`: none it can).
#[cfg(feature = "picker")]
pub(crate) type GatewayAddress = (router_state::EngineId, Option<std::net::SocketAddr>);

impl ModelRoute {
    /// The route of model `id`. Its prompts are tokenized only when the route can
    /// depend on them (a bucket bounds their length or a policy reads them):
    /// otherwise the tokenizer is kept for decision records alone and prompt lengths
    /// are estimated. Its page size is the default's until
    /// [`with_block_size`](Self::with_block_size).
    pub(crate) fn new(
        id: &str,
        resolver: BucketResolver,
        tokenizer: Option<Arc<ChatTokenizer>>,
    ) -> Self {
        let (tokenizer, record_tokenizer) = match tokenizer {
            Some(tokenizer) if !resolver.routes_on_prompt() => {
                tracing::info!(
                    model = id,
                    "prompts are not tokenized: no bucket bounds their length and no policy reads them"
                );
                (None, Some(tokenizer))
            }
            tokenizer => (tokenizer, None),
        };
        let measures_tpot = resolver
            .buckets()
            .iter()
            .any(|b| b.slo().is_some_and(|t| t.tpot_ms.is_some()));
        Self {
            id: Arc::from(id),
            resolver,
            tokenizer,
            record_tokenizer,
            block_size: ModelConfig::DEFAULT_BLOCK_SIZE,
            pd_protocol: PdProtocol::default(),
            measures_tpot,
            flow: None,
            #[cfg(feature = "picker")]
            gateway_addresses: router_state::EngineListMemo::new(),
        }
    }

    /// With pages of `block_size` tokens.
    pub(crate) fn with_block_size(mut self, block_size: u32) -> Self {
        self.block_size = block_size;
        self
    }

    /// With the flow control `config` describes: `previous` (the model's flow control
    /// before a reload) when it was built from the same section, so requests waiting
    /// in its queue keep their places and tenants their counts; else a new one.
    pub(crate) fn with_flow(
        mut self,
        config: &FlowConfig,
        previous: Option<Arc<ModelFlow>>,
    ) -> Self {
        self.flow = match previous {
            Some(flow) if flow.config() == config => Some(flow),
            _ => ModelFlow::new(config),
        };
        self
    }

    /// With `protocol` for its prefill/decode hand-over.
    pub(crate) fn with_pd_protocol(mut self, protocol: PdProtocol) -> Self {
        self.pd_protocol = protocol;
        self
    }
}

/// Every model's route, read on each request with one atomic load.
#[derive(Debug)]
pub(crate) struct Routing {
    models: ArcSwap<HashMap<String, Arc<ModelRoute>>>,
    /// The policies of a model that first appears at runtime.
    defaults: ArcSwap<DefaultPolicies>,
    handles: PolicyHandles,
    /// Models a reload is bringing: their engines joining get no catch-all route.
    pending: Mutex<HashSet<String>>,
    /// The models' queues, told whenever capacity may have freed.
    rooms: Rooms,
}

/// The queues capacity events reach: those of the routes served, and those of routes
/// a reload replaced, for as long as anything (a request that resolved the old route,
/// a ticket) still holds them: a request may enter a replaced queue after the reload.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rooms(Arc<ArcSwap<RoomList>>);

#[derive(Debug, Default)]
struct RoomList {
    served: Vec<Arc<WaitingRoom>>,
    retired: Vec<Weak<WaitingRoom>>,
}

impl Rooms {
    /// Tells every queue that capacity may have freed: one atomic load for each empty
    /// one served, one more for each replaced one.
    pub(crate) fn capacity_freed(&self) {
        let list = self.0.load();
        for room in &list.served {
            room.capacity_freed();
        }
        for room in &list.retired {
            if let Some(room) = room.upgrade() {
                room.capacity_freed();
            }
        }
    }

    /// The queues of `models`; the others of the current list stay, as replaced
    /// queues, while anything holds them.
    fn refresh(&self, models: &HashMap<String, Arc<ModelRoute>>) {
        self.serve(
            models
                .values()
                .filter_map(|route| route.flow.as_ref()?.room().cloned())
                .collect(),
        );
    }

    /// Serves `served`; the queues served until now and not among them are replaced.
    fn serve(&self, served: Vec<Arc<WaitingRoom>>) {
        self.0.rcu(|current| {
            let is_served = |room: &WaitingRoom| served.iter().any(|r| std::ptr::eq(&**r, room));
            let mut retired: Vec<Weak<WaitingRoom>> = Vec::new();
            let previous = current.served.iter().map(Arc::downgrade);
            for room in previous.chain(current.retired.iter().cloned()) {
                if let Some(live) = room.upgrade()
                    && !is_served(&live)
                    && !retired.iter().any(|r| r.ptr_eq(&room))
                {
                    retired.push(room);
                }
            }
            RoomList {
                served: served.clone(),
                retired,
            }
        });
    }
}

impl Routing {
    pub(crate) fn new(
        models: HashMap<String, Arc<ModelRoute>>,
        defaults: DefaultPolicies,
        handles: PolicyHandles,
    ) -> Self {
        let rooms = Rooms::default();
        rooms.refresh(&models);
        Self {
            models: ArcSwap::from_pointee(models),
            defaults: ArcSwap::from_pointee(defaults),
            handles,
            pending: Mutex::default(),
            rooms,
        }
    }

    /// Each queued model's queue depth by band, in model order.
    pub(crate) fn queue_depths(&self) -> Vec<(Arc<str>, Vec<usize>)> {
        let mut depths: Vec<(Arc<str>, Vec<usize>)> = self
            .models
            .load()
            .values()
            .filter_map(|route| Some((Arc::clone(&route.id), route.flow.as_ref()?.room()?.depth())))
            .collect();
        depths.sort_by(|a, b| a.0.cmp(&b.0));
        depths
    }

    /// The models' queues, for the load table's capacity events.
    pub(crate) fn rooms(&self) -> &Rooms {
        &self.rooms
    }

    /// Marks `models` as coming with a reload (or none, when it ends): an engine of
    /// theirs that joins meanwhile gets no catch-all route.
    pub(crate) fn set_pending(&self, models: HashSet<String>) {
        *self.pending.lock() = models;
    }

    /// The state the policies of a model that first appears at runtime are built
    /// around.
    pub(crate) fn handles(&self) -> &PolicyHandles {
        &self.handles
    }

    /// Swaps in `routes` and `defaults` in one step (a reload): every model of
    /// `routes` takes its new route, and a model not among them keeps its route only
    /// when `kept(model)` (a model an engine added at runtime brought). No model is
    /// pending afterwards.
    pub(crate) fn replace(
        &self,
        routes: HashMap<String, Arc<ModelRoute>>,
        defaults: DefaultPolicies,
        kept: impl Fn(&str) -> bool,
    ) {
        self.defaults.store(Arc::new(defaults));
        self.models.rcu(|current| {
            let mut next = routes.clone();
            for (model, route) in current.iter() {
                if kept(model) && !next.contains_key(model) {
                    next.insert(model.clone(), Arc::clone(route));
                }
            }
            next
        });
        self.rooms.refresh(&self.models.load());
        self.pending.lock().clear();
    }

    /// The route of `model`, if it is served.
    pub(crate) fn get(&self, model: &str) -> Option<Arc<ModelRoute>> {
        self.models.load().get(model).cloned()
    }

    /// The route and LoRA adapter a request's `model` names: a served model; SGLang's
    /// `base:adapter`, for a served `base`; or, as vLLM names them, an adapter an
    /// engine of `engines` lists (its model's route).
    pub(crate) fn resolve(
        &self,
        model: &str,
        engines: impl FnOnce() -> Arc<RegistrySnapshot>,
    ) -> Option<(Arc<ModelRoute>, Option<Arc<str>>)> {
        if let Some(route) = self.get(model) {
            return Some((route, None));
        }
        if let Some((base, adapter)) = model.split_once(':')
            && let Some(route) = self.get(base)
            && !adapter.is_empty()
        {
            return Some((route, Some(Arc::from(adapter))));
        }
        let engines = engines();
        let engine = engines.engines().find(|e| e.serves_adapter(model))?;
        Some((self.get(engine.model())?, Some(Arc::from(model))))
    }

    /// The route of the one model served, if exactly one is (SGLang's `/generate`
    /// names no model).
    pub(crate) fn only(&self) -> Option<Arc<ModelRoute>> {
        let models = self.models.load();
        match models.len() {
            1 => models.values().next().cloned(),
            _ => None,
        }
    }

    /// The models whose prompts are tokenized, sorted, with their tokenizers.
    pub(crate) fn tokenizers(&self) -> Vec<(Arc<str>, Arc<ChatTokenizer>)> {
        let mut found: Vec<_> = self
            .models
            .load()
            .values()
            .filter_map(|route| {
                Some((Arc::clone(&route.id), Arc::clone(route.tokenizer.as_ref()?)))
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }

    /// The groups every bucket lists by engine id: each a pool whose share held out
    /// by breakers is bounded.
    pub(crate) fn listed_groups(&self) -> Vec<Box<[EngineId]>> {
        let mut listed = Vec::new();
        for route in self.models.load().values() {
            for bucket in route.resolver.buckets() {
                let groups = match bucket.groups() {
                    BucketGroups::Plain(group) => vec![group],
                    BucketGroups::Pd { prefill, decode } => vec![prefill, decode],
                };
                for group in groups {
                    if let Membership::Only(ids) = group.membership() {
                        listed.push(ids.iter().cloned().collect());
                    }
                }
            }
        }
        listed
    }

    /// Every group with a shadow policy: its model, bucket and stage, the shadow's
    /// policy type and sums; sorted by model, then in bucket order.
    pub(crate) fn shadows(&self) -> Vec<ShadowSeries> {
        let models = self.models.load();
        let mut routes: Vec<&Arc<ModelRoute>> = models.values().collect();
        routes.sort_by(|a, b| a.id.cmp(&b.id));
        let mut series = Vec::new();
        for route in routes {
            for bucket in route.resolver.buckets() {
                let groups = match bucket.groups() {
                    BucketGroups::Plain(group) => vec![(Role::Plain, group)],
                    BucketGroups::Pd { prefill, decode } => {
                        vec![(Role::Prefill, prefill), (Role::Decode, decode)]
                    }
                };
                for (stage, group) in groups {
                    if let Some(shadow) = group.shadow() {
                        series.push(ShadowSeries {
                            model: Arc::clone(&route.id),
                            bucket: bucket.id().to_owned(),
                            stage,
                            policy: shadow.policy_name(),
                            totals: shadow.stats().totals(),
                        });
                    }
                }
            }
        }
        series
    }

    /// The served models, sorted.
    pub(crate) fn model_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.models.load().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Gives the model of `engine` one catch-all bucket of the engine's kind when the
    /// model is not served yet (an engine added at runtime for a new model).
    ///
    /// # Errors
    /// The default policies cannot serve such a bucket (say, `cache_aware` for a
    /// model without a tokenizer).
    pub(crate) fn serve_new_model(&self, engine: &Engine) -> Result<(), ConfigError> {
        let model = engine.model();
        if self.models.load().contains_key(model) || self.pending.lock().contains(model) {
            return Ok(());
        }
        let roster = ModelRoster::new([(engine.id().clone(), engine.role())]);
        let resolver = build_resolver(None, &roster, &self.defaults.load(), &self.handles)?;
        self.models.rcu(|models| {
            let mut next = HashMap::clone(models);
            next.entry(model.to_owned())
                .or_insert_with(|| Arc::new(ModelRoute::new(model, resolver.clone(), None)));
            next
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests;

//! The fleet: every engine's registration, feeds and health behind [`Fleet::apply`].

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::StreamExt;
use parking_lot::{Mutex, RwLock};
use router_state::kv_events::{KvFeedStats, PrefixIndex};
use router_state::{
    DEFAULT_MAX_FEED_MESSAGE_BYTES, Engine, EngineId, EngineRegistry, EngineReportedLoadTable,
    FeedHandle, FeedMemory, FeedStats, Health, RegistryError, RegistrySnapshot, Role, check_name,
};
use router_upstream::{Origin, ServerInfo, Upstream, check_engine_url};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::FleetError;
use crate::feeds::{FeedBounds, advertised, kv_feeds, load_feeds};
use crate::health::{Breaker, Dispatched, HealthBook, HealthPolicy};
use crate::probes::probes_at_once;
use crate::role::{pd_profile_of, role_of};
use crate::scrape::{DEFAULT_METRICS_INTERVAL, metrics_scraper};
use crate::spec::{Change, EngineSpec, MAX_DP_SIZE, Source};

/// What changed in the fleet, as observers see it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum FleetEvent {
    /// The engine joined and is in the registry.
    Added(Arc<Engine>),
    /// The engine left the registry; requests already sent to it finish.
    Removed(Arc<Engine>),
}

type Observer = Arc<dyn Fn(&FleetEvent) + Send + Sync>;

/// What the fleet keeps per engine beyond the registry.
#[derive(Debug)]
struct Runtime {
    spec: EngineSpec,
    /// Whether what `/server_info` says is current: not before it was read, nor
    /// after a failed probe (the engine may come back as a new process on other
    /// feed ports); read again once the engine answers probes.
    introspected: bool,
    /// The `/server_info` the feeds were started from (`None`: never read).
    info: Option<ServerInfo>,
    feeds: Vec<FeedHandle>,
}

/// The engines a router can use, and everything that keeps their state current.
///
/// Engines join and leave only through [`Fleet::apply`]; observers registered with
/// [`Fleet::on_change`] hear of each change before `apply` returns.
pub struct Fleet {
    registry: Arc<EngineRegistry>,
    load: Arc<EngineReportedLoadTable>,
    upstream: Upstream,
    health: HealthBook,
    feed_stats: Arc<FeedStats>,
    kv_stats: Arc<KvFeedStats>,
    prefix_indexes: RwLock<HashMap<String, Arc<PrefixIndex>>>,
    engines: Mutex<HashMap<EngineId, Runtime>>,
    /// Held while an engine joins or leaves, so a removal never interleaves with the
    /// registration of the same engine (no feeds left running for a removed one).
    membership: Mutex<()>,
    /// The engines whose adapters are being read.
    reading_adapters: Mutex<HashSet<EngineId>>,
    /// Each engine's `host:port`, parsed once.
    origins: ArcSwap<HashMap<EngineId, Origin>>,
    /// Called without any lock held, so an observer may call back into the fleet.
    observers: ArcSwap<Vec<Observer>>,
    /// The largest message an engine's feeds may send, and the memory all feeds share.
    feed_bounds: FeedBounds,
    /// How often an engine without a `LoadStat` feed has its `/metrics` read;
    /// `None`: never.
    metrics_interval: Option<Duration>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("engines", &self.registry.snapshot().len())
            .field("observers", &self.observers.load().len())
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// An empty fleet whose engines are reached with `upstream`, report load into
    /// `load` and are checked by `health`.
    pub fn new(
        upstream: Upstream,
        load: Arc<EngineReportedLoadTable>,
        health: HealthPolicy,
    ) -> Self {
        Self {
            registry: Arc::new(EngineRegistry::new()),
            load,
            upstream,
            health: HealthBook::new(health),
            feed_stats: Arc::default(),
            kv_stats: Arc::default(),
            prefix_indexes: RwLock::default(),
            engines: Mutex::default(),
            membership: Mutex::default(),
            reading_adapters: Mutex::default(),
            origins: ArcSwap::default(),
            observers: ArcSwap::default(),
            feed_bounds: FeedBounds {
                max_message_bytes: DEFAULT_MAX_FEED_MESSAGE_BYTES,
                memory: FeedMemory::default(),
            },
            metrics_interval: Some(DEFAULT_METRICS_INTERVAL),
        }
    }

    /// Reads the load of engines that serve no `/server_info` (vLLM, which has no
    /// `LoadStat` feed) from their Prometheus `/metrics` every `interval`; `None`
    /// never does. Defaults to every second.
    #[must_use]
    pub fn with_metrics_interval(mut self, interval: Option<Duration>) -> Self {
        self.metrics_interval = interval;
        self
    }

    /// Refuses feed messages (load reports, KV-event batches, replays) larger than
    /// `bytes`: the engine's connection is closed before such a message is read,
    /// and the feed reconnects. Defaults to 16 MiB.
    #[must_use]
    pub fn with_max_feed_message_bytes(mut self, bytes: usize) -> Self {
        self.feed_bounds.max_message_bytes = bytes;
        self
    }

    /// Bounds what all the fleet's feeds hold together in messages still arriving
    /// and KV-event batches kept while a gap is repaired to `bytes`; a frame past it
    /// closes its feed's connection, which reconnects. Defaults to 256 MiB.
    #[must_use]
    pub fn with_feed_memory_bytes(mut self, bytes: usize) -> Self {
        self.feed_bounds.memory = FeedMemory::new(bytes);
        self
    }

    /// The memory budget every feed of the fleet shares.
    pub fn feed_memory(&self) -> &FeedMemory {
        &self.feed_bounds.memory
    }

    /// The engines now: what candidate sets are built from.
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.registry.snapshot()
    }

    /// The engine load table.
    pub fn load(&self) -> &Arc<EngineReportedLoadTable> {
        &self.load
    }

    /// Counters of the load-feed subscribers.
    pub fn feed_stats(&self) -> &Arc<FeedStats> {
        &self.feed_stats
    }

    /// Counters of the KV-event subscribers.
    pub fn kv_stats(&self) -> &Arc<KvFeedStats> {
        &self.kv_stats
    }

    /// Feeds the KV events of `model`'s engines into `index`, or into none. Engines
    /// that join from now on subscribe to it; when it replaces another index (or
    /// none), the model's registered engines' feeds start again into it.
    pub fn keep_prefix_index(&self, model: &str, index: Option<Arc<PrefixIndex>>) {
        let replaced = {
            let mut indexes = self.prefix_indexes.write();
            let previous = match &index {
                Some(index) => indexes.insert(model.to_owned(), Arc::clone(index)),
                None => indexes.remove(model),
            };
            match (&previous, &index) {
                (Some(old), Some(new)) => !Arc::ptr_eq(old, new),
                (None, None) => false,
                _ => true,
            }
        };
        if replaced {
            self.restart_feeds(model);
        }
    }

    /// Starts the feeds of `model`'s registered engines again, from what their
    /// specs and last introspection say.
    fn restart_feeds(&self, model: &str) {
        let _membership = self.membership.lock();
        let snapshot = self.registry.snapshot();
        let mut engines = self.engines.lock();
        for (id, runtime) in engines.iter_mut() {
            if runtime.spec.model != model {
                continue;
            }
            let Some(engine) = snapshot.get(id.as_str()) else {
                continue;
            };
            // The old subscribers stop before the new ones start.
            runtime.feeds.clear();
            runtime.feeds =
                self.start_feeds(&runtime.spec, engine.dp_size(), runtime.info.as_ref());
        }
    }

    /// The spec `id` was registered from (with its source), while it is registered.
    pub fn spec(&self, id: &EngineId) -> Option<EngineSpec> {
        self.engines
            .lock()
            .get(id)
            .map(|runtime| runtime.spec.clone())
    }

    /// The prefix index of `model`, when one is kept.
    pub fn prefix_index(&self, model: &str) -> Option<Arc<PrefixIndex>> {
        self.prefix_indexes.read().get(model).cloned()
    }

    /// Every model's prefix index, by model.
    pub fn prefix_indexes(&self) -> Vec<(String, Arc<PrefixIndex>)> {
        let mut indexes: Vec<_> = self
            .prefix_indexes
            .read()
            .iter()
            .map(|(model, index)| (model.clone(), Arc::clone(index)))
            .collect();
        indexes.sort_by(|a, b| a.0.cmp(&b.0));
        indexes
    }

    /// Calls `observer` with every change from now on, before `apply` returns.
    pub fn on_change(&self, observer: impl Fn(&FleetEvent) + Send + Sync + 'static) {
        let observer: Observer = Arc::new(observer);
        self.observers.rcu(|observers| {
            let mut next = Vec::clone(observers);
            next.push(Arc::clone(&observer));
            next
        });
    }

    fn notify(&self, event: &FleetEvent) {
        for observer in self.observers.load_full().iter() {
            observer(event);
        }
    }

    /// Applies one change and returns the engine added, replaced or removed.
    ///
    /// Adding or upserting reads the engine's `/server_info` first (up to three
    /// attempts): an engine that does not answer joins unhealthy, with its feeds
    /// started once it answers probes. An upsert of an engine whose spec is
    /// unchanged changes nothing; with a changed spec, the new engine takes the old
    /// one's place in one step (no snapshot lacks the id), and what was known of the
    /// old one (load reports, health, feeds, cache entries, bindings) is dropped.
    /// Only the source an engine came from may replace or remove it.
    ///
    /// # Errors
    /// See [`FleetError`]; nothing changed.
    pub async fn apply(&self, change: Change) -> Result<Arc<Engine>, FleetError> {
        match change {
            Change::Add(spec) => {
                check(&spec)?;
                if self.registry.snapshot().get(spec.id.as_str()).is_some() {
                    return Err(RegistryError::DuplicateId { id: spec.id }.into());
                }
                let info = self.upstream.server_info(&spec.url).await;
                self.join(spec, info, false)
            }
            Change::Upsert(spec) => {
                check(&spec)?;
                self.check_owner(&spec.id, spec.source)?;
                if let Some(engine) = self.unchanged(&spec) {
                    return Ok(engine);
                }
                let info = self.upstream.server_info(&spec.url).await;
                self.join(spec, info, true)
            }
            Change::Remove(id, source) => {
                let engine = {
                    let _membership = self.membership.lock();
                    self.check_owner(&id, source)?;
                    let engine = self.registry.remove(id.as_str())?;
                    self.forget(&engine);
                    engine
                };
                self.notify(&FleetEvent::Removed(Arc::clone(&engine)));
                Ok(engine)
            }
        }
    }

    /// Refuses a change of `source` to the engine `id` when another source's engine
    /// has the id.
    fn check_owner(&self, id: &EngineId, source: Source) -> Result<(), FleetError> {
        match self.engines.lock().get(id) {
            Some(runtime) if runtime.spec.source != source => Err(FleetError::Owned {
                id: id.clone(),
                owner: runtime.spec.source,
            }),
            _ => Ok(()),
        }
    }

    /// The registered engine of `spec` when it was registered from the same spec.
    fn unchanged(&self, spec: &EngineSpec) -> Option<Arc<Engine>> {
        let same = self
            .engines
            .lock()
            .get(&spec.id)
            .is_some_and(|runtime| runtime.spec == *spec);
        same.then(|| self.registry.snapshot().get(spec.id.as_str()).cloned())
            .flatten()
    }

    /// Registers the engine of `spec` with what introspection found (configured
    /// values win), replacing the one with its id when `replace` is set, and starts
    /// its feeds. Everything that can fail happens before anything changes.
    fn join(
        &self,
        spec: EngineSpec,
        info: Option<ServerInfo>,
        replace: bool,
    ) -> Result<Arc<Engine>, FleetError> {
        let known = info.clone().unwrap_or_default();
        let role = spec.role.or(known.disaggregation_mode.map(role_of)).ok_or(
            FleetError::UnknownRole {
                reachable: info.is_some(),
            },
        )?;
        let dp_size = dp_size_of(&spec, &known)?;
        let healthy = info.is_some();
        let engine = engine_of(&spec, &known, role, dp_size, healthy);
        let membership = self.membership.lock();
        if replace {
            // Checked again: another source may have taken the id meanwhile.
            self.check_owner(&spec.id, spec.source)?;
        }
        let replaced = self.register(engine, replace)?;
        let id = spec.id.clone();
        self.remember(spec, role, dp_size, info, healthy);
        let engine = self
            .registry
            .snapshot()
            .get(id.as_str())
            .cloned()
            .ok_or(RegistryError::UnknownEngine { id })?;
        drop(membership);
        if let Some(old) = replaced {
            self.notify(&FleetEvent::Removed(old));
        }
        self.notify(&FleetEvent::Added(Arc::clone(&engine)));
        Ok(engine)
    }

    /// Puts `engine` in the registry, in the place of the one with its id when
    /// `replace` is set; forgets the replaced engine and returns it.
    fn register(&self, engine: Engine, replace: bool) -> Result<Option<Arc<Engine>>, FleetError> {
        let replaced = if replace {
            self.registry.replace(engine)?
        } else {
            self.registry.add(engine)?;
            None
        };
        if let Some(old) = &replaced {
            self.forget(old);
        }
        Ok(replaced)
    }

    /// Keeps what the fleet knows of an engine that joined the registry: its load
    /// reports, health, address, feeds and spec.
    fn remember(
        &self,
        spec: EngineSpec,
        role: Role,
        dp_size: NonZeroU32,
        info: Option<ServerInfo>,
        healthy: bool,
    ) {
        let id = spec.id.clone();
        self.load.register(&id, dp_size);
        self.health.insert(id.clone(), &spec.model, role, healthy);
        if let Some(origin) = Origin::of(&spec.url) {
            self.origins.rcu(|origins| {
                let mut next = HashMap::clone(origins);
                next.insert(id.clone(), origin.clone());
                next
            });
        }
        let feeds = self.start_feeds(&spec, dp_size, info.as_ref());
        self.engines.lock().insert(
            id,
            Runtime {
                spec,
                introspected: healthy,
                info,
                feeds,
            },
        );
    }

    fn start_feeds(
        &self,
        spec: &EngineSpec,
        dp_size: NonZeroU32,
        info: Option<&ServerInfo>,
    ) -> Vec<FeedHandle> {
        let (load_feed, kv_feed) = advertised(info);
        let bounds = &self.feed_bounds;
        let mut feeds = load_feeds(
            spec,
            dp_size,
            load_feed,
            &self.load,
            &self.feed_stats,
            bounds,
        );
        let vllm = info.is_some_and(|i| !i.served);
        if let Some(interval) = self.metrics_interval.filter(|_| feeds.is_empty() && vllm) {
            feeds.push(metrics_scraper(
                spec,
                dp_size,
                self.upstream.clone(),
                Arc::clone(&self.load),
                Arc::clone(&self.feed_stats),
                interval,
            ));
        }
        if let Some(index) = self.prefix_index(&spec.model) {
            feeds.extend(kv_feeds(
                spec,
                dp_size,
                kv_feed,
                &index,
                &self.kv_stats,
                bounds,
            ));
        }
        feeds
    }

    /// Drops what the fleet keeps of an engine that left the registry: its load
    /// reports, health, feeds, cache entries and address. Requests already
    /// dispatched to it finish.
    fn forget(&self, engine: &Engine) {
        self.load.unregister(engine.id());
        self.health.remove(engine.id());
        // Stop the engine's subscribers before dropping its cache entries.
        drop(self.engines.lock().remove(engine.id()));
        if let Some(index) = self.prefix_index(engine.model()) {
            index.remove_engine(engine.id());
        }
        self.origins.rcu(|origins| {
            let mut next = HashMap::clone(origins);
            next.remove(engine.id());
            next
        });
    }

    /// Where requests to the engine go: its `host:port`, over TLS or not.
    pub fn origin(&self, engine: &Engine) -> Option<Origin> {
        match self.origins.load().get(engine.id()) {
            Some(origin) => Some(origin.clone()),
            None => Origin::of(engine.url()),
        }
    }

    /// A dispatch to the engine begins: when its breaker is half-open, this one is
    /// the trial, and the engine takes no other until its outcome is recorded.
    pub fn begin_dispatch(&self, id: &EngineId) {
        if let Some(routable) = self.health.begin_dispatch(id, Instant::now()) {
            self.set_routable(id, routable);
        }
    }

    /// Records a dispatch outcome for the engine's breaker.
    pub fn record_dispatch(&self, id: &EngineId, outcome: Dispatched) {
        if let Some(routable) = self.health.record_dispatch(id, outcome, Instant::now()) {
            self.set_routable(id, routable);
        }
    }

    /// Makes each of `groups` (the engines a bucket's group lists by id) a pool of
    /// its own, besides each model's engines of one role: open breakers hold out at
    /// most `max_ejected_percent` of every pool. Replaces the groups set before.
    pub fn set_breaker_groups(&self, groups: Vec<Box<[EngineId]>>) {
        self.health.set_groups(groups);
    }

    /// Breakers kept closed so far because opening them would have held out more
    /// than `max_ejected_percent` of a pool.
    pub fn breakers_held_closed(&self) -> u64 {
        self.health.held_closed()
    }

    /// The breaker of an engine.
    pub fn breaker(&self, id: &EngineId) -> Option<Breaker> {
        self.health.breaker(id)
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

    /// Probes every engine once, now, at most [`MIN_PROBES_AT_ONCE`](crate::MIN_PROBES_AT_ONCE) at a time. An
    /// engine that fails a probe is introspected again once it answers, so an engine
    /// that never answered gets its feeds, and one that came back on other feed ports
    /// is subscribed there; an engine that passes otherwise has its adapters read
    /// again ([`Fleet::refresh_adapters`]).
    pub async fn probe_all(&self) {
        self.probe_spread(Duration::ZERO).await;
    }

    /// Probes every engine once as [`probe_all`](Self::probe_all) does, spread over
    /// `over`: of `n` engines in id order, the `i`-th is probed `i * over / n` from
    /// now, at most [`probes_at_once`] out at once (which engines that do not answer
    /// cannot all take), so a fleet's probes and the reads they bring arrive evenly
    /// rather than all at once, and a rack gone dark does not delay the others'.
    pub async fn probe_spread(&self, over: Duration) {
        let snapshot = self.registry.snapshot();
        let mut engines: Vec<&Arc<Engine>> = snapshot.engines().collect();
        engines.sort_by(|a, b| a.id().cmp(b.id()));
        let timeout = self.health.policy().probe_timeout;
        let start = Instant::now();
        let n = u32::try_from(engines.len()).unwrap_or(u32::MAX).max(1);
        let checks: Vec<_> = engines
            .into_iter()
            .enumerate()
            .map(|(i, engine)| {
                let share = f64::from(u32::try_from(i).unwrap_or(u32::MAX)) / f64::from(n);
                let at = start + over.mul_f64(share);
                async move {
                    tokio::time::sleep_until(at).await;
                    let passed = self.upstream.probe(engine.url(), timeout).await;
                    self.after_probe(engine, passed).await;
                }
            })
            .collect();
        let at_once = probes_at_once(checks.len(), timeout, over);
        let mut checks = futures_util::stream::iter(checks).buffer_unordered(at_once);
        while checks.next().await.is_some() {}
    }

    /// Records a probe's outcome, and reads what the engine says of itself again
    /// when it passed.
    async fn after_probe(&self, engine: &Engine, passed: bool) {
        if let Some(routable) = self
            .health
            .record_probe(engine.id(), passed, Instant::now())
        {
            self.set_routable(engine.id(), routable);
        }
        if !passed {
            if let Some(runtime) = self.engines.lock().get_mut(engine.id()) {
                runtime.introspected = false;
            }
            return;
        }
        let pending = self
            .engines
            .lock()
            .get(engine.id())
            .filter(|runtime| !runtime.introspected)
            .map(|runtime| runtime.spec.clone());
        match pending {
            Some(spec) => self.introspect_again(engine, spec).await,
            None => self.refresh_adapters(engine).await,
        }
    }

    /// Reads the LoRA adapters the engine's `/v1/models` lists now and keeps them
    /// (at most 1,024 names of 1 to 256 bytes of visible ASCII); an answer that
    /// cannot be read keeps those known. The health checks call it on each engine
    /// that passes a probe; call it too when an engine answers as if an adapter it
    /// listed were gone. One read at a time per engine: a call while one runs
    /// returns at once.
    pub async fn refresh_adapters(&self, engine: &Engine) {
        let Some(_reading) = Reading::start(&self.reading_adapters, engine.id()) else {
            return;
        };
        if let Some(listed) = self.upstream.adapters(engine.url()).await {
            self.keep_adapters(engine, listed);
        }
    }

    /// Keeps `listed` as the adapters of the engine registered under `engine`'s id,
    /// while it is still the one at `engine`'s URL.
    fn keep_adapters(&self, engine: &Engine, listed: Vec<String>) {
        let _membership = self.membership.lock();
        let same = self
            .engines
            .lock()
            .get(engine.id())
            .is_some_and(|runtime| runtime.spec.url == engine.url());
        if !same {
            return;
        }
        let count = listed.len();
        if let Ok(true) = self.registry.set_adapters(engine.id().as_str(), listed) {
            tracing::info!(engine = %engine.id(), adapters = count, "the engine's LoRA adapters changed");
        }
    }

    /// Keeps what `info` says the KV hand-over of `engine` needs.
    fn keep_pd_profile(&self, engine: &Engine, info: &ServerInfo) {
        let profile = pd_profile_of(&info.hand_over);
        if let Ok(true) = self
            .registry
            .set_pd_profile(engine.id().as_str(), profile.clone())
        {
            tracing::info!(engine = %engine.id(), ?profile, "what the engine's KV hand-over needs changed");
        }
    }

    /// Reads the `/server_info` of an engine that answers probes again after it
    /// failed one (or never answered), and restarts its feeds when its endpoints
    /// moved.
    async fn introspect_again(&self, engine: &Engine, spec: EngineSpec) {
        let Some(info) = self.upstream.server_info(engine.url()).await else {
            return;
        };
        // Feeds start again when the engine's endpoints moved, or when it had never
        // answered (a vLLM engine's `/metrics` reader starts once it says it is one).
        let moved = {
            let engines = self.engines.lock();
            engines.get(engine.id()).is_none_or(|runtime| {
                runtime
                    .info
                    .as_ref()
                    .is_none_or(|known| known.served != info.served)
                    || advertised(runtime.info.as_ref()) != advertised(Some(&info))
            })
        };
        // The adapters its `/v1/models` lists now (one that was down at startup
        // listed none), and what its KV hand-over needs now (it may have restarted
        // with other settings).
        self.keep_adapters(engine, info.adapters.clone());
        self.keep_pd_profile(engine, &info);
        // Feeds at the same endpoints reconnect by themselves, keeping what they hold.
        let index = self.prefix_index(&spec.model);
        let mut feeds = moved.then(|| self.start_feeds(&spec, engine.dp_size(), Some(&info)));
        // The engine may have been replaced or removed meanwhile: its feeds then
        // belong to nobody and stop when dropped here.
        let mut engines = self.engines.lock();
        if let Some(runtime) = engines.get_mut(engine.id())
            && runtime.spec == spec
        {
            runtime.introspected = true;
            // The model's prefix index was replaced meanwhile: these feeds feed the
            // old one.
            let replaced = match (&index, &self.prefix_index(&spec.model)) {
                (Some(old), Some(new)) => !Arc::ptr_eq(old, new),
                (None, None) => false,
                _ => true,
            };
            if feeds.is_some() && replaced {
                feeds = Some(self.start_feeds(&spec, engine.dp_size(), Some(&info)));
            }
            if let Some(feeds) = feeds {
                tracing::info!(engine = %engine.id(), "engine feeds (re)started from /server_info");
                runtime.info = Some(info);
                runtime.feeds = feeds;
            }
        }
    }

    /// Starts probing every engine at the health policy's interval, each round spread
    /// over half the interval ([`probe_spread`](Self::probe_spread)), closing idle engine
    /// connections on the same tick; stops when the handle is dropped.
    pub fn spawn_health_checks(self: &Arc<Self>) -> HealthChecks {
        let fleet = Arc::clone(self);
        HealthChecks(tokio::spawn(async move {
            let mut tick = tokio::time::interval(fleet.health.policy().interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                fleet.upstream.prune_idle();
                // Over half the interval: a round ends within the interval unless its
                // last probes (or the reads passing ones bring) take longer than the
                // other half; the next tick then waits for it
                // (`MissedTickBehavior::Delay`).
                fleet.probe_spread(fleet.health.policy().interval / 2).await;
            }
        }))
    }
}

/// An engine's adapters being read; the engine's mark goes when it is dropped (also
/// when the read is cancelled).
struct Reading<'a> {
    marks: &'a Mutex<HashSet<EngineId>>,
    id: EngineId,
}

impl<'a> Reading<'a> {
    /// Marks `id` as being read, unless it is already.
    fn start(marks: &'a Mutex<HashSet<EngineId>>, id: &EngineId) -> Option<Self> {
        marks.lock().insert(id.clone()).then(|| Self {
            marks,
            id: id.clone(),
        })
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.marks.lock().remove(&self.id);
    }
}

/// The health-check task; dropping it stops the checks.
#[derive(Debug)]
pub struct HealthChecks(JoinHandle<()>);

impl Drop for HealthChecks {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What every added or upserted spec must satisfy before the engine is contacted.
fn check(spec: &EngineSpec) -> Result<(), FleetError> {
    check_engine_url(&spec.url)?;
    for (field, value) in [("id", spec.id.as_str()), ("model", spec.model.as_str())] {
        check_name(value).map_err(|error| FleetError::Name { field, error })?;
    }
    match spec.dp_size {
        Some(value) if value == 0 || value > MAX_DP_SIZE => Err(FleetError::DpSize {
            value: value.into(),
            introspected: false,
        }),
        _ => Ok(()),
    }
}

/// The engine's data-parallel size: the configured one, else the advertised one
/// (within bounds), else 1.
fn dp_size_of(spec: &EngineSpec, known: &ServerInfo) -> Result<NonZeroU32, FleetError> {
    let dp_size = match (spec.dp_size, known.dp_size) {
        (Some(configured), _) => configured,
        (None, Some(advertised)) if advertised > MAX_DP_SIZE => {
            return Err(FleetError::DpSize {
                value: advertised.into(),
                introspected: true,
            });
        }
        (None, advertised) => advertised.unwrap_or(1),
    };
    Ok(NonZeroU32::new(dp_size).unwrap_or(NonZeroU32::MIN))
}

/// The engine of `spec` with what introspection found (configured values win),
/// healthy or not as `healthy` says.
fn engine_of(
    spec: &EngineSpec,
    known: &ServerInfo,
    role: Role,
    dp_size: NonZeroU32,
    healthy: bool,
) -> Engine {
    let mut engine = Engine::new(
        spec.id.clone(),
        spec.url.as_str(),
        spec.model.as_str(),
        role,
    )
    .with_dp_size(dp_size)
    .with_adapters(known.adapters.iter().map(String::as_str))
    .with_pd_profile(pd_profile_of(&known.hand_over));
    if let Some(port) = spec.bootstrap_port.or(known.bootstrap_port) {
        engine = engine.with_bootstrap_port(port);
    }
    engine.with_health(if healthy {
        Health::Healthy
    } else {
        Health::Unhealthy
    })
}

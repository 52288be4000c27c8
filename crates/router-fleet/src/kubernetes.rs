//! Engines discovered as Kubernetes pods (feature `kubernetes`).
//!
//! Each [`PodSelector`] names a model, a label selector in one namespace, and the
//! port (and role, bootstrap port) its pods' engines serve on. A pod is an engine
//! while it is Ready, has an IP and is not being deleted; it joins through
//! [`Fleet::apply`] (introspected like a configured engine) and leaves the same way
//! (requests already dispatched to it finish). Its engine id is `namespace/pod`,
//! from [`Source::Kubernetes`]: a pod never takes the place of an engine of the
//! configuration or the admin API, nor removes one, whatever its name. Per selector, the pods are listed, then
//! watched from the list's resource version with bookmarks; a `410 Gone` (an expired
//! resource version), an error event or a failed watch relists, a watch the server
//! ends is resumed, and every `relist_interval` a full relist replaces what the
//! watch said, so a missed event (a delete the watch never delivered) is healed.
//! Changes are applied once `debounce` passed without another.
//!
//! An [`InferencePoolRef`] names a Gateway API Inference Extension `InferencePool`
//! instead (`pool`): its label selector and target port are read from the object, at
//! every relist and when a watch says it changed, and its pods follow as a
//! selector's do; a pool that is missing or malformed names no engine.
//!
//! With [`KubernetesSettings::objectives`], the namespace's `InferenceObjective`s
//! (`objective`) that name one of the pools are read too, and each model's
//! objectives and their priorities are handed to the sink whenever they change.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use parking_lot::Mutex;
use router_state::{EngineId, Role};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::fleet::Fleet;
use crate::spec::{Change, EngineSpec, Source};

mod changes;
mod objective;
mod pool;

pub use pool::InferencePoolRef;

/// Each model's InferenceObjectives: their names and the priorities they give.
/// Every model of the pools has an entry, empty when no objective names its pool.
pub type ObjectiveTable = BTreeMap<String, BTreeMap<String, i64>>;

/// Told the whole [`ObjectiveTable`] each time it changes.
pub type ObjectiveSink = Arc<dyn Fn(ObjectiveTable) + Send + Sync>;

/// Pods listed a page at a time.
const PAGE: u32 = 500;
/// How long a watch request may stay open before the server ends it.
const WATCH_SECONDS: u32 = 290;
/// Longest wait for one page of a list (kube sets no read timeout).
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait before listing again after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Which pods serve a model, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSelector {
    /// The model its engines serve.
    pub model: String,
    /// Labels a pod must carry, all of them.
    pub labels: BTreeMap<String, String>,
    /// Their role; absent = from each engine's `/server_info`.
    pub role: Option<Role>,
    /// The engines' HTTP port.
    pub port: u16,
    /// A prefill engine's bootstrap port; absent = from `/server_info`.
    pub bootstrap_port: Option<u16>,
}

/// Where and how pods are discovered.
#[derive(Clone)]
pub struct KubernetesSettings {
    /// The API server's URL; absent = the cluster the process runs in (its service
    /// account).
    pub api_url: Option<String>,
    /// The namespace watched.
    pub namespace: String,
    /// The selectors; a pod several select joins once, for the first.
    pub selectors: Vec<PodSelector>,
    /// The InferencePools whose pods are engines, after the selectors' (a pod a
    /// selector or an earlier pool selects joins for that one).
    pub pools: Vec<InferencePoolRef>,
    /// How often everything is listed again, whatever the watches said.
    pub relist_interval: Duration,
    /// How long changes settle before they are applied.
    pub debounce: Duration,
    /// Where the InferenceObjectives naming `pools` go; `None`: they are not read.
    pub objectives: Option<ObjectiveSink>,
}

impl fmt::Debug for KubernetesSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesSettings")
            .field("api_url", &self.api_url)
            .field("namespace", &self.namespace)
            .field("selectors", &self.selectors)
            .field("pools", &self.pools)
            .field("relist_interval", &self.relist_interval)
            .field("debounce", &self.debounce)
            .field("objectives", &self.objectives.is_some())
            .finish()
    }
}

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
#[error("Kubernetes discovery: {0}")]
pub struct KubernetesError(String);

/// The discovery tasks; dropping the handle stops them (engines found stay).
#[derive(Debug)]
pub struct DiscoveryHandle(Vec<JoinHandle<()>>);

impl Drop for DiscoveryHandle {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What a pod says, for the engine it may be.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodView {
    /// The pod's IP while it is an engine (Ready, not being deleted).
    address: Option<String>,
    /// Its resource version, when numeric: an older event changes nothing.
    version: Option<u64>,
}

/// Each selector's and each pool's pods, as last listed and watched.
#[derive(Debug, Default)]
struct Observed {
    /// The pods of `selectors[s]`.
    pods: Vec<BTreeMap<String, PodView>>,
    /// The pods of `pools[p]`.
    pools: Vec<PoolPods>,
}

/// What a pool's pods are, as last listed and watched.
#[derive(Debug, Default)]
struct PoolPods {
    /// Which of the pool's selectors may write here: the last one read (a listing of
    /// an earlier one, ending as it is replaced, changes nothing).
    generation: u64,
    /// The selector `pods` were listed with; absent while the pool names no pods.
    selector: Option<PodSelector>,
    pods: BTreeMap<String, PodView>,
}

/// Where a task following pods writes them.
#[derive(Debug, Clone)]
enum Slot {
    /// `selectors[s]`.
    Selector(usize),
    /// `pools[index]` while its generation is `generation`, whose pods `selector`
    /// selects.
    Pool {
        index: usize,
        generation: u64,
        selector: PodSelector,
    },
}

impl Observed {
    /// The pods `slot` stands for, unless it is a pool's replaced selector.
    fn pods_mut(&mut self, slot: &Slot) -> Option<&mut BTreeMap<String, PodView>> {
        match slot {
            Slot::Selector(s) => self.pods.get_mut(*s),
            Slot::Pool {
                index, generation, ..
            } => self
                .pools
                .get_mut(*index)
                .filter(|pool| pool.generation == *generation)
                .map(|pool| &mut pool.pods),
        }
    }

    /// Replaces the pods of `slot` by a listing; a pool's are those of its selector
    /// from now on.
    fn listed(&mut self, slot: &Slot, pods: BTreeMap<String, PodView>) {
        if let Slot::Pool {
            index,
            generation,
            selector,
        } = slot
            && let Some(pool) = self.pools.get_mut(*index)
            && pool.generation == *generation
        {
            pool.selector = Some(selector.clone());
        }
        if let Some(slot) = self.pods_mut(slot) {
            *slot = pods;
        }
    }
}

/// Starts discovering `settings.selectors`' and `settings.pools`' pods into `fleet`.
///
/// # Errors
/// No client could be made (not in a cluster and no `api_url`, or a bad URL).
pub fn spawn_discovery(
    fleet: Arc<Fleet>,
    settings: KubernetesSettings,
) -> Result<DiscoveryHandle, KubernetesError> {
    let config = match &settings.api_url {
        Some(url) => {
            let uri = url
                .parse()
                .map_err(|e| KubernetesError(format!("api_url {url}: {e}")))?;
            let mut config = kube::Config::new(uri);
            config.default_namespace = settings.namespace.clone();
            config
        }
        None => kube::Config::incluster().map_err(|e| KubernetesError(e.to_string()))?,
    };
    // `follow` backs off itself; kube's own retries (up to 15, minutes apart) would
    // hide a failing list inside one call.
    let mut config = config;
    config.default_retry = false;
    let client = kube::Client::try_from(config).map_err(|e| KubernetesError(e.to_string()))?;
    let observed = Arc::new(Mutex::new(Observed {
        pods: vec![BTreeMap::new(); settings.selectors.len()],
        pools: settings.pools.iter().map(|_| PoolPods::default()).collect(),
    }));
    let changed = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    for (s, selector) in settings.selectors.iter().enumerate() {
        let api: Api<Pod> = Api::namespaced(client.clone(), &settings.namespace);
        tasks.push(tokio::spawn(follow(
            api,
            label_selector(&selector.labels),
            Slot::Selector(s),
            settings.relist_interval,
            Arc::clone(&observed),
            Arc::clone(&changed),
        )));
    }
    for (index, pool) in settings.pools.iter().enumerate() {
        tasks.push(tokio::spawn(pool::follow_pool(
            client.clone(),
            settings.namespace.clone(),
            pool.clone(),
            index,
            (settings.relist_interval, settings.debounce),
            Arc::clone(&observed),
            Arc::clone(&changed),
        )));
    }
    if let Some(sink) = &settings.objectives {
        tasks.push(tokio::spawn(objective::follow_objectives(
            client.clone(),
            settings.namespace.clone(),
            settings.pools.clone(),
            (settings.relist_interval, settings.debounce),
            Arc::clone(sink),
        )));
    }
    tasks.push(tokio::spawn(reconcile(
        fleet,
        settings.namespace.clone(),
        settings.selectors.clone(),
        settings.debounce,
        observed,
        changed,
    )));
    Ok(DiscoveryHandle(tasks))
}

/// `a=b,c=d`.
fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What a pod is, for discovery: its name and view.
fn view(pod: &Pod) -> Option<(String, PodView)> {
    let name = pod.metadata.name.clone()?;
    let version = pod
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok());
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let address = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .filter(|ip| !ip.is_empty() && ready && !deleting);
    Some((name, PodView { address, version }))
}

/// Lists and watches one selector's pods for ever, writing them into `observed`.
async fn follow(
    api: Api<Pod>,
    selector: String,
    slot: Slot,
    relist_interval: Duration,
    observed: Arc<Mutex<Observed>>,
    changed: Arc<Notify>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let (pods, version) = match list(&api, &selector).await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(selector, error = %e, "listing pods failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        observed.lock().listed(&slot, pods);
        changed.notify_one();
        let relist_at = Instant::now() + relist_interval;
        watch(
            &api, &selector, version, relist_at, &slot, &observed, &changed,
        )
        .await;
    }
}

/// Every pod the selector matches, and the list's resource version.
async fn list(
    api: &Api<Pod>,
    selector: &str,
) -> Result<(BTreeMap<String, PodView>, String), kube::Error> {
    let mut pods = BTreeMap::new();
    let mut params = ListParams::default().labels(selector).limit(PAGE);
    loop {
        let page = tokio::time::timeout(LIST_TIMEOUT, api.list(&params))
            .await
            .map_err(|_| kube::Error::Service("listing pods timed out".into()))??;
        pods.extend(page.items.iter().filter_map(view));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => {
                let version = page.metadata.resource_version.unwrap_or_default();
                return Ok((pods, version));
            }
        }
    }
}

/// Watches from `version` until it is time to relist (`relist_at`, a gone resource
/// version, an error); a watch the server ends is resumed where it stopped.
async fn watch(
    api: &Api<Pod>,
    selector: &str,
    mut version: String,
    relist_at: Instant,
    slot: &Slot,
    observed: &Mutex<Observed>,
    changed: &Notify,
) {
    let params = WatchParams::default()
        .labels(selector)
        .timeout(WATCH_SECONDS);
    loop {
        let started = Instant::now();
        let stream = tokio::select! {
            stream = api.watch(&params, &version) => stream,
            () = tokio::time::sleep_until(relist_at) => return,
        };
        let Ok(stream) = stream else {
            return;
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = tokio::time::sleep_until(relist_at) => return,
            };
            match event {
                Some(Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod))) => {
                    if let Some(v) = pod.metadata.resource_version.clone() {
                        version = v;
                    }
                    if let Some((name, view)) = view(&pod)
                        && let Some(pods) = observed.lock().pods_mut(slot)
                    {
                        record(pods, name, view);
                        changed.notify_one();
                    }
                }
                Some(Ok(WatchEvent::Deleted(pod))) => {
                    if let Some(v) = pod.metadata.resource_version.clone() {
                        version = v;
                    }
                    if let Some((name, view)) = view(&pod) {
                        let gone = PodView {
                            address: None,
                            ..view
                        };
                        if let Some(pods) = observed.lock().pods_mut(slot) {
                            record(pods, name, gone);
                            changed.notify_one();
                        }
                    }
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    version = bookmark.metadata.resource_version;
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    tracing::info!(selector, code = status.code, message = %status.message, "the pod watch ended: listing again");
                    return;
                }
                Some(Err(e)) => {
                    tracing::info!(selector, error = %e, "the pod watch failed: listing again");
                    return;
                }
                None => break,
            }
        }
        // The server ended the watch: resume it, at most once a second when it ends
        // at once (a server that closes every watch must not be asked in a loop).
        tokio::time::sleep_until(started + Duration::from_secs(1)).await;
    }
}

/// Records what an event says of pod `name`, unless an event of a later resource
/// version was recorded already (a deleted pod stays recorded, as no engine, until
/// the next list).
fn record(pods: &mut BTreeMap<String, PodView>, name: String, view: PodView) {
    let newer = pods
        .get(&name)
        .is_none_or(|old| match (old.version, view.version) {
            (Some(old), Some(new)) => new >= old,
            _ => true,
        });
    if newer {
        pods.insert(name, view);
    }
}

/// Applies what the pods say to the fleet, once changes settled for `debounce`.
async fn reconcile(
    fleet: Arc<Fleet>,
    namespace: String,
    selectors: Vec<PodSelector>,
    debounce: Duration,
    observed: Arc<Mutex<Observed>>,
    changed: Arc<Notify>,
) {
    let mut applied: BTreeMap<EngineId, EngineSpec> = BTreeMap::new();
    loop {
        changed.notified().await;
        // Settle: wait until `debounce` passes without a change, at most ten times
        // as long.
        let deadline = Instant::now() + debounce * 10;
        while tokio::time::timeout_at(
            (Instant::now() + debounce).min(deadline),
            changed.notified(),
        )
        .await
        .is_ok()
            && Instant::now() < deadline
        {}
        let wanted = desired(&namespace, &selectors, &observed.lock());
        for (id, spec) in &wanted {
            if applied.get(id) == Some(spec) {
                continue;
            }
            match fleet.apply(Change::Upsert(spec.clone())).await {
                Ok(_) => {
                    tracing::info!(engine = %id, url = %spec.url, model = %spec.model, "pod engine joined");
                    applied.insert(id.clone(), spec.clone());
                }
                Err(e) => tracing::warn!(engine = %id, error = %e, "pod engine could not join"),
            }
        }
        let gone: Vec<EngineId> = applied
            .keys()
            .filter(|id| !wanted.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            applied.remove(&id);
            match fleet
                .apply(Change::Remove(id.clone(), Source::Kubernetes))
                .await
            {
                Ok(_) => tracing::info!(engine = %id, "pod engine left"),
                Err(e) => tracing::debug!(engine = %id, error = %e, "pod engine already gone"),
            }
        }
    }
}

/// The engines the pods of `namespace` stand for: one per pod that is an engine, for
/// the first selector matching it (the configured selectors, then the pools' in
/// order), with the id `namespace/pod`.
fn desired(
    namespace: &str,
    selectors: &[PodSelector],
    observed: &Observed,
) -> BTreeMap<EngineId, EngineSpec> {
    let mut engines = BTreeMap::new();
    let pools = observed
        .pools
        .iter()
        .filter_map(|pool| Some((pool.selector.as_ref()?, &pool.pods)));
    for (selector, pods) in selectors.iter().zip(&observed.pods).chain(pools) {
        for (name, view) in pods {
            let Some(address) = &view.address else {
                continue;
            };
            let id = EngineId::from(format!("{namespace}/{name}"));
            if engines.contains_key(&id) {
                continue;
            }
            let host = if address.contains(':') {
                format!("[{address}]")
            } else {
                address.clone()
            };
            let mut spec = EngineSpec::new(
                id.clone(),
                format!("http://{host}:{}", selector.port),
                selector.model.as_str(),
            )
            .with_role(selector.role)
            .with_source(Source::Kubernetes);
            spec.bootstrap_port = selector.bootstrap_port;
            engines.insert(id, spec);
        }
    }
    engines
}

#[cfg(test)]
mod tests;

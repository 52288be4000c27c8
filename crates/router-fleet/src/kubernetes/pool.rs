//! Pods named by a Gateway API Inference Extension `InferencePool` (API group
//! `inference.networking.k8s.io`, version `v1`).
//!
//! A pool's `spec.selector.matchLabels` and its first `spec.targetPorts` number are
//! what a [`PodSelector`] says (the labels and the port; the role is plain), and its
//! pods are followed as a selector's are. The pool itself is listed by name, then
//! watched from the list's resource version: it is read again once the discovery's
//! debounce has passed after the watch says it changed, when the watch fails, and every relist interval. A new selector or port
//! starts a new listing of the pods, which replaces the old one's engines when it
//! arrives. A pool that is missing or malformed (no labels, more than
//! [`MAX_POOL_LABELS`], a label Kubernetes would refuse, no target port or one out of
//! range) is logged and names no engine: its engines leave. A pool that cannot be read
//! (the API server unreachable, access refused) keeps the engines it named.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use parking_lot::Mutex;
use router_state::Role;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::changes;
use super::{
    DiscoveryHandle, LIST_TIMEOUT, MAX_BACKOFF, Observed, PodSelector, Slot, follow, label_selector,
};

/// The most labels a pool's selector may name (the InferencePool API's own bound).
const MAX_POOL_LABELS: usize = 64;
/// The longest label key (a 253-byte DNS prefix, `/`, a 63-byte name, as the API
/// server bounds the prefix and the name apart; this bound is the looser sum).
const MAX_LABEL_KEY: usize = 317;
/// The longest label value.
const MAX_LABEL_VALUE: usize = 63;

/// An InferencePool whose pods are one model's plain engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferencePoolRef {
    /// The model its engines serve.
    pub model: String,
    /// The InferencePool's name, in the discovery's namespace.
    pub name: String,
}

/// `inferencepools` of `inference.networking.k8s.io/v1`.
fn resource() -> ApiResource {
    ApiResource {
        group: "inference.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "inference.networking.k8s.io/v1".into(),
        kind: "InferencePool".into(),
        plural: "inferencepools".into(),
    }
}

/// What a pool says of its engines: the labels their pods carry, and their port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    labels: BTreeMap<String, String>,
    port: u16,
}

/// What `pool`'s spec says of its engines, or why it says nothing usable.
fn target(pool: &DynamicObject) -> Result<Target, String> {
    let spec = pool.data.get("spec");
    let selector = spec
        .and_then(|s| s.get("selector"))
        .and_then(|s| s.as_object())
        .ok_or("it has no spec.selector")?;
    if selector.keys().any(|k| k != "matchLabels") {
        return Err("spec.selector has more than matchLabels".into());
    }
    let labels = selector
        .get("matchLabels")
        .and_then(|m| m.as_object())
        .ok_or("it has no spec.selector.matchLabels")?;
    if labels.is_empty() {
        return Err("spec.selector.matchLabels is empty (it would select every pod)".into());
    }
    if labels.len() > MAX_POOL_LABELS {
        return Err(format!(
            "spec.selector.matchLabels has {} labels, more than {MAX_POOL_LABELS}",
            labels.len()
        ));
    }
    let mut selected = BTreeMap::new();
    for (key, value) in labels {
        let value = value
            .as_str()
            .filter(|v| {
                router_state::is_label_part(key, MAX_LABEL_KEY, true)
                    && router_state::is_label_part(v, MAX_LABEL_VALUE, false)
            })
            .ok_or("spec.selector.matchLabels has an entry that is not a Kubernetes label")?;
        selected.insert(key.clone(), value.to_owned());
    }
    let port = spec
        .and_then(|s| s.get("targetPorts"))
        .and_then(|p| p.as_array())
        .and_then(|p| p.first())
        .ok_or("it has no spec.targetPorts")?;
    let port = port
        .get("number")
        .and_then(|n| n.as_u64())
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| *n != 0)
        .ok_or("spec.targetPorts[0].number is not a port (1 to 65535)")?;
    Ok(Target {
        labels: selected,
        port,
    })
}

/// One pool's state: the target it follows, the task following its pods.
struct Follower {
    pool: InferencePoolRef,
    index: usize,
    pods: Api<Pod>,
    relist_interval: Duration,
    observed: Arc<Mutex<Observed>>,
    changed: Arc<Notify>,
    /// The target whose pods are followed; absent while the pool names none.
    current: Option<Target>,
    /// Why the pool names no engine, as last logged.
    problem: Option<String>,
    /// Lists and watches `current`'s pods.
    task: Option<DiscoveryHandle>,
}

impl Follower {
    /// Follows what the pool says now: the pods of a new target (its listing
    /// replaces the old target's engines), or none (they leave at once).
    fn update(&mut self, found: Result<Target, String>) {
        let name = &self.pool.name;
        match &found {
            Err(problem) if self.problem.as_ref() != Some(problem) => {
                tracing::warn!(pool = %name, model = %self.pool.model, problem = %problem, "the InferencePool names no engines");
            }
            Ok(_) if self.problem.is_some() => {
                tracing::info!(pool = %name, "the InferencePool names engines again");
            }
            _ => {}
        }
        self.problem = found.as_ref().err().cloned();
        let target = found.ok();
        if target == self.current {
            return;
        }
        self.current.clone_from(&target);
        // The old target's listing and watch end; what they would still write is
        // of an earlier generation and changes nothing.
        self.task = None;
        let generation = {
            let mut observed = self.observed.lock();
            let Some(slot) = observed.pools.get_mut(self.index) else {
                return;
            };
            slot.generation += 1;
            if target.is_none() {
                slot.selector = None;
                slot.pods.clear();
            }
            slot.generation
        };
        let Some(Target { labels, port }) = target else {
            self.changed.notify_one();
            return;
        };
        let selector = label_selector(&labels);
        tracing::info!(pool = %name, selector, port, "following the InferencePool's pods");
        let slot = Slot::Pool {
            index: self.index,
            generation,
            selector: PodSelector {
                model: self.pool.model.clone(),
                labels,
                role: Some(Role::Plain),
                port,
                bootstrap_port: None,
            },
        };
        self.task = Some(DiscoveryHandle(vec![tokio::spawn(follow(
            self.pods.clone(),
            selector,
            slot,
            self.relist_interval,
            Arc::clone(&self.observed),
            Arc::clone(&self.changed),
        ))]));
    }
}

/// Reads pool `pool` (the `index`th) for ever and follows the pods it names into
/// `observed`. A change the watch tells of is read `settle` after it, so a burst
/// (a controller writing the pool's status) is read once.
pub(super) async fn follow_pool(
    client: kube::Client,
    namespace: String,
    pool: InferencePoolRef,
    index: usize,
    (relist_interval, settle): (Duration, Duration),
    observed: Arc<Mutex<Observed>>,
    changed: Arc<Notify>,
) {
    let pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource());
    let mut follower = Follower {
        pool,
        index,
        pods: Api::namespaced(client, &namespace),
        relist_interval,
        observed,
        changed,
        current: None,
        problem: None,
        task: None,
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        let name = follower.pool.name.clone();
        let (object, version) = match read(&pools, &name).await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(pool = %name, error = %e, "reading the InferencePool failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        follower.update(
            object
                .as_ref()
                .map_or_else(|| Err("it does not exist".to_owned()), target),
        );
        let relist_at = Instant::now() + relist_interval;
        let fields = format!("metadata.name={name}");
        let what = format!("InferencePool {name}");
        let wake = changes::changed(&pools, Some(&fields), version, relist_at, &what).await;
        changes::pause(wake, &mut backoff, settle).await;
    }
}

/// Pool `name`, if it exists, and the resource version to watch it from (absent
/// when the API server serves no InferencePools, or names no version).
async fn read(
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<(Option<DynamicObject>, Option<String>), kube::Error> {
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    let listed = tokio::time::timeout(LIST_TIMEOUT, api.list(&params))
        .await
        .map_err(|_| kube::Error::Service("listing the InferencePool timed out".into()))?;
    match listed {
        Ok(list) => {
            let object = list
                .items
                .into_iter()
                .find(|o| o.metadata.name.as_deref() == Some(name));
            // Without a version to watch from, the pool is read again at the relist.
            let version = list.metadata.resource_version.filter(|v| !v.is_empty());
            Ok((object, version))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok((None, None)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(spec: serde_json::Value) -> DynamicObject {
        DynamicObject::new("p", &resource()).data(json!({ "spec": spec }))
    }

    #[test]
    fn a_pools_selector_and_first_target_port_are_its_engines() {
        let found = target(&pool(json!({
            "selector": {"matchLabels": {"app": "vllm", "example.com/tier": ""}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "switchyard", "port": {"number": 9002}},
        })));
        assert_eq!(
            found,
            Ok(Target {
                labels: BTreeMap::from([
                    ("app".into(), "vllm".into()),
                    ("example.com/tier".into(), String::new()),
                ]),
                port: 8000,
            })
        );
    }

    #[test]
    fn a_malformed_pool_says_why_and_names_nothing() {
        let many: serde_json::Map<String, serde_json::Value> = (0..=MAX_POOL_LABELS)
            .map(|n| (format!("l{n}"), json!("v")))
            .collect();
        let at = |port: serde_json::Value| json!({"selector": {"matchLabels": {"app": "a"}}, "targetPorts": [{"number": port}]});
        let labels = |labels: serde_json::Value| json!({"selector": {"matchLabels": labels}, "targetPorts": [{"number": 1}]});
        for (spec, why) in [
            (json!(null), "it has no spec.selector"),
            (
                json!({"targetPorts": [{"number": 1}]}),
                "it has no spec.selector",
            ),
            (
                json!({"selector": {}, "targetPorts": [{"number": 1}]}),
                "it has no spec.selector.matchLabels",
            ),
            (
                json!({"selector": {"matchLabels": {"app": "a"}, "matchExpressions": []}, "targetPorts": [{"number": 1}]}),
                "spec.selector has more than matchLabels",
            ),
            (labels(json!({})), "spec.selector.matchLabels is empty"),
            (
                labels(json!(many)),
                "spec.selector.matchLabels has 65 labels, more than 64",
            ),
            (labels(json!({"app": 1})), "not a Kubernetes label"),
            (labels(json!({"app": "a,b=c"})), "not a Kubernetes label"),
            (labels(json!({"a!": "b"})), "not a Kubernetes label"),
            (
                labels(json!({"app": "v".repeat(64)})),
                "not a Kubernetes label",
            ),
            (labels(json!({"": "v"})), "not a Kubernetes label"),
            (
                json!({"selector": {"matchLabels": {"app": "a"}}}),
                "it has no spec.targetPorts",
            ),
            (
                json!({"selector": {"matchLabels": {"app": "a"}}, "targetPorts": []}),
                "it has no spec.targetPorts",
            ),
            (at(json!(0)), "is not a port"),
            (at(json!(65_536)), "is not a port"),
            (at(json!(-1)), "is not a port"),
            (at(json!("8000")), "is not a port"),
            (at(json!(80.5)), "is not a port"),
        ] {
            let found = target(&pool(spec.clone()));
            assert!(
                found.as_ref().is_err_and(|e| e.contains(why)),
                "{spec}: {found:?}, expected {why:?}"
            );
        }
        assert_eq!(
            target(&DynamicObject::new("p", &resource())),
            Err("it has no spec.selector".into()),
            "no spec at all"
        );
        assert!(target(&pool(at(json!(65_535)))).is_ok());
    }
}

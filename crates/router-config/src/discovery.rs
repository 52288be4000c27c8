//! The `discovery` section: engines found as Kubernetes pods (feature `kubernetes`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::flow::PriorityOrder;
use crate::{ConfigError, EngineRole, MAX_MS, ModelConfig};

/// The longest InferencePool name (a DNS subdomain, as Kubernetes names objects).
const MAX_POOL_NAME: usize = 253;

/// Sources of engines besides the file and the admin API.
///
/// ```yaml
/// discovery:
///   kubernetes:
///     namespace: llm
///     models:
///       - {model: qwen3, selector: {app: sglang}, role: plain, port: 30000}
///     pools:
///       - {model: llama, name: llama-pool}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Engines as the pods of a Kubernetes namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
}

/// Kubernetes pod discovery: which pods are which model's engines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The namespace whose pods are watched.
    pub namespace: String,
    /// The API server; absent = the cluster the router runs in (its service account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// Every pod is listed again this often, whatever the watch said, in
    /// milliseconds (a missed event is healed by then).
    #[serde(default = "default_relist")]
    pub relist_interval_ms: u64,
    /// Changes are applied once this long passed without another, in milliseconds.
    #[serde(default = "default_debounce")]
    pub debounce_ms: u64,
    /// Which pods serve which model of `models`, by label selector.
    #[serde(default)]
    pub models: Vec<KubernetesModel>,
    /// Which pods serve which model of `models`, as a Gateway API Inference
    /// Extension `InferencePool` of the namespace names them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<KubernetesPool>,
    /// Reads the namespace's `InferenceObjective`s (API group
    /// `inference.networking.x-k8s.io`, version `v1alpha2`) that name one of `pools`:
    /// a request to the pool's model whose `flow.priority.header` names one takes its
    /// priority (higher first; unset is 0). Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub objectives: bool,
}

/// The pods of one model (and role).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KubernetesModel {
    /// A model of `models`: its buckets and policies route the pods' engines, which
    /// join the groups that list no `engine_ids`.
    pub model: String,
    /// Labels a pod must carry (all of them).
    pub selector: BTreeMap<String, String>,
    /// The engines' role; absent = from each engine's `/server_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<EngineRole>,
    /// The engines' HTTP port.
    pub port: u16,
    /// A prefill engine's bootstrap port; absent = from `/server_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
}

/// The pods of one model as an `InferencePool` (API group
/// `inference.networking.k8s.io`, version `v1`) names them: those its
/// `spec.selector.matchLabels` select, each a plain engine on its first
/// `spec.targetPorts` number. The pool is read again at every relist and when it
/// changes; while it is missing or malformed it names no engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KubernetesPool {
    /// A model of `models`: its buckets and policies route the pool's engines, which
    /// join the groups that list no `engine_ids`.
    pub model: String,
    /// The InferencePool's name, in the section's `namespace`.
    pub name: String,
}

fn default_relist() -> u64 {
    60_000
}
fn default_debounce() -> u64 {
    500
}

impl DiscoveryConfig {
    pub(crate) fn validate(&self, models: &[&str], errors: &mut Vec<ConfigError>) {
        let Self { kubernetes } = self;
        let Some(KubernetesConfig {
            namespace,
            api_url,
            relist_interval_ms,
            debounce_ms,
            models: pods,
            pools,
            objectives,
        }) = kubernetes
        else {
            return;
        };
        if *objectives && pools.is_empty() {
            errors.push(ConfigError::at(
                "discovery.kubernetes.objectives",
                "reads the InferenceObjectives of `pools`, which names none",
            ));
        }
        if !cfg!(feature = "kubernetes") {
            errors.push(ConfigError::at(
                "discovery.kubernetes",
                "this build has no Kubernetes discovery (cargo feature kubernetes)",
            ));
        }
        if !dns_label(namespace) {
            errors.push(ConfigError::at(
                "discovery.kubernetes.namespace",
                "must be a DNS label: 1 to 63 lowercase letters, digits and '-'",
            ));
        }
        if let Some(url) = api_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            errors.push(ConfigError::at(
                "discovery.kubernetes.api_url",
                "must start with http:// or https://",
            ));
        }
        if !(1_000..=MAX_MS).contains(relist_interval_ms) {
            errors.push(ConfigError::at(
                "discovery.kubernetes.relist_interval_ms",
                format_args!("must be 1000 to {MAX_MS}"),
            ));
        }
        if *debounce_ms > 60_000 {
            errors.push(ConfigError::at(
                "discovery.kubernetes.debounce_ms",
                "must be at most 60000",
            ));
        }
        if pods.is_empty() && pools.is_empty() {
            errors.push(ConfigError::at(
                "discovery.kubernetes.models",
                "must name at least one model's pods (or `pools` an InferencePool)",
            ));
        }
        for (m, pod) in pods.iter().enumerate() {
            pod.validate(m, models, errors);
        }
        for (p, pool) in pools.iter().enumerate() {
            pool.validate(p, models, errors);
            if pools[..p].iter().any(|other| other.name == pool.name) {
                errors.push(ConfigError::at(
                    format!("discovery.kubernetes.pools[{p}].name"),
                    format_args!("pool {:?} is named twice", pool.name),
                ));
            }
            // A model's pods are described one way: a pod a selector and a pool both
            // select would join once, with the first one's port and role, and which
            // one that is would be an accident of the order.
            if pods.iter().any(|pod| pod.model == pool.model) {
                errors.push(ConfigError::at(
                    format!("discovery.kubernetes.pools[{p}].model"),
                    format_args!(
                        "model {:?} is in `models` too: name its pods by selectors or by pools, not both",
                        pool.model
                    ),
                ));
            }
        }
    }
}

impl DiscoveryConfig {
    /// With `discovery.kubernetes.objectives`, each pool's model reads an objective's
    /// name from a header, orders priorities as InferenceObjectives do (higher
    /// first), and has a queue with bands for them to order.
    pub(crate) fn validate_objectives(
        &self,
        models: &[ModelConfig],
        errors: &mut Vec<ConfigError>,
    ) {
        let Some(kubernetes) = self.kubernetes.as_ref().filter(|k| k.objectives) else {
            return;
        };
        for (m, model) in models.iter().enumerate() {
            if !kubernetes.pools.iter().any(|pool| pool.model == model.id) {
                continue;
            }
            let at = |field: &str| format!("models[{m}].flow.{field}");
            let why = "discovery.kubernetes.objectives reads the model's InferenceObjectives";
            let flow = &model.flow;
            if flow.priority.header.is_none() {
                errors.push(ConfigError::at(
                    at("priority.header"),
                    format_args!("must name the header that carries an objective's name (x-gateway-inference-objective): {why}"),
                ));
            }
            if flow.priority.order != PriorityOrder::HigherFirst {
                errors.push(ConfigError::at(
                    at("priority.order"),
                    format_args!(
                        "must be higher_first, as InferenceObjectives' priorities are: {why}"
                    ),
                ));
            }
            if flow.priority.bands.is_empty() || flow.queue.is_none() {
                errors.push(ConfigError::at(
                    at("queue"),
                    format_args!(
                        "needs a queue and priority.bands for priorities to order anything: {why}"
                    ),
                ));
            }
        }
    }
}

impl KubernetesPool {
    /// `discovery.kubernetes.pools[p]`: a model of `models` and a name Kubernetes
    /// can give an object.
    fn validate(&self, p: usize, models: &[&str], errors: &mut Vec<ConfigError>) {
        let KubernetesPool { model, name } = self;
        let at = |field: &str| format!("discovery.kubernetes.pools[{p}].{field}");
        if !models.contains(&model.as_str()) {
            errors.push(ConfigError::at(at("model"), "must be a model of `models`"));
        }
        if !dns_subdomain(name) {
            errors.push(ConfigError::at(
                at("name"),
                format_args!(
                    "must be a DNS subdomain: 1 to {MAX_POOL_NAME} lowercase letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit"
                ),
            ));
        }
    }
}

impl KubernetesModel {
    /// The pods of `discovery.kubernetes.models[m]`: a model of `models`, a selector
    /// of real labels that names at least one, real ports.
    fn validate(&self, m: usize, models: &[&str], errors: &mut Vec<ConfigError>) {
        let KubernetesModel {
            model,
            selector,
            // Any role; absent = from each engine's `/server_info`.
            role: _,
            port,
            bootstrap_port,
        } = self;
        let at = |field: &str| format!("discovery.kubernetes.models[{m}].{field}");
        if !models.contains(&model.as_str()) {
            errors.push(ConfigError::at(at("model"), "must be a model of `models`"));
        }
        if selector.is_empty() {
            errors.push(ConfigError::at(
                at("selector"),
                "must name at least one label (an empty selector is every pod)",
            ));
        }
        for (key, value) in selector {
            if !router_state::is_label_part(key, 253, true)
                || !router_state::is_label_part(value, 63, false)
            {
                errors.push(ConfigError::at(
                    at("selector"),
                    format_args!("`{key}: {value}` is not a Kubernetes label"),
                ));
            }
        }
        if *port == 0 || *bootstrap_port == Some(0) {
            errors.push(ConfigError::at(at("port"), "ports must be 1 to 65535"));
        }
    }
}

fn dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A DNS-1123 subdomain, as Kubernetes names most objects: dot-separated DNS labels
/// (lowercase letters, digits and '-', starting and ending with a letter or digit),
/// at most [`MAX_POOL_NAME`] bytes in all.
fn dns_subdomain(name: &str) -> bool {
    (1..=MAX_POOL_NAME).contains(&name.len())
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

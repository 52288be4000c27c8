//! A model's `flow` section: what happens to a request that finds every fitting
//! engine full (a bounded queue with a deadline, or 503 at once), the priority bands
//! it waits in, and the tenants that share the model fairly, each within its own cap.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use router_state::check_name;

/// The longest a request may wait in a queue, in milliseconds (ten minutes).
pub(crate) const MAX_WAIT_MS: u64 = 600_000;
/// The most requests one model's queue may hold.
pub(crate) const MAX_QUEUED: usize = 1 << 16;
/// The most priority bands (boundaries plus one).
pub(crate) const MAX_BANDS: usize = 8;
/// The largest tenant weight.
pub(crate) const MAX_WEIGHT: u32 = 1000;
/// The most objectives a priority header may name.
pub(crate) const MAX_OBJECTIVES: usize = 256;
/// The most tenants counted by name; past it, new tenants share one count.
pub(crate) const MAX_TRACKED_TENANTS: usize = 1 << 16;
/// The most bytes of a tenant's name (a header's value, or the API key's digest).
pub const MAX_TENANT_BYTES: usize = 128;

/// Flow control of one model. By default there is no queue (a request that finds
/// every fitting bucket full gets 503 at once, as before), every request is in one
/// band and there are no tenants.
///
/// ```yaml
/// flow:
///   queue: {max_wait_ms: 2000, max_queued: 1024}
///   priority: {header: x-priority, bands: [1]}
///   tenants: {header: x-tenant, weights: {batch: 1, chat: 3}, max_inflight: {batch: 32}}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowConfig {
    /// The queue a request waits in when every fitting bucket is full; absent, it gets
    /// 503 at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueConfig>,
    /// How a request's priority is read and which band it waits in.
    #[serde(default)]
    pub priority: PriorityConfig,
    /// Who a request belongs to, each tenant's share of a saturated model and its cap;
    /// absent, every request is one tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<TenantsConfig>,
}

/// The model's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// The longest a request waits for capacity, in milliseconds; past it, 503 with
    /// `Retry-After`.
    pub max_wait_ms: u64,
    /// The most requests waiting at once; one more gets 503 with `Retry-After`.
    #[serde(default = "default_max_queued")]
    pub max_queued: usize,
}

fn default_max_queued() -> usize {
    1024
}

/// A request's priority: the body's `priority` field (which SGLang and vLLM read), or
/// a header that wins over it, mapped to bands by boundaries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriorityConfig {
    /// A header whose integer value is the priority, read before the body's field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Which values come first: `higher_first` (SGLang's default) or `lower_first`
    /// (vLLM's, and SGLang's `--schedule-low-priority-values-first`).
    #[serde(default)]
    pub order: PriorityOrder,
    /// Band boundaries, most urgent first: a request is in the first band whose
    /// boundary its priority reaches (is at least, or at most with `lower_first`),
    /// else in the last band (a request without a priority is 0). `[]` (the default)
    /// makes one band: a priority orders nothing until the operator sets boundaries,
    /// so no client can move ahead by sending one. `[1]` makes two bands: priority 1
    /// and more first, the rest after.
    #[serde(default)]
    pub bands: Vec<i64>,
    /// Grants a waiting band may see go to more urgent bands in a row before it is
    /// served once: no band starves, whatever arrives above it.
    #[serde(default = "default_starvation_limit")]
    pub starvation_limit: u32,
    /// Names the header may carry instead of an integer, each with its priority. A
    /// Gateway API inference gateway's clients name an objective in
    /// `x-gateway-inference-objective`, whose `InferenceObjective` gives it a priority:
    /// `{header: x-gateway-inference-objective, objectives: {chat: 10, batch: -10}}`
    /// repeats those priorities here (`discovery.kubernetes.objectives` reads them
    /// from the cluster instead; a name listed here wins). A name not listed is a
    /// 400, as a header that is not an integer is, unless the model's objectives are
    /// read from the cluster, where one may come or go at any time: there it is no
    /// priority (0), as the Inference Extension's own picker takes it, and the
    /// body's `priority` orders nothing.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub objectives: BTreeMap<String, i64>,
    /// Writes a priority read from the header into the body's `priority` field, for
    /// engines scheduling by priority (vLLM refuses a non-zero priority unless it
    /// schedules by priority, so this is off by default). A priority the body sent is
    /// forwarded as it is either way.
    #[serde(default)]
    pub forward: bool,
}

fn default_starvation_limit() -> u32 {
    16
}

impl Default for PriorityConfig {
    fn default() -> Self {
        Self {
            header: None,
            order: PriorityOrder::default(),
            bands: Vec::new(),
            starvation_limit: default_starvation_limit(),
            objectives: BTreeMap::new(),
            forward: false,
        }
    }
}

impl PriorityConfig {
    /// The band of a request of `priority` (0 is the most urgent).
    pub fn band(&self, priority: i64) -> u8 {
        let reaches = |boundary: &i64| match self.order {
            PriorityOrder::HigherFirst => priority >= *boundary,
            PriorityOrder::LowerFirst => priority <= *boundary,
        };
        let band = self
            .bands
            .iter()
            .position(reaches)
            .unwrap_or(self.bands.len());
        u8::try_from(band).unwrap_or(u8::MAX)
    }

    /// How many bands the boundaries make.
    pub fn band_count(&self) -> u8 {
        u8::try_from(self.bands.len() + 1).unwrap_or(u8::MAX)
    }
}

/// Which priority values are served first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PriorityOrder {
    /// Larger values first.
    #[default]
    HigherFirst,
    /// Smaller values first.
    LowerFirst,
}

/// Tenants of a model: read from a header, or from the API key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantsConfig {
    /// A header whose value names the tenant (printable ASCII, at most 128 bytes; a
    /// request without it is the tenant `anonymous`). Set this or `api_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The tenant is a digest of the `Authorization` bearer token: `key-` and 16 hex
    /// digits of its SHA-256, so keys never reach labels or logs (a request without
    /// one is `anonymous`). Set this or `header`.
    #[serde(default)]
    pub api_key: bool,
    /// Each named tenant's share of a saturated model, relative to the others
    /// waiting (1 to 1000).
    #[serde(default)]
    pub weights: BTreeMap<String, u32>,
    /// The weight of a tenant not named in `weights`.
    #[serde(default = "default_weight")]
    pub default_weight: u32,
    /// Requests each named tenant may have in flight; past it, 429.
    #[serde(default)]
    pub max_inflight: BTreeMap<String, u64>,
    /// Requests a tenant not named in `max_inflight` may have in flight; absent,
    /// no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_max_inflight: Option<u64>,
    /// The most tenants counted by name at once; further ones share one count, the
    /// tenant `other`, which also stands for unnamed tenants in metrics.
    #[serde(default = "default_max_tracked")]
    pub max_tracked: usize,
}

fn default_weight() -> u32 {
    1
}

fn default_max_tracked() -> usize {
    1024
}

impl TenantsConfig {
    /// The weight of `tenant`.
    pub fn weight(&self, tenant: &str) -> u32 {
        self.weights
            .get(tenant)
            .copied()
            .unwrap_or(self.default_weight)
    }

    /// The in-flight cap of `tenant`, if it has one.
    pub fn cap(&self, tenant: &str) -> Option<u64> {
        self.max_inflight
            .get(tenant)
            .copied()
            .or(self.default_max_inflight)
    }
}

impl FlowConfig {
    /// Each problem of the section, as `(field, problem)` under `flow`.
    pub(crate) fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, text: String| problems.push((field.to_owned(), text));
        if let Some(queue) = &self.queue {
            if !(1..=MAX_WAIT_MS).contains(&queue.max_wait_ms) {
                problem(
                    "queue.max_wait_ms",
                    format!("must be between 1 and {MAX_WAIT_MS}"),
                );
            }
            if !(1..=MAX_QUEUED).contains(&queue.max_queued) {
                problem(
                    "queue.max_queued",
                    format!("must be between 1 and {MAX_QUEUED}"),
                );
            }
        }
        let priority = &self.priority;
        if let Some(header) = &priority.header
            && http_header_name(header).is_err()
        {
            problem("priority.header", "must be a valid header name".to_owned());
        }
        if priority.bands.len() >= MAX_BANDS {
            problem(
                "priority.bands",
                format!("at most {} boundaries ({MAX_BANDS} bands)", MAX_BANDS - 1),
            );
        }
        let ordered = priority.bands.windows(2).all(|w| match priority.order {
            PriorityOrder::HigherFirst => w[0] > w[1],
            PriorityOrder::LowerFirst => w[0] < w[1],
        });
        if !ordered {
            problem(
                "priority.bands",
                "boundaries must go from the most urgent, without repeats".to_owned(),
            );
        }
        if priority.starvation_limit == 0 {
            problem("priority.starvation_limit", "must be at least 1".to_owned());
        }
        if priority.objectives.len() > MAX_OBJECTIVES {
            problem(
                "priority.objectives",
                format!("at most {MAX_OBJECTIVES} objectives"),
            );
        }
        if !priority.objectives.is_empty() && priority.header.is_none() {
            problem(
                "priority.objectives",
                "name the header that carries them (priority.header)".to_owned(),
            );
        }
        for name in priority.objectives.keys() {
            if let Err(e) = check_name(name) {
                problem(&format!("priority.objectives.{name}"), e.to_string());
            }
        }
        if let Some(tenants) = &self.tenants {
            tenant_problems(tenants, &mut problem);
        }
        problems
    }
}

fn tenant_problems(tenants: &TenantsConfig, problem: &mut impl FnMut(&str, String)) {
    match (&tenants.header, tenants.api_key) {
        (Some(header), false) if http_header_name(header).is_err() => {
            problem("tenants.header", "must be a valid header name".to_owned());
        }
        (Some(_), false) | (None, true) => {}
        _ => problem(
            "tenants",
            "set exactly one of `header` and `api_key`".to_owned(),
        ),
    }
    let weights = tenants
        .weights
        .iter()
        .map(|(name, weight)| (format!("tenants.weights.{name}"), *weight))
        .chain([("tenants.default_weight".to_owned(), tenants.default_weight)]);
    for (field, weight) in weights {
        if !(1..=MAX_WEIGHT).contains(&weight) {
            problem(&field, format!("must be between 1 and {MAX_WEIGHT}"));
        }
    }
    let caps = tenants
        .max_inflight
        .iter()
        .map(|(name, cap)| (format!("tenants.max_inflight.{name}"), Some(*cap)))
        .chain([(
            "tenants.default_max_inflight".to_owned(),
            tenants.default_max_inflight,
        )]);
    for (field, cap) in caps {
        if cap == Some(0) {
            problem(
                &field,
                "must be at least 1: a cap of 0 admits nothing".to_owned(),
            );
        }
    }
    for name in tenants.weights.keys().chain(tenants.max_inflight.keys()) {
        if let Err(e) = check_tenant(name) {
            problem(&format!("tenants.{name}"), e);
        }
    }
    if !(1..=MAX_TRACKED_TENANTS).contains(&tenants.max_tracked) {
        problem(
            "tenants.max_tracked",
            format!("must be between 1 and {MAX_TRACKED_TENANTS}"),
        );
    }
}

/// Checks a tenant name: 1 to [`MAX_TENANT_BYTES`] bytes that may reach a metric
/// label as they are (`router_state::check_name`).
///
/// # Errors
/// What is wrong with it.
pub fn check_tenant(name: &str) -> Result<(), String> {
    if name.len() > MAX_TENANT_BYTES {
        return Err(format!(
            "a tenant name has at most {MAX_TENANT_BYTES} bytes"
        ));
    }
    check_name(name).map_err(|e| e.to_string())
}

fn http_header_name(name: &str) -> Result<(), ()> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if valid { Ok(()) } else { Err(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> FlowConfig {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn the_default_has_no_queue_and_one_band_whatever_the_priority() {
        let flow = FlowConfig::default();
        assert!(flow.queue.is_none() && flow.tenants.is_none());
        assert_eq!(flow.priority.band_count(), 1);
        assert_eq!([5, 1, 0, -3].map(|p| flow.priority.band(p)), [0, 0, 0, 0]);
        assert!(flow.problems().is_empty());
        let two = parse("priority: {bands: [1]}");
        assert_eq!([5, 1, 0, -3].map(|p| two.priority.band(p)), [0, 0, 1, 1]);
    }

    #[test]
    fn lower_first_bands_count_down() {
        let flow = parse("priority: {order: lower_first, bands: [-1, 0]}");
        assert_eq!([-5, -1, 0, 7].map(|p| flow.priority.band(p)), [0, 0, 1, 2]);
        assert!(flow.problems().is_empty());
    }

    #[test]
    fn every_bound_is_checked_with_its_path() {
        let flow = parse(
            "queue: {max_wait_ms: 0, max_queued: 0}\n\
             priority: {header: 'X Bad', bands: [0, 1], starvation_limit: 0, objectives: {'a b': 1}}\n\
             tenants: {header: 'Bad Header', weights: {a: 0}, default_weight: 1001, \
             max_inflight: {'b c': 0}, max_tracked: 0}",
        );
        let fields: Vec<String> = flow.problems().into_iter().map(|(f, _)| f).collect();
        for field in [
            "queue.max_wait_ms",
            "queue.max_queued",
            "priority.header",
            "priority.bands",
            "priority.starvation_limit",
            "priority.objectives.a b",
            "tenants.header",
            "tenants.weights.a",
            "tenants.default_weight",
            "tenants.max_inflight.b c",
            "tenants.b c",
            "tenants.max_tracked",
        ] {
            assert!(fields.iter().any(|f| f == field), "{field} in {fields:?}");
        }
    }

    #[test]
    fn tenants_weigh_and_cap_by_name_or_default() {
        let flow = parse(
            "tenants: {api_key: true, weights: {a: 3}, max_inflight: {a: 2}, default_max_inflight: 8}",
        );
        let tenants = flow.tenants.unwrap();
        assert!(tenants.api_key);
        assert_eq!((tenants.weight("a"), tenants.weight("b")), (3, 1));
        assert_eq!((tenants.cap("a"), tenants.cap("b")), (Some(2), Some(8)));
    }
}

//! The Gateway API Inference Extension's `InferenceObjective`s (API group
//! `inference.networking.x-k8s.io`, version `v1alpha2`) that name one of the
//! discovery's pools: each gives requests that name it (by its object name, in the
//! gateway's `x-gateway-inference-objective` header) a priority.
//!
//! The namespace's objectives are listed (a page at a time), then watched from the
//! list's resource version: any change the watch tells of lists them all again once
//! the discovery's debounce has passed (they change rarely, and a burst is listed
//! once), as do a failed watch (after a backoff) and every relist interval.
//! Each listing makes an [`ObjectiveTable`]: an entry for every pool's model, holding
//! the objectives whose `spec.poolRef` names that pool (by name; its group and kind
//! absent or an InferencePool's) and their `spec.priority` (absent: 0). An objective
//! whose priority is not a 64-bit integer, whose name is longer than
//! [`MAX_OBJECTIVE_NAME`] or that has no pool reference is logged and left out; a
//! model keeps at most [`MAX_OBJECTIVES_PER_MODEL`] objectives, the first by name.
//! The sink is told the table after the first listing and whenever it changes. An API
//! server that serves no objectives (their API is not installed) lists none until it
//! does; one that cannot be read (unreachable, access refused) keeps the table last
//! told.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::serde_json::Value;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use tokio::time::Instant;

use super::changes;
use super::{InferencePoolRef, LIST_TIMEOUT, MAX_BACKOFF, ObjectiveSink, ObjectiveTable, PAGE};

/// The most objectives kept for one model (the router's memory is not the
/// cluster's to fill): beyond, the first by name.
pub(super) const MAX_OBJECTIVES_PER_MODEL: usize = 1_024;
/// The longest objective name kept, in bytes (a Kubernetes object name's bound).
pub(super) const MAX_OBJECTIVE_NAME: usize = 253;
/// The most ignored objectives remembered as logged (each is logged once, until
/// what is wrong with it changes); beyond, one is logged at every listing.
const MAX_REMEMBERED_PROBLEMS: usize = 1_024;
/// The API group of the pools an objective names when its `poolRef` names none.
const POOL_GROUP: &str = "inference.networking.k8s.io";
/// The kind of the pools an objective names when its `poolRef` names none.
const POOL_KIND: &str = "InferencePool";

/// `inferenceobjectives` of `inference.networking.x-k8s.io/v1alpha2`.
fn resource() -> ApiResource {
    ApiResource {
        group: "inference.networking.x-k8s.io".into(),
        version: "v1alpha2".into(),
        api_version: "inference.networking.x-k8s.io/v1alpha2".into(),
        kind: "InferenceObjective".into(),
        plural: "inferenceobjectives".into(),
    }
}

/// The name of the pool `spec.poolRef` names, absent when it names something other
/// than an InferencePool of the default group; or why it names nothing.
fn pool_named(spec: Option<&Value>) -> Result<Option<&str>, String> {
    let pool_ref = spec
        .and_then(|s| s.get("poolRef"))
        .and_then(Value::as_object)
        .ok_or("it has no spec.poolRef")?;
    let name = pool_ref
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("spec.poolRef has no name")?;
    let defaulted = |field: &str, default: &str| match pool_ref.get(field) {
        None | Some(Value::Null) => true,
        Some(value) => value.as_str() == Some(default),
    };
    Ok((defaulted("group", POOL_GROUP) && defaulted("kind", POOL_KIND)).then_some(name))
}

/// The priority `spec.priority` gives (absent: 0), or why it gives none.
fn priority(spec: Option<&Value>) -> Result<i64, String> {
    match spec.and_then(|s| s.get("priority")) {
        None | Some(Value::Null) => Ok(0),
        Some(priority) => priority
            .as_i64()
            .ok_or_else(|| "spec.priority is not a 64-bit integer".to_owned()),
    }
}

/// `name` as logged: at most [`MAX_OBJECTIVE_NAME`] bytes of it.
fn shown(name: &str) -> String {
    if name.len() <= MAX_OBJECTIVE_NAME {
        return name.to_owned();
    }
    format!("{}…", &name[..name.floor_char_boundary(MAX_OBJECTIVE_NAME)])
}

/// What one listing of the objectives makes.
#[derive(Debug)]
struct Reading<'p> {
    /// The discovery's pools.
    pools: &'p [InferencePoolRef],
    /// Each pool's model's objectives kept so far.
    table: ObjectiveTable,
    /// How many objectives each model's pools have, the ones beyond the bound too.
    named: BTreeMap<String, usize>,
    /// The objectives naming one of the pools that are left out, by name, and why
    /// (at most [`MAX_REMEMBERED_PROBLEMS`]).
    problems: BTreeMap<String, String>,
    /// Problems beyond those remembered, logged as they are found.
    unremembered: usize,
}

impl<'p> Reading<'p> {
    /// No objective yet: every model's entry is empty.
    fn new(pools: &'p [InferencePoolRef]) -> Self {
        Self {
            pools,
            table: pools
                .iter()
                .map(|pool| (pool.model.clone(), BTreeMap::new()))
                .collect(),
            named: BTreeMap::new(),
            problems: BTreeMap::new(),
            unremembered: 0,
        }
    }

    /// Adds what `object` says, if it names one of the pools and is well formed.
    fn add(&mut self, object: &DynamicObject) {
        let Some(name) = object.metadata.name.as_deref() else {
            return;
        };
        let spec = object.data.get("spec");
        let pool = match pool_named(spec) {
            Ok(Some(pool)) => pool,
            // Another kind of pool's objective.
            Ok(None) => return,
            Err(problem) => return self.left_out(name, problem),
        };
        if !self.pools.iter().any(|p| p.name == pool) {
            return;
        }
        if name.len() > MAX_OBJECTIVE_NAME {
            let problem = format!("its name is longer than {MAX_OBJECTIVE_NAME} bytes");
            return self.left_out(name, problem);
        }
        let priority = match priority(spec) {
            Ok(priority) => priority,
            Err(problem) => return self.left_out(name, problem),
        };
        for pool_ref in self.pools.iter().filter(|p| p.name == pool) {
            *self.named.entry(pool_ref.model.clone()).or_default() += 1;
            let objectives = self.table.entry(pool_ref.model.clone()).or_default();
            objectives.insert(name.to_owned(), priority);
            if objectives.len() > MAX_OBJECTIVES_PER_MODEL {
                objectives.pop_last();
            }
        }
    }

    /// Records that objective `name` is left out, and why.
    fn left_out(&mut self, name: &str, problem: String) {
        if self.problems.len() < MAX_REMEMBERED_PROBLEMS {
            self.problems.insert(shown(name), problem);
        } else {
            self.unremembered += 1;
            tracing::warn!(objective = %shown(name), problem = %problem, "the InferenceObjective is ignored");
        }
    }
}

/// What was last logged, so that it is logged once until it changes.
#[derive(Debug, Default)]
struct Logged {
    /// The objectives left out, and why.
    problems: BTreeMap<String, String>,
    /// The models with more objectives than they keep, and how many they have.
    over: BTreeMap<String, usize>,
    /// The API server serves no objectives.
    not_served: bool,
}

impl Logged {
    /// Logs what `reading` found that was not logged already, and gives its table.
    fn report(&mut self, namespace: &str, reading: Reading<'_>) -> ObjectiveTable {
        if self.not_served {
            tracing::info!(namespace, "InferenceObjectives are served again");
            self.not_served = false;
        }
        for (name, problem) in &reading.problems {
            if self.problems.get(name) != Some(problem) {
                tracing::warn!(objective = %name, problem = %problem, "the InferenceObjective is ignored");
            }
        }
        self.problems = reading.problems;
        let over: BTreeMap<String, usize> = reading
            .named
            .into_iter()
            .filter(|(_, named)| *named > MAX_OBJECTIVES_PER_MODEL)
            .collect();
        for (model, named) in &over {
            if self.over.get(model) != Some(named) {
                tracing::warn!(model = %model, objectives = named, kept = MAX_OBJECTIVES_PER_MODEL, "more InferenceObjectives than a model keeps: the first by name are");
            }
        }
        self.over = over;
        reading.table
    }

    /// Logs (once) that no objectives are served.
    fn not_served(&mut self, namespace: &str) {
        if !self.not_served {
            tracing::warn!(
                namespace,
                "no InferenceObjectives are served (their API is not installed): no model has any"
            );
        }
        *self = Self {
            not_served: true,
            ..Self::default()
        };
    }
}

/// Reads the namespace's InferenceObjectives for ever and hands each model's to
/// `sink` whenever they change. A change the watch tells of is listed `settle`
/// after it, so a burst of changes (a rollout, a controller writing statuses) is
/// listed once.
pub(super) async fn follow_objectives(
    client: kube::Client,
    namespace: String,
    pools: Vec<InferencePoolRef>,
    (relist_interval, settle): (Duration, Duration),
    sink: ObjectiveSink,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &resource());
    let mut told: Option<ObjectiveTable> = None;
    let mut logged = Logged::default();
    let mut backoff = Duration::from_millis(100);
    loop {
        let (table, version) = match list(&api, &pools).await {
            Ok(Listed::Served(reading, version)) => (logged.report(&namespace, reading), version),
            Ok(Listed::NotServed) => {
                logged.not_served(&namespace);
                (Reading::new(&pools).table, None)
            }
            Err(e) => {
                tracing::warn!(namespace, error = %e, "listing the InferenceObjectives failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        if told.as_ref() != Some(&table) {
            let objectives: usize = table.values().map(BTreeMap::len).sum();
            tracing::info!(
                namespace,
                models = table.len(),
                objectives,
                "the InferenceObjectives changed"
            );
            sink(table.clone());
            told = Some(table);
        }
        let relist_at = Instant::now() + relist_interval;
        let wake = changes::changed(&api, None, version, relist_at, "InferenceObjectives").await;
        changes::pause(wake, &mut backoff, settle).await;
    }
}

/// What a listing of the objectives found.
#[derive(Debug)]
enum Listed<'p> {
    /// The objectives, and the resource version to watch them from (absent when
    /// the list names none).
    Served(Reading<'p>, Option<String>),
    /// The API server serves no objectives.
    NotServed,
}

/// Every objective of the namespace, read into a [`Reading`] a page at a time.
async fn list<'p>(
    api: &Api<DynamicObject>,
    pools: &'p [InferencePoolRef],
) -> Result<Listed<'p>, kube::Error> {
    let mut reading = Reading::new(pools);
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let listed = tokio::time::timeout(LIST_TIMEOUT, api.list(&params))
            .await
            .map_err(|_| {
                kube::Error::Service("listing the InferenceObjectives timed out".into())
            })?;
        let page = match listed {
            Ok(page) => page,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Listed::NotServed),
            Err(e) => return Err(e),
        };
        for object in &page.items {
            reading.add(object);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => {
                let version = page.metadata.resource_version.filter(|v| !v.is_empty());
                return Ok(Listed::Served(reading, version));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn objective(name: &str, spec: Value) -> DynamicObject {
        DynamicObject::new(name, &resource()).data(json!({ "spec": spec }))
    }

    fn pools() -> Vec<InferencePoolRef> {
        ["a", "b"]
            .into_iter()
            .map(|name| InferencePoolRef {
                model: format!("m-{name}"),
                name: name.into(),
            })
            .collect()
    }

    #[test]
    fn an_objective_gives_its_pools_model_its_priority() {
        let pools = pools();
        let mut reading = Reading::new(&pools);
        for (name, spec) in [
            ("unset", json!({"poolRef": {"name": "a"}})),
            ("null", json!({"poolRef": {"name": "a"}, "priority": null})),
            (
                "defaults",
                json!({"poolRef": {"group": POOL_GROUP, "kind": POOL_KIND, "name": "a"}, "priority": -3}),
            ),
            (
                "max",
                json!({"poolRef": {"name": "a"}, "priority": i64::MAX}),
            ),
            (
                "other-pool",
                json!({"poolRef": {"name": "c"}, "priority": 1}),
            ),
            (
                "other-group",
                json!({"poolRef": {"group": "example.com", "name": "a"}, "priority": 1}),
            ),
            (
                "core-group",
                json!({"poolRef": {"group": "", "name": "a"}, "priority": 1}),
            ),
            (
                "other-kind",
                json!({"poolRef": {"kind": "Service", "name": "a"}, "priority": 1}),
            ),
            // Another pool's objective is not ours to judge.
            (
                "other-bad",
                json!({"poolRef": {"name": "c"}, "priority": "x"}),
            ),
        ] {
            reading.add(&objective(name, spec));
        }
        assert_eq!(
            reading.table,
            BTreeMap::from([
                (
                    "m-a".to_owned(),
                    BTreeMap::from([
                        ("defaults".to_owned(), -3),
                        ("max".to_owned(), i64::MAX),
                        ("null".to_owned(), 0),
                        ("unset".to_owned(), 0),
                    ])
                ),
                ("m-b".to_owned(), BTreeMap::new()),
            ])
        );
        assert_eq!(reading.problems, BTreeMap::new());
    }

    #[test]
    fn a_malformed_objective_says_why_and_is_left_out() {
        let pools = pools();
        let mut reading = Reading::new(&pools);
        let long = "o".repeat(MAX_OBJECTIVE_NAME + 1);
        for (name, spec) in [
            (
                "string",
                json!({"poolRef": {"name": "a"}, "priority": "high"}),
            ),
            ("float", json!({"poolRef": {"name": "a"}, "priority": 1.5})),
            (
                "whole-float",
                json!({"poolRef": {"name": "a"}, "priority": 2.0}),
            ),
            (
                "too-big",
                json!({"poolRef": {"name": "a"}, "priority": u64::MAX}),
            ),
            ("no-pool", json!({"priority": 1})),
            ("no-pool-name", json!({"poolRef": {}, "priority": 1})),
            ("pool-name-number", json!({"poolRef": {"name": 1}})),
            (long.as_str(), json!({"poolRef": {"name": "b"}})),
        ] {
            reading.add(&objective(name, spec));
        }
        reading.add(&DynamicObject::new("no-spec", &resource()));
        assert_eq!(
            reading.table,
            BTreeMap::from([
                ("m-a".to_owned(), BTreeMap::new()),
                ("m-b".to_owned(), BTreeMap::new()),
            ])
        );
        let why = |name: &str| reading.problems.get(name).cloned().unwrap_or_default();
        for name in ["string", "float", "whole-float", "too-big"] {
            assert!(why(name).contains("not a 64-bit integer"), "{name}");
        }
        assert_eq!(why("no-pool"), "it has no spec.poolRef");
        assert_eq!(why("no-spec"), "it has no spec.poolRef");
        assert_eq!(why("no-pool-name"), "spec.poolRef has no name");
        assert_eq!(why("pool-name-number"), "spec.poolRef has no name");
        let shown = format!("{}…", "o".repeat(MAX_OBJECTIVE_NAME));
        assert!(
            why(&shown).contains("longer than 253 bytes"),
            "{:?}",
            reading.problems
        );
    }

    #[test]
    fn a_model_keeps_its_first_objectives_by_name() {
        let pools = pools();
        let mut reading = Reading::new(&pools);
        // Listed in no order.
        for n in (0..MAX_OBJECTIVES_PER_MODEL + 5).rev() {
            reading.add(&objective(
                &format!("o{n:05}"),
                json!({"poolRef": {"name": "a"}, "priority": n}),
            ));
        }
        let kept = &reading.table["m-a"];
        assert_eq!(kept.len(), MAX_OBJECTIVES_PER_MODEL);
        assert_eq!(kept.keys().next().map(String::as_str), Some("o00000"));
        let last = format!("o{:05}", MAX_OBJECTIVES_PER_MODEL - 1);
        assert_eq!(kept.keys().next_back(), Some(&last));
        assert_eq!(reading.named["m-a"], MAX_OBJECTIVES_PER_MODEL + 5);
        assert_eq!(shown("é".repeat(200).as_str()).len(), 252 + "…".len());
    }
}

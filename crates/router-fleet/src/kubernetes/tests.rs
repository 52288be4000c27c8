//! Discovery against an in-process fake API server that speaks list and watch the
//! way the Kubernetes API server does: pod lists with a resource version, watch
//! streams of JSON lines, `410 Gone` error events, watches it ends, and changes it
//! leaves out of the watch (a missed event only a relist sees). It serves
//! InferencePools too, listed and watched by name, and selects pods by their labels
//! (a pod whose labels change is not told apart from one that keeps them); and the
//! namespace's InferenceObjectives, listed a page at a time and watched, or refused
//! (their API not installed, access denied).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::*;
use crate::health::HealthPolicy;

mod objectives;
mod pools;

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct FakeApi {
    pods: Mutex<BTreeMap<String, Value>>,
    /// InferencePools by name.
    pools: Mutex<BTreeMap<String, Value>>,
    version: AtomicU64,
    events: broadcast::Sender<(u64, Value)>,
    /// Every event sent, with its resource version: a watch from version R is sent
    /// those after R first, as the API server does.
    log: Mutex<Vec<(u64, Value)>>,
    /// The next watch is answered with a `410 Gone` error event.
    gone: AtomicBool,
    /// Watches end after their first event.
    short_watches: AtomicBool,
    lists: AtomicUsize,
    /// InferencePool lists.
    pool_lists: AtomicUsize,
    /// InferenceObjectives by name.
    objectives: Mutex<BTreeMap<String, Value>>,
    /// When not 0, the status InferenceObjective requests are answered with (404:
    /// their API is not installed, 403: access is denied).
    objectives_refused: AtomicU16,
    /// InferenceObjective list requests (each page, refused ones too).
    objective_lists: AtomicUsize,
}

impl FakeApi {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            pods: Mutex::new(BTreeMap::new()),
            pools: Mutex::new(BTreeMap::new()),
            version: AtomicU64::new(100),
            events: broadcast::channel(64).0,
            log: Mutex::new(Vec::new()),
            gone: AtomicBool::new(false),
            short_watches: AtomicBool::new(false),
            lists: AtomicUsize::new(0),
            pool_lists: AtomicUsize::new(0),
            objectives: Mutex::new(BTreeMap::new()),
            objectives_refused: AtomicU16::new(0),
            objective_lists: AtomicUsize::new(0),
        })
    }

    /// Creates or updates a pod labelled `app: sglang`; the watch hears of it unless
    /// `silent`.
    fn put(&self, name: &str, ip: &str, ready: bool, deleting: bool, silent: bool) {
        self.put_labelled(
            name,
            ip,
            json!({"app": "sglang"}),
            (ready, deleting, silent),
        );
    }

    /// Creates or updates a Ready pod with `labels`; the watch hears of it.
    fn put_in(&self, name: &str, ip: &str, labels: &Value) {
        self.put_labelled(name, ip, labels.clone(), (true, false, false));
    }

    fn put_labelled(
        &self,
        name: &str,
        ip: &str,
        labels: Value,
        (ready, deleting, silent): (bool, bool, bool),
    ) {
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        let mut metadata = json!({"name": name, "namespace": "llm", "resourceVersion": version.to_string(), "labels": labels});
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        }
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        });
        let kind = if self.pods.lock().insert(name.into(), pod.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if !silent {
            self.emit(version, json!({"type": kind, "object": pod}));
        }
    }

    /// Deletes a pod; the watch hears of it unless `silent`.
    fn delete(&self, name: &str, silent: bool) {
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        let Some(mut pod) = self.pods.lock().remove(name) else {
            return;
        };
        pod["metadata"]["resourceVersion"] = json!(version.to_string());
        if !silent {
            self.emit(version, json!({"type": "DELETED", "object": pod}));
        }
    }

    /// Creates or updates InferencePool `name` with `spec`; the watch hears of it
    /// unless `silent`.
    fn put_pool(&self, name: &str, spec: Value, silent: bool) {
        let kind = ("inference.networking.k8s.io/v1", "InferencePool");
        self.put_object(&self.pools, kind, name, spec, silent);
    }

    /// Deletes InferencePool `name`; the watch hears of it.
    fn delete_pool(&self, name: &str) {
        self.delete_object(&self.pools, name);
    }

    /// Creates or updates InferenceObjective `name` with `spec`; the watch hears of
    /// it unless `silent`.
    fn put_objective(&self, name: &str, spec: Value, silent: bool) {
        let kind = (
            "inference.networking.x-k8s.io/v1alpha2",
            "InferenceObjective",
        );
        self.put_object(&self.objectives, kind, name, spec, silent);
    }

    /// Deletes InferenceObjective `name`; the watch hears of it.
    fn delete_objective(&self, name: &str) {
        self.delete_object(&self.objectives, name);
    }

    /// Creates or updates object `name` of `objects` (whose API version and kind
    /// are `api_version` and `kind`) with `spec`; the watch hears of it unless
    /// `silent`.
    fn put_object(
        &self,
        objects: &Mutex<BTreeMap<String, Value>>,
        (api_version, kind): (&str, &str),
        name: &str,
        spec: Value,
        silent: bool,
    ) {
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        let object = json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": "llm", "resourceVersion": version.to_string()},
            "spec": spec,
        });
        let change = if objects.lock().insert(name.into(), object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if !silent {
            self.emit(version, json!({"type": change, "object": object}));
        }
    }

    /// Deletes object `name` of `objects`; the watch hears of it.
    fn delete_object(&self, objects: &Mutex<BTreeMap<String, Value>>, name: &str) {
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        let Some(mut object) = objects.lock().remove(name) else {
            return;
        };
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        self.emit(version, json!({"type": "DELETED", "object": object}));
    }

    /// Sends an event as it is, at a resource version of its own in the log.
    fn send(&self, event: Value) {
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        self.emit(version, event);
    }

    fn emit(&self, version: u64, event: Value) {
        let mut log = self.log.lock();
        log.push((version, event.clone()));
        drop(self.events.send((version, event)));
    }
}

/// The labels `selector` (`a=b,c=d`) names.
fn selected(selector: &str) -> BTreeMap<String, String> {
    selector
        .split(',')
        .map(|pair| {
            let (key, value) = pair.split_once('=').expect("key=value");
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

/// Whether `object` carries every label of `labels`.
fn carries(object: &Value, labels: &BTreeMap<String, String>) -> bool {
    labels
        .iter()
        .all(|(key, value)| object["metadata"]["labels"][key].as_str() == Some(value))
}

async fn pods(
    State(api): State<Arc<FakeApi>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let selector = query
        .get("labelSelector")
        .expect("pods are listed by label");
    let labels = selected(selector);
    assert!(labels.contains_key("app"), "{selector}");
    if query.get("watch").map(String::as_str) != Some("true") {
        api.lists.fetch_add(1, Ordering::SeqCst);
        // The version first: a change made while the list is read is also sent to
        // the watch from it (at worst twice), never to neither.
        let version = api.version.load(Ordering::SeqCst).to_string();
        let items: Vec<Value> = api
            .pods
            .lock()
            .values()
            .filter(|pod| carries(pod, &labels))
            .cloned()
            .collect();
        return axum::Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": version}, "items": items})).into_response();
    }
    if api.gone.swap(false, Ordering::SeqCst) {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "message": "too old resource version", "code": 410}});
        return axum::body::Body::from(format!("{gone}\n")).into_response();
    }
    watch_stream(&api, &query, move |event| {
        let object = &event["object"];
        object["kind"] == "Status" || (object["kind"] == "Pod" && carries(object, &labels))
    })
}

/// InferencePools, listed and watched by name (`fieldSelector=metadata.name=NAME`).
async fn pools(
    State(api): State<Arc<FakeApi>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let selector = query.get("fieldSelector").expect("a pool is read by name");
    let name = selector
        .strip_prefix("metadata.name=")
        .unwrap_or_else(|| panic!("{selector}"))
        .to_owned();
    if query.get("watch").map(String::as_str) != Some("true") {
        api.pool_lists.fetch_add(1, Ordering::SeqCst);
        // The version first, as for pods.
        let version = api.version.load(Ordering::SeqCst).to_string();
        let items: Vec<Value> = api.pools.lock().get(&name).cloned().into_iter().collect();
        return axum::Json(json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePoolList", "metadata": {"resourceVersion": version}, "items": items})).into_response();
    }
    watch_stream(&api, &query, move |event| {
        let object = &event["object"];
        object["kind"] == "InferencePool" && object["metadata"]["name"] == name.as_str()
    })
}

/// InferenceObjectives, listed a page at a time (`limit`; `continue` is the list's
/// resource version and the last name sent, and every page has the first's resource
/// version, as the API server's do) and watched; refused while `objectives_refused`
/// says so.
async fn objectives(
    State(api): State<Arc<FakeApi>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let watching = query.get("watch").map(String::as_str) == Some("true");
    if !watching {
        api.objective_lists.fetch_add(1, Ordering::SeqCst);
    }
    let refused = api.objectives_refused.load(Ordering::SeqCst);
    if refused != 0 {
        let code = StatusCode::from_u16(refused).expect("a status");
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "refused", "reason": code.canonical_reason(), "code": refused});
        return (code, axum::Json(status)).into_response();
    }
    if watching {
        return watch_stream(&api, &query, |event| {
            event["object"]["kind"] == "InferenceObjective"
        });
    }
    let limit = query
        .get("limit")
        .map_or(usize::MAX, |l| l.parse().expect("a limit"));
    // The version first, as for pods.
    let (version, after) = match query.get("continue") {
        Some(token) => {
            let (version, after) = token.split_once('/').expect("version/name");
            (version.to_owned(), Some(after.to_owned()))
        }
        None => (api.version.load(Ordering::SeqCst).to_string(), None),
    };
    let objectives = api.objectives.lock();
    let mut rest = objectives
        .iter()
        .filter(|(name, _)| after.as_ref().is_none_or(|after| *name > after));
    let page: Vec<(&String, &Value)> = rest.by_ref().take(limit).collect();
    let mut metadata = json!({"resourceVersion": version});
    if rest.next().is_some()
        && let Some((last, _)) = page.last()
    {
        metadata["continue"] = json!(format!("{version}/{last}"));
    }
    let items: Vec<Value> = page.into_iter().map(|(_, o)| o.clone()).collect();
    axum::Json(json!({"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjectiveList", "metadata": metadata, "items": items})).into_response()
}

/// A watch from the query's resource version of the events `keep` keeps: those
/// logged after it, then those sent while it is open (ending after the first when
/// watches are short).
fn watch_stream(
    api: &FakeApi,
    query: &BTreeMap<String, String>,
    keep: impl Fn(&Value) -> bool + Send + Sync + 'static,
) -> Response {
    let short = api.short_watches.load(Ordering::SeqCst);
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Subscribed before the log is read, so no event falls between the two.
    let events = {
        let log = api.log.lock();
        let events = api.events.subscribe();
        let missed: Vec<(u64, Value)> = log
            .iter()
            .filter(|(v, event)| *v > from && keep(event))
            .cloned()
            .collect();
        (missed, events)
    };
    let last = from;
    let keep = Arc::new(keep);
    let lines = stream::unfold(
        (events, last, false),
        move |((mut missed, mut live), last, done)| {
            let keep = Arc::clone(&keep);
            async move {
                if done {
                    return None;
                }
                let (version, event) = if missed.is_empty() {
                    loop {
                        let (version, event) = live.recv().await.ok()?;
                        // Sent live and logged: the replay had it already.
                        if (version > last || event["type"] == "ERROR") && keep(&event) {
                            break (version, event);
                        }
                    }
                } else {
                    missed.remove(0)
                };
                let line = Ok::<_, std::convert::Infallible>(format!("{event}\n"));
                Some((line, ((missed, live), version.max(last), short)))
            }
        },
    );
    axum::body::Body::from_stream(lines).into_response()
}

async fn fake_api() -> (Arc<FakeApi>, String, tokio::task::JoinHandle<()>) {
    let api = FakeApi::new();
    let app = axum::Router::new()
        .route("/api/v1/namespaces/llm/pods", axum::routing::get(pods))
        .route(
            "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools",
            axum::routing::get(pools),
        )
        .route(
            "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/llm/inferenceobjectives",
            axum::routing::get(objectives),
        )
        .with_state(Arc::clone(&api));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (api, url, server)
}

fn fleet() -> Arc<Fleet> {
    let upstream = router_upstream::Upstream::new(router_upstream::UpstreamTimeouts {
        connect: Duration::from_millis(200),
        first_byte: Duration::from_secs(1),
        pool_idle: Duration::from_secs(4),
    });
    Arc::new(Fleet::new(
        upstream,
        Arc::default(),
        HealthPolicy::default(),
    ))
}

fn settings(url: &str, relist: Duration) -> KubernetesSettings {
    KubernetesSettings {
        api_url: Some(url.into()),
        namespace: "llm".into(),
        selectors: vec![PodSelector {
            model: "m".into(),
            labels: BTreeMap::from([("app".into(), "sglang".into())]),
            // A declared role: the pods' addresses answer nothing, and the engines
            // join unhealthy, which is all these tests look at.
            role: Some(Role::Plain),
            port: 9,
            bootstrap_port: None,
        }],
        pools: Vec::new(),
        relist_interval: relist,
        debounce: Duration::from_millis(20),
        objectives: None,
    }
}

fn engines(fleet: &Fleet) -> BTreeSet<String> {
    fleet
        .snapshot()
        .engines()
        .map(|e| format!("{}@{}", e.id(), e.url()))
        .collect()
}

/// Waits until the fleet's engines are `expected` (id@url).
async fn until(fleet: &Arc<Fleet>, changed: &Notify, expected: &[&str]) {
    until_after(fleet, changed, expected, "").await;
}

/// Waits until the fleet's engines are `expected` (id@url) after `what` happened.
async fn until_after(fleet: &Arc<Fleet>, changed: &Notify, expected: &[&str], what: &str) {
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    let wait = async {
        loop {
            let notified = changed.notified();
            if engines(fleet) == expected {
                return;
            }
            notified.await;
        }
    };
    if tokio::time::timeout(GUARD, wait).await.is_err() {
        panic!(
            "{what}: engines {:?}, expected {expected:?}",
            engines(fleet)
        );
    }
}

/// A fleet discovering the fake API server's pods (relisting every `relist`), and
/// a signal of its changes.
fn discover(url: &str, relist: Duration) -> (Arc<Fleet>, Arc<Notify>, DiscoveryHandle) {
    let fleet = fleet();
    let (changed, discovery) = discover_into(&fleet, url, relist);
    (fleet, changed, discovery)
}

/// `fleet` discovering the fake API server's pods, and a signal of its changes.
fn discover_into(
    fleet: &Arc<Fleet>,
    url: &str,
    relist: Duration,
) -> (Arc<Notify>, DiscoveryHandle) {
    discover_with(fleet, settings(url, relist))
}

/// `fleet` discovering as `settings` say, and a signal of its changes.
fn discover_with(
    fleet: &Arc<Fleet>,
    settings: KubernetesSettings,
) -> (Arc<Notify>, DiscoveryHandle) {
    let changed = Arc::new(Notify::new());
    let notify = Arc::clone(&changed);
    fleet.on_change(move |_| notify.notify_waiters());
    let discovery = spawn_discovery(Arc::clone(fleet), settings).unwrap();
    (changed, discovery)
}

#[test]
fn a_pods_engine_is_named_namespace_slash_pod_and_comes_from_kubernetes() {
    let selectors = settings("http://unused", Duration::from_secs(1)).selectors;
    let pod = |address: Option<&str>| PodView {
        address: address.map(str::to_owned),
        version: None,
    };
    let observed = Observed {
        pods: vec![BTreeMap::from([
            ("p0".to_owned(), pod(Some("10.0.0.1"))),
            ("p1".to_owned(), pod(None)),
        ])],
        pools: Vec::new(),
    };
    let engines = desired("llm", &selectors, &observed);
    let ids: Vec<&str> = engines.keys().map(EngineId::as_str).collect();
    assert_eq!(ids, ["llm/p0"]);
    let spec = &engines[&EngineId::from("llm/p0")];
    assert_eq!(
        (spec.url.as_str(), spec.source),
        ("http://10.0.0.1:9", Source::Kubernetes)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_never_replace_nor_remove_the_engines_of_another_source() {
    let (api, url, server) = fake_api().await;
    let fleet = fleet();
    // Configured engines named as a pod is, and as a pod's engine is.
    for id in ["p0", "llm/p1"] {
        let spec = EngineSpec::new(id, "http://127.0.0.9:9", "m").with_role(Some(Role::Plain));
        fleet.apply(Change::Upsert(spec)).await.unwrap();
    }
    api.put("p0", "127.0.0.1", true, false, false);
    api.put("p1", "127.0.0.2", true, false, false);
    let (changed, _discovery) = discover_into(&fleet, &url, Duration::from_secs(3600));
    let configured = ["p0@http://127.0.0.9:9", "llm/p1@http://127.0.0.9:9"];
    until(
        &fleet,
        &changed,
        &[configured[0], configured[1], "llm/p0@http://127.0.0.1:9"],
    )
    .await;
    // Pod p1 was refused in the pass that applied p0; its deletion, and p0's, apply
    // in a later one.
    api.delete("p0", false);
    api.delete("p1", false);
    until(&fleet, &changed, &configured).await;
    for id in ["p0", "llm/p1"] {
        assert_eq!(fleet.spec(&id.into()).unwrap().source, Source::Config);
    }
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_join_when_ready_and_leave_when_deleted_not_ready_or_deleting() {
    let (api, url, server) = fake_api().await;
    api.put("p0", "127.0.0.1", true, false, false);
    api.put("p1", "", true, false, false);
    api.put("p2", "127.0.0.2", false, false, false);
    let (fleet, changed, _discovery) = discover(&url, Duration::from_secs(3600));
    until(&fleet, &changed, &["llm/p0@http://127.0.0.1:9"]).await;
    assert_eq!(
        fleet
            .snapshot()
            .get("llm/p0")
            .map(|e| e.model().to_owned())
            .as_deref(),
        Some("m")
    );

    // Through the watch: an IP (MODIFIED events with an empty IP are not engines),
    // readiness, a new pod, a pod being deleted, a delete.
    api.put("p1", "127.0.0.3", true, false, false);
    api.put("p2", "127.0.0.2", true, false, false);
    until(
        &fleet,
        &changed,
        &[
            "llm/p0@http://127.0.0.1:9",
            "llm/p1@http://127.0.0.3:9",
            "llm/p2@http://127.0.0.2:9",
        ],
    )
    .await;
    api.put("p1", "127.0.0.3", false, false, false);
    api.put("p2", "127.0.0.2", true, true, false);
    api.put("p3", "::1", true, false, false);
    until(
        &fleet,
        &changed,
        &["llm/p0@http://127.0.0.1:9", "llm/p3@http://[::1]:9"],
    )
    .await;
    api.delete("p0", false);
    until(&fleet, &changed, &["llm/p3@http://[::1]:9"]).await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_resource_version_relists_and_the_relist_sees_what_the_watch_missed() {
    let (api, url, server) = fake_api().await;
    api.put("p0", "127.0.0.1", true, false, false);
    let (fleet, changed, _discovery) = discover(&url, Duration::from_secs(3600));
    until(&fleet, &changed, &["llm/p0@http://127.0.0.1:9"]).await;
    let lists = api.lists.load(Ordering::SeqCst);
    // A pod the watch never hears of, then the watch's resource version expires.
    api.put("p1", "127.0.0.2", true, false, true);
    api.gone.store(true, Ordering::SeqCst);
    api.send(json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "message": "too old resource version", "code": 410}}));
    until(
        &fleet,
        &changed,
        &["llm/p0@http://127.0.0.1:9", "llm/p1@http://127.0.0.2:9"],
    )
    .await;
    assert!(api.lists.load(Ordering::SeqCst) > lists, "it listed again");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_delete_is_healed_by_the_periodic_relist() {
    let (api, url, server) = fake_api().await;
    api.put("p0", "127.0.0.1", true, false, false);
    api.put("p1", "127.0.0.2", true, false, false);
    let (fleet, changed, _discovery) = discover(&url, Duration::from_millis(300));
    until(
        &fleet,
        &changed,
        &["llm/p0@http://127.0.0.1:9", "llm/p1@http://127.0.0.2:9"],
    )
    .await;
    api.delete("p1", true);
    until(&fleet, &changed, &["llm/p0@http://127.0.0.1:9"]).await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_the_server_ends_are_resumed_from_their_resource_version() {
    let (api, url, server) = fake_api().await;
    api.short_watches.store(true, Ordering::SeqCst);
    let (fleet, changed, _discovery) = discover(&url, Duration::from_secs(3600));
    let lists = api.lists.load(Ordering::SeqCst);
    let mut expected = Vec::new();
    for n in 0..3 {
        api.put(
            &format!("p{n}"),
            &format!("127.0.0.{}", n + 1),
            true,
            false,
            false,
        );
        expected.push(format!("llm/p{n}@http://127.0.0.{}:9", n + 1));
        let names: Vec<&str> = expected.iter().map(String::as_str).collect();
        until(&fleet, &changed, &names).await;
    }
    assert!(
        api.lists.load(Ordering::SeqCst) <= lists + 1,
        "resumed, not listed again"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_older_than_the_one_recorded_changes_nothing() {
    let (api, url, server) = fake_api().await;
    api.put("p0", "127.0.0.1", true, false, false);
    let (fleet, changed, _discovery) = discover(&url, Duration::from_secs(3600));
    until(&fleet, &changed, &["llm/p0@http://127.0.0.1:9"]).await;
    // p0 stops being ready; then an event of an older resource version (out of
    // order) saying it is ready arrives, then a new pod: p0 stays out.
    let stale = api.pods.lock()["p0"].clone();
    api.put("p0", "127.0.0.1", false, false, false);
    until(&fleet, &changed, &[]).await;
    api.send(json!({"type": "MODIFIED", "object": stale}));
    api.put("p1", "127.0.0.2", true, false, false);
    until(&fleet, &changed, &["llm/p1@http://127.0.0.2:9"]).await;
    server.abort();
}

//! Discovery against an in-process fake API server that speaks list and watch the
//! way the Kubernetes API server does: pod lists with a resource version, watch
//! streams of JSON lines, `410 Gone` error events, watches it ends, and changes it
//! leaves out of the watch (a missed event only a relist sees).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::*;
use crate::health::HealthPolicy;

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct FakeApi {
    pods: Mutex<BTreeMap<String, Value>>,
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
}

impl FakeApi {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            pods: Mutex::new(BTreeMap::new()),
            version: AtomicU64::new(100),
            events: broadcast::channel(64).0,
            log: Mutex::new(Vec::new()),
            gone: AtomicBool::new(false),
            short_watches: AtomicBool::new(false),
            lists: AtomicUsize::new(0),
        })
    }

    /// Creates or updates a pod; the watch hears of it unless `silent`.
    fn put(&self, name: &str, ip: &str, ready: bool, deleting: bool, silent: bool) {
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        let mut metadata = json!({"name": name, "namespace": "llm", "resourceVersion": version.to_string(), "labels": {"app": "sglang"}});
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

async fn pods(
    State(api): State<Arc<FakeApi>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    assert_eq!(
        query.get("labelSelector").map(String::as_str),
        Some("app=sglang")
    );
    if query.get("watch").map(String::as_str) != Some("true") {
        api.lists.fetch_add(1, Ordering::SeqCst);
        let items: Vec<Value> = api.pods.lock().values().cloned().collect();
        let version = api.version.load(Ordering::SeqCst).to_string();
        return axum::Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": version}, "items": items})).into_response();
    }
    if api.gone.swap(false, Ordering::SeqCst) {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "message": "too old resource version", "code": 410}});
        return axum::body::Body::from(format!("{gone}\n")).into_response();
    }
    let short = api.short_watches.load(Ordering::SeqCst);
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Subscribed before the log is read, so no event falls between the two.
    let events = {
        let log = api.log.lock();
        let events = api.events.subscribe();
        let missed: Vec<(u64, Value)> = log.iter().filter(|(v, _)| *v > from).cloned().collect();
        (missed, events)
    };
    let last = from;
    let lines = stream::unfold(
        (events, last, false),
        move |((mut missed, mut live), last, done)| async move {
            if done {
                return None;
            }
            let (version, event) = if missed.is_empty() {
                loop {
                    let (version, event) = live.recv().await.ok()?;
                    // Sent live and logged: the replay had it already.
                    if version > last || event["type"] == "ERROR" {
                        break (version, event);
                    }
                }
            } else {
                missed.remove(0)
            };
            let line = Ok::<_, std::convert::Infallible>(format!("{event}\n"));
            Some((line, ((missed, live), version.max(last), short)))
        },
    );
    axum::body::Body::from_stream(lines).into_response()
}

async fn fake_api() -> (Arc<FakeApi>, String, tokio::task::JoinHandle<()>) {
    let api = FakeApi::new();
    let app = axum::Router::new()
        .route("/api/v1/namespaces/llm/pods", axum::routing::get(pods))
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
        relist_interval: relist,
        debounce: Duration::from_millis(20),
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
        panic!("engines {:?}, expected {expected:?}", engines(fleet));
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
    let changed = Arc::new(Notify::new());
    let notify = Arc::clone(&changed);
    fleet.on_change(move |_| notify.notify_waiters());
    let discovery = spawn_discovery(Arc::clone(fleet), settings(url, relist)).unwrap();
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

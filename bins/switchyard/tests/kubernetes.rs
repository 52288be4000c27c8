//! Kubernetes discovery through the binary: a router whose file names no engine
//! finds them as the Ready pods an API server lists (here a fake one of the test's
//! own), introspects them like configured engines, serves through them, and lets a
//! pod go once the API server no longer lists it.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use common::{Replica, TempFile};
use engine_sim::SimConfig;
use parking_lot::Mutex;
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs a few seconds (one relist).
const GUARD: Duration = Duration::from_secs(30);

pub(crate) type Pods = Arc<Mutex<Vec<Value>>>;

pub(crate) fn pod(name: &str, label: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "resourceVersion": "7", "labels": {"n": label}},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// Lists the pods whose `n` label the selector names; a watch stays open and
/// silent, so only a relist tells of a change.
pub(crate) async fn pods(
    State(pods): State<Pods>,
    Query(query): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    if query.get("watch").map(String::as_str) == Some("true") {
        let silent = futures_util::stream::pending::<Result<String, std::convert::Infallible>>();
        return axum::body::Body::from_stream(silent).into_response();
    }
    let wanted = query.get("labelSelector").cloned().unwrap_or_default();
    let items: Vec<Value> = pods
        .lock()
        .iter()
        .filter(|p| {
            format!(
                "n={}",
                p["metadata"]["labels"]["n"].as_str().unwrap_or_default()
            ) == wanted
        })
        .cloned()
        .collect();
    axum::Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": items}))
        .into_response()
}

async fn engines_serving(client: &reqwest::Client, router: &Replica, want: &BTreeSet<String>) {
    let wait = async {
        loop {
            let mut seen = BTreeSet::new();
            for _ in 0..8 {
                let response = client
                    .post(router.url("/v1/chat/completions"))
                    .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
                    .send()
                    .await
                    .expect("the router answers");
                if response.status() == 200 {
                    seen.insert(
                        response.headers()["x-switchyard-engine"]
                            .to_str()
                            .unwrap()
                            .to_owned(),
                    );
                }
                response.bytes().await.expect("the body");
            }
            if &seen == want {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, wait)
        .await
        .unwrap_or_else(|_| panic!("the router never served through exactly {want:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_an_api_server_lists_are_the_routers_engines() {
    let sims = [
        engine_sim::start(SimConfig::for_tests()).await.unwrap(),
        engine_sim::start(SimConfig::for_tests()).await.unwrap(),
    ];
    let listed: Pods = Arc::new(Mutex::new(vec![pod("pod-a", "0"), pod("pod-b", "1")]));
    let app = axum::Router::new()
        .route("/api/v1/namespaces/llm/pods", axum::routing::get(pods))
        .with_state(Arc::clone(&listed));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", listener.local_addr().unwrap());
    let api = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    // One selector per simulated engine: they listen on ports of their own.
    let selectors: Vec<Value> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"model": "m", "selector": {"n": i.to_string()}, "port": s.ports().http.port()}))
        .collect();
    let file = TempFile::new(
        &json!({
            "listen": "127.0.0.1:0",
            "models": [{"id": "m", "engines": []}],
            "health": {"interval_ms": 50, "timeout_ms": 5000},
            "discovery": {"kubernetes": {"namespace": "llm", "api_url": api_url, "relist_interval_ms": 1000, "debounce_ms": 10, "models": selectors}},
        })
        .to_string(),
    );
    let router = Replica::start(&file.0, &[]).await;
    let client = reqwest::Client::new();
    engines_serving(
        &client,
        &router,
        &BTreeSet::from(["llm/pod-a".to_owned(), "llm/pod-b".to_owned()]),
    )
    .await;
    listed.lock().retain(|p| p["metadata"]["name"] != "pod-b");
    engines_serving(&client, &router, &BTreeSet::from(["llm/pod-a".to_owned()])).await;
    drop(router);
    api.abort();
    for sim in sims {
        sim.shutdown().await;
    }
}

/// Lists `objects` as a list of `kind`; a watch stays open and silent, so only a
/// relist tells of a change.
async fn objects(
    State((kind, objects)): State<(&'static str, Pods)>,
    Query(query): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    if query.get("watch").map(String::as_str) == Some("true") {
        let silent = futures_util::stream::pending::<Result<String, std::convert::Infallible>>();
        return axum::body::Body::from_stream(silent).into_response();
    }
    let items = objects.lock().clone();
    axum::Json(json!({"kind": kind, "metadata": {"resourceVersion": "7"}, "items": items}))
        .into_response()
}

fn objective(name: &str, priority: i64, pool: &str) -> Value {
    json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": "llm", "resourceVersion": "7"},
        "spec": {"priority": priority, "poolRef": {"name": pool}},
    })
}

/// Waits until `/explain` gives a request naming `objective` band `want`.
async fn band_becomes(client: &reqwest::Client, router: &Replica, objective: &str, want: u64) {
    band_of_body_becomes(client, router, objective, None, want).await;
}

/// Waits until `/explain` gives a request naming `objective`, whose body sends
/// `priority`, band `want`.
async fn band_of_body_becomes(
    client: &reqwest::Client,
    router: &Replica,
    objective: &str,
    priority: Option<i64>,
    want: u64,
) {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    if let Some(priority) = priority {
        body["priority"] = priority.into();
    }
    let last = Mutex::new(Value::Null);
    let wait = async {
        loop {
            let explained: Value = client
                .post(router.url("/explain/v1/chat/completions"))
                .bearer_auth(ADMIN_TOKEN)
                .header("x-gateway-inference-objective", objective)
                .json(&body)
                .send()
                .await
                .expect("the router answers")
                .json()
                .await
                .expect("an explanation");
            if explained["flow"]["band"] == want {
                return;
            }
            *last.lock() = explained;
            tokio::task::yield_now().await;
        }
    };
    if tokio::time::timeout(GUARD, wait).await.is_err() {
        panic!(
            "{objective:?} never in band {want}: {}",
            last.lock().clone()
        );
    }
}

const ADMIN_TOKEN: &str = "objectives-test-admin-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inference_objectives_of_a_pool_give_its_models_requests_their_priorities() {
    let sim = engine_sim::start(SimConfig::for_tests()).await.unwrap();
    let listed: Pods = Arc::new(Mutex::new(vec![pod("pod-a", "0")]));
    let pool = json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "llm", "resourceVersion": "7"},
        "spec": {"selector": {"matchLabels": {"n": "0"}}, "targetPorts": [{"number": sim.ports().http.port()}]},
    });
    let pools: Pods = Arc::new(Mutex::new(vec![pool]));
    let written: Pods = Arc::new(Mutex::new(vec![
        objective("chat", 10, "p"),
        objective("batch", -10, "p"),
        objective("elsewhere", 10, "another-pool"),
    ]));
    let app = axum::Router::new()
        .route("/api/v1/namespaces/llm/pods", axum::routing::get(pods))
        .with_state(Arc::clone(&listed))
        .route(
            "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools",
            axum::routing::get(objects).with_state(("InferencePoolList", pools)),
        )
        .route(
            "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/llm/inferenceobjectives",
            axum::routing::get(objects)
                .with_state(("InferenceObjectiveList", Arc::clone(&written))),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", listener.local_addr().unwrap());
    let api = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let file = TempFile::new(
        &json!({
            "listen": "127.0.0.1:0",
            "admin": {"token": ADMIN_TOKEN},
            "models": [{
                "id": "m",
                "engines": [],
                "flow": {
                    "queue": {"max_wait_ms": 1000},
                    "priority": {"header": "x-gateway-inference-objective", "bands": [1, 0]},
                },
            }],
            "health": {"interval_ms": 50, "timeout_ms": 5000},
            "discovery": {"kubernetes": {
                "namespace": "llm", "api_url": api_url, "relist_interval_ms": 1000, "debounce_ms": 10,
                "pools": [{"model": "m", "name": "p"}], "objectives": true,
            }},
        })
        .to_string(),
    );
    let router = Replica::start(&file.0, &[]).await;
    let client = reqwest::Client::new();
    // Bands: priority 1 and more, then 0 (and no priority), then the rest.
    band_becomes(&client, &router, "chat", 0).await;
    band_becomes(&client, &router, "batch", 2).await;
    for other in ["elsewhere", "not-yet", "5"] {
        band_becomes(&client, &router, other, 1).await;
    }
    // The body's priority orders nothing: the objectives alone do.
    band_of_body_becomes(&client, &router, "not-yet", Some(1000), 1).await;
    band_of_body_becomes(&client, &router, "batch", Some(1000), 2).await;
    // A changed priority and a new objective, seen at the next relist.
    *written.lock() = vec![objective("chat", -1, "p"), objective("not-yet", 3, "p")];
    band_becomes(&client, &router, "chat", 2).await;
    band_becomes(&client, &router, "not-yet", 0).await;
    band_becomes(&client, &router, "batch", 1).await;
    drop(router);
    api.abort();
    sim.shutdown().await;
}

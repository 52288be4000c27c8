//! `switchyard indexer` follows the engines the routers follow: the file, reloaded on
//! SIGHUP (an engine added is indexed, history included; a broken file leaves the
//! old one followed; an engine removed is forgotten, its series gone), Kubernetes
//! discovery (a pod that appears is indexed, one that goes is forgotten) and its own
//! `/workers`, under the admin token (off without one).

use crate::common;
use crate::kubernetes::{Pods, pod, pods};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{Replica, TempFile};
use engine_sim::{RunningEngine, SimConfig};
use parking_lot::Mutex;
use router_state::kv_events::{IndexConfig, PrefixIndex};
use router_tokenize::ChatTokenizer;
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs a second or two (one relist).
const GUARD: Duration = Duration::from_secs(30);
/// The admin token of the admin API test.
const TOKEN: &str = "s3cret-admin";

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-bytes/tokenizer.json")
}

/// An engine of model `m` publishing KV events of 16-token pages.
async fn sim() -> RunningEngine {
    let mut config = SimConfig::for_tests();
    config.model = "m".into();
    config.tokenizer = Some(tokenizer());
    config.page_size = 16;
    config.kv_port = Some(0);
    config.replay_port = Some(0);
    engine_sim::start(config).await.expect("the engine starts")
}

/// The routers' file: one cache-aware model on `engines` (id, engine), with `extra`
/// sections.
fn config(engines: &[(&str, &RunningEngine)], extra: &Value) -> String {
    let engines: Vec<Value> = (engines.iter())
        .map(|(id, e)| json!({"id": id, "url": e.url(), "role": "plain"}))
        .collect();
    let mut config = json!({
        "listen": "127.0.0.1:0",
        "health": {"interval_ms": 50, "timeout_ms": 5000},
        "models": [{"id": "m", "tokenizer": tokenizer(), "block_size": 16, "engines": engines,
                    "policies": {"plain": {"type": "cache_aware", "min_matched_tokens": 16}}}],
    });
    for (key, value) in extra.as_object().expect("sections") {
        config[key] = value.clone();
    }
    config.to_string()
}

fn completion(prompt: &str) -> Value {
    json!({"model": "m", "prompt": prompt, "max_tokens": 1})
}

/// Has `engine` serve `prompt` itself, so it holds its pages.
async fn served_by(client: &reqwest::Client, engine: &RunningEngine, prompt: &str) {
    let response = client
        .post(format!("{}/v1/completions", engine.url()))
        .json(&completion(prompt))
        .send()
        .await
        .expect("the engine answers");
    assert_eq!(response.status(), 200);
    response.bytes().await.expect("the body");
}

/// The engines the indexer says hold `prompt`'s first page, asking as a router
/// does (the prompt's block hashes, computed as the router computes them).
async fn holders(client: &reqwest::Client, indexer: &Replica, prompt: &str) -> BTreeSet<String> {
    let tokenizer = ChatTokenizer::load(&tokenizer()).expect("the tokenizer");
    let body = completion(prompt).to_string();
    let ids = router_http::prompt_ids("/v1/completions", body.as_bytes(), &tokenizer)
        .expect("the prompt's ids");
    let index = PrefixIndex::new(IndexConfig {
        block_size: 16,
        ..IndexConfig::default()
    });
    let answer: Value = client
        .post(indexer.url("/v1/prefix/lookup"))
        .json(&json!({"model": "m", "hashes": index.request_hashes(None, &ids)}))
        .send()
        .await
        .expect("the indexer answers")
        .json()
        .await
        .expect("an answer");
    (answer["engines"].as_array().expect("engines").iter())
        .map(|e| e[0].as_str().expect("an id").to_owned())
        .collect()
}

/// Waits until the indexer says exactly `want` hold `prompt`.
async fn held_by(client: &reqwest::Client, indexer: &Replica, prompt: &str, want: &[&str]) {
    let want: BTreeSet<String> = want.iter().map(|&e| e.to_owned()).collect();
    let wait = async {
        while holders(client, indexer, prompt).await != want {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, wait)
        .await
        .unwrap_or_else(|_| panic!("the indexer never said {want:?} hold {prompt:?}"));
}

/// Waits until the indexer has counted `n` reloads with `outcome`.
async fn reloads(client: &reqwest::Client, indexer: &Replica, outcome: &str, n: f64) {
    let name = format!("switchyard_config_reloads_total{{outcome=\"{outcome}\"}} ");
    let wait = async {
        while indexer.metric(client, &name).await < n {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, wait)
        .await
        .unwrap_or_else(|_| panic!("no {outcome} reload counted"));
}

fn write(file: &Path, text: &str) {
    // Written beside and renamed over, as a ConfigMap volume swaps its files.
    let next = file.with_extension("next");
    std::fs::write(&next, text).expect("written");
    std::fs::rename(&next, file).expect("renamed");
}

fn hangup(process: &Replica) {
    let pid = process.pid().expect("it runs").to_string();
    let status = Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// A prompt of several pages.
fn prompt(name: &str) -> String {
    format!("{name}: {}", "a shared prefix of many pages. ".repeat(8))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_file_adds_and_removes_the_engines_it_indexes() {
    let (a, b) = (sim().await, sim().await);
    let client = reqwest::Client::new();
    let none = json!({});
    let file = TempFile::new(&config(&[("E0", &a)], &none));
    let indexer = Replica::indexer(&file.0, &[]).await;
    let (on_a, on_b) = (prompt("first"), prompt("second"));
    served_by(&client, &a, &on_a).await;
    served_by(&client, &b, &on_b).await;
    held_by(&client, &indexer, &on_a, &["E0"]).await;
    assert!(
        holders(&client, &indexer, &on_b).await.is_empty(),
        "an engine the file does not name is not followed"
    );

    write(&file.0, &config(&[("E0", &a), ("E1", &b)], &none));
    hangup(&indexer);
    reloads(&client, &indexer, "applied", 1.0).await;
    // What E1 served before it joined is replayed into the index.
    held_by(&client, &indexer, &on_b, &["E1"]).await;

    write(&file.0, "models: [");
    hangup(&indexer);
    reloads(&client, &indexer, "invalid", 1.0).await;
    assert_eq!(
        holders(&client, &indexer, &on_b).await,
        BTreeSet::from(["E1".to_owned()]),
        "a broken file leaves the old one followed"
    );
    let scraped = indexer.scrape(&client).await;
    assert!(scraped.contains("engine=\"E1\""), "{scraped}");

    write(&file.0, &config(&[("E0", &a)], &none));
    hangup(&indexer);
    reloads(&client, &indexer, "applied", 2.0).await;
    assert!(
        holders(&client, &indexer, &on_b).await.is_empty(),
        "an engine the file no longer names is forgotten"
    );
    assert_eq!(
        holders(&client, &indexer, &on_a).await,
        BTreeSet::from(["E0".to_owned()])
    );
    let scraped = indexer.scrape(&client).await;
    assert!(!scraped.contains("engine=\"E1\""), "{scraped}");
    // Without an admin token the admin API is off.
    let off = client.get(indexer.url("/workers")).send().await.unwrap();
    assert_eq!(off.status(), 403);
    drop(indexer);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_the_admin_api_adds_are_indexed_until_it_removes_them() {
    let (a, b) = (sim().await, sim().await);
    let client = reqwest::Client::new();
    let file = TempFile::new(&config(&[("E0", &a)], &json!({"admin": {"token": TOKEN}})));
    // The routers' token does not turn the indexer's admin API on: `--admin` does.
    let without = Replica::indexer(&file.0, &[]).await;
    let off = client
        .get(without.url("/workers"))
        .bearer_auth(TOKEN)
        .send();
    assert_eq!(off.await.unwrap().status(), 403);
    drop(without);
    let indexer = Replica::indexer(&file.0, &["--admin"]).await;
    let on_b = prompt("added");
    served_by(&client, &b, &on_b).await;
    let add = json!({"id": "X", "url": b.url(), "model": "m", "role": "plain"});
    let unauthorized = client.post(indexer.url("/workers")).json(&add).send();
    assert_eq!(unauthorized.await.unwrap().status(), 401);
    let added = client
        .post(indexer.url("/workers"))
        .bearer_auth(TOKEN)
        .json(&add)
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    held_by(&client, &indexer, &on_b, &["X"]).await;
    let listed: Value = (client.get(indexer.url("/workers")).bearer_auth(TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sources: BTreeSet<(String, String)> = (listed["workers"].as_array().unwrap().iter())
        .map(|w| (w["id"].to_string(), w["source"].to_string()))
        .collect();
    assert_eq!(
        sources,
        BTreeSet::from([
            ("\"E0\"".to_owned(), "\"config\"".to_owned()),
            ("\"X\"".to_owned(), "\"admin\"".to_owned())
        ])
    );
    let configured = client
        .delete(indexer.url("/workers/E0"))
        .bearer_auth(TOKEN)
        .send();
    assert_eq!(
        configured.await.unwrap().status(),
        409,
        "only engines it added"
    );
    let removed = client
        .delete(indexer.url("/workers/X"))
        .bearer_auth(TOKEN)
        .send();
    assert_eq!(removed.await.unwrap().status(), 204);
    assert!(holders(&client, &indexer, &on_b).await.is_empty());
    drop(indexer);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_discovery_finds_are_indexed_and_forgotten_when_they_go() {
    let (a, b) = (sim().await, sim().await);
    let client = reqwest::Client::new();
    let listed: Pods = Arc::new(Mutex::new(vec![pod("pod-a", "0")]));
    let app = axum::Router::new()
        .route("/api/v1/namespaces/llm/pods", axum::routing::get(pods))
        .with_state(Arc::clone(&listed));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", listener.local_addr().unwrap());
    let api = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    // One selector per simulated engine: they listen on ports of their own.
    let selectors: Vec<Value> = [&a, &b]
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"model": "m", "selector": {"n": i.to_string()}, "port": s.ports().http.port()}))
        .collect();
    let discovery = json!({"discovery": {"kubernetes": {"namespace": "llm", "api_url": api_url, "relist_interval_ms": 1000, "debounce_ms": 10, "models": selectors}}});
    let file = TempFile::new(&config(&[], &discovery));
    let indexer = Replica::indexer(&file.0, &[]).await;
    let (on_a, on_b) = (prompt("on a"), prompt("on b"));
    served_by(&client, &a, &on_a).await;
    served_by(&client, &b, &on_b).await;
    held_by(&client, &indexer, &on_a, &["llm/pod-a"]).await;
    assert!(holders(&client, &indexer, &on_b).await.is_empty());

    listed.lock().push(pod("pod-b", "1"));
    held_by(&client, &indexer, &on_b, &["llm/pod-b"]).await;
    listed.lock().retain(|p| p["metadata"]["name"] != "pod-a");
    held_by(&client, &indexer, &on_a, &[]).await;
    assert_eq!(
        holders(&client, &indexer, &on_b).await,
        BTreeSet::from(["llm/pod-b".to_owned()])
    );
    drop(indexer);
    api.abort();
    a.shutdown().await;
    b.shutdown().await;
}

//! A reload of the shared indexer's file: a model's index comes and goes with its
//! cache-aware group, a file without one or with an engine that cannot join changes
//! nothing, and a rotated lookup token is put in force.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use engine_sim::RunningEngine;
use router_config::{PrefixIndexerConfig, RouterConfig};
use router_http::{ReloadError, RunningIndexer};
use router_tokenize::ChatTokenizer;
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);
/// Where the tests' indexers listen: a free loopback port.
const LOCAL: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Models `m` on `sims[0]` (engine `E0`) and `k` on `sims[1]` (engine `K0`), each
/// cache-aware when named in `cache_aware`; `extra` engines join `m`.
fn config(sims: &[RunningEngine], cache_aware: &[&str], extra: &[Value]) -> RouterConfig {
    let model = |id: &str, engines: Vec<Value>| {
        let mut model = json!({"id": id, "tokenizer": common::byte_tokenizer(), "block_size": 16, "engines": engines});
        if cache_aware.contains(&id) {
            model["policies"] = json!({"plain": {"type": "cache_aware", "min_matched_tokens": 16}});
        }
        model
    };
    let mut m = vec![json!({"id": "E0", "url": sims[0].url(), "role": "plain"})];
    m.extend_from_slice(extra);
    let k = vec![json!({"id": "K0", "url": sims[1].url(), "role": "plain"})];
    let text = json!({"listen": "127.0.0.1:0", "models": [model("m", m), model("k", k)]});
    RouterConfig::from_yaml(&text.to_string()).expect("a configuration")
}

fn completion(prompt: &str) -> Value {
    json!({"model": "m", "prompt": prompt, "max_tokens": 1})
}

async fn served_by(engine: &RunningEngine, prompt: &str) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/completions", engine.url()))
        .json(&completion(prompt))
        .send()
        .await
        .expect("the engine answers");
    assert_eq!(response.status(), 200);
    response.bytes().await.expect("the body");
}

/// The lookup of `prompt` for `model`: its status, and the engines holding it.
async fn lookup(
    indexer: &RunningIndexer,
    model: &str,
    prompt: &str,
    token: Option<&str>,
) -> (u16, BTreeSet<String>) {
    let tokenizer = ChatTokenizer::load(&common::byte_tokenizer()).expect("the tokenizer");
    let body = completion(prompt).to_string();
    let ids = router_http::prompt_ids("/v1/completions", body.as_bytes(), &tokenizer).unwrap();
    let hashes =
        router_state::kv_events::PrefixIndex::new(Default::default()).request_hashes(None, &ids);
    let mut request = reqwest::Client::new()
        .post(format!("http://{}/v1/prefix/lookup", indexer.addr()))
        .json(&json!({"model": model, "hashes": hashes}));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("the indexer answers");
    let status = response.status().as_u16();
    let answer: Value = response.json().await.expect("json");
    let holders = (answer["engines"].as_array().into_iter().flatten())
        .map(|e| e[0].as_str().expect("an id").to_owned())
        .collect();
    (status, holders)
}

/// Waits until the indexer says exactly `want` hold `prompt` of `model`.
async fn held_by(indexer: &RunningIndexer, model: &str, prompt: &str, want: &[&str]) {
    let want: BTreeSet<String> = want.iter().map(|&e| e.to_owned()).collect();
    let wait = async {
        while lookup(indexer, model, prompt, None).await != (200, want.clone()) {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, wait)
        .await
        .unwrap_or_else(|_| panic!("the indexer never said {want:?} hold {model}'s prompt"));
}

fn prompt(name: &str) -> String {
    format!("{name}: {}", "a shared prefix of many pages. ".repeat(8))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_index_comes_and_goes_with_its_cache_aware_group() {
    let sims = common::kv_sims(3).await;
    let indexer = router_http::start_indexer(config(&sims, &["m"], &[]), LOCAL)
        .await
        .expect("the indexer starts");
    let (on_m, on_k) = (prompt("on m"), prompt("on k"));
    served_by(&sims[0], &on_m).await;
    served_by(&sims[1], &on_k).await;
    held_by(&indexer, "m", &on_m, &["E0"]).await;
    assert_eq!(lookup(&indexer, "k", &on_k, None).await.0, 404);

    let summary = (indexer.context())
        .reload(config(&sims, &["m", "k"], &[]))
        .await
        .expect("applied");
    assert_eq!((summary.added, summary.removed, summary.models), (1, 0, 2));
    held_by(&indexer, "k", &on_k, &["K0"]).await;
    held_by(&indexer, "m", &on_m, &["E0"]).await;

    // The routers' own sections are theirs to change; one the indexer reads is not.
    let mut routers_own = config(&sims, &["m", "k"], &[]);
    routers_own.listen = "127.0.0.1:1".parse().unwrap();
    routers_own.prefix_indexer = Some(PrefixIndexerConfig::new("http://10.0.0.5:30100"));
    (indexer.context().reload(routers_own).await).expect("applied");
    let mut limits = config(&sims, &["m", "k"], &[]);
    limits.limits.max_connections = 99;
    let refused = indexer.context().reload(limits).await;
    let Err(ReloadError::Invalid(problems)) = refused else {
        panic!("refused: {refused:?}");
    };
    assert!(
        problems[0].to_string().starts_with("limits"),
        "{problems:?}"
    );

    // Without a cache-aware model the file is refused, and nothing changes.
    let refused = indexer.context().reload(config(&sims, &[], &[])).await;
    let Err(ReloadError::Invalid(problems)) = refused else {
        panic!("refused: {refused:?}");
    };
    assert!(problems[0].to_string().contains("would index nothing"));
    // An engine that cannot join (no role, nothing answers at its address) fails the
    // reload, and what joined is undone (E8, which could join).
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let unreachable =
        json!({"id": "E9", "url": format!("http://{}", reserved.local_addr().unwrap())});
    let joins = json!({"id": "E8", "url": sims[2].url(), "role": "plain"});
    let failed = (indexer.context())
        .reload(config(&sims, &["m", "k"], &[joins, unreachable]))
        .await;
    assert!(matches!(failed, Err(ReloadError::Failed(_))), "{failed:?}");
    assert!(indexer.fleet().spec(&"E9".into()).is_none());
    assert!(
        indexer.fleet().spec(&"E8".into()).is_none(),
        "what joined is undone"
    );
    drop(reserved);
    held_by(&indexer, "m", &on_m, &["E0"]).await;

    let summary = (indexer.context())
        .reload(config(&sims, &["k"], &[]))
        .await
        .expect("applied");
    assert_eq!((summary.added, summary.removed, summary.models), (0, 1, 1));
    assert_eq!(lookup(&indexer, "m", &on_m, None).await.0, 404);
    assert!(indexer.fleet().spec(&"E0".into()).is_none());
    held_by(&indexer, "k", &on_k, &["K0"]).await;
    let scraped = reqwest::get(format!("http://{}/metrics", indexer.addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (outcome, n) in [("applied", 3), ("invalid", 2), ("failed", 1)] {
        let line = format!("switchyard_config_reloads_total{{outcome=\"{outcome}\"}} {n}\n");
        assert!(scraped.contains(&line), "{line} in {scraped}");
    }
    indexer.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_puts_a_rotated_lookup_token_in_force() {
    let sims = common::kv_sims(2).await;
    let dir = std::env::temp_dir().join(format!("switchyard-follows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "first\n").unwrap();
    let guarded = || {
        let mut config = config(&sims, &["m"], &[]);
        config.prefix_indexer = Some(PrefixIndexerConfig {
            token_file: Some(file.clone()),
            ..PrefixIndexerConfig::new("http://127.0.0.1:1")
        });
        config
    };
    let indexer = router_http::start_indexer(guarded(), LOCAL).await.unwrap();
    let on_m = prompt("on m");
    assert_eq!(lookup(&indexer, "m", &on_m, Some("first")).await.0, 200);
    std::fs::write(&file, "second\n").unwrap();
    indexer.context().reload(guarded()).await.expect("applied");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(lookup(&indexer, "m", &on_m, Some("first")).await.0, 401);
    assert_eq!(lookup(&indexer, "m", &on_m, Some("second")).await.0, 200);
    indexer.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

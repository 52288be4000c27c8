//! Reloading the configuration while the router serves: engines join and leave,
//! caps and buckets change in one step, in-flight requests finish, bindings and
//! prefix-index entries of unchanged engines survive, and a broken file is refused
//! with the old configuration still serving.

use crate::common;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{router, sim, url};
use engine_sim::RunningEngine;
use router_config::RouterConfig;
use router_http::{ReloadError, RunningRouter};
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A whole configuration: `models` and the sections a reload keeps the same.
fn config(models: Value) -> RouterConfig {
    let text = json!({
        "listen": "127.0.0.1:0",
        "health": {"interval_ms": 50, "timeout_ms": 5000, "failure_threshold": 3, "success_threshold": 1},
        "admin": {"token": "s3cret"},
        "models": models,
    })
    .to_string();
    RouterConfig::from_yaml(&text).expect("a configuration")
}

fn plain(id: &str, sim: &RunningEngine) -> Value {
    json!({"id": id, "url": sim.url(), "role": "plain"})
}

/// Sends a chat; answers the bucket and engine that served it.
async fn served(router: &RunningRouter, body: &Value) -> (String, String) {
    let response = reqwest::Client::new()
        .post(url(router, "/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200);
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
    let answer = (header("x-switchyard-bucket"), header("x-switchyard-engine"));
    response.bytes().await.expect("the body");
    answer
}

fn chat(prompt: &str) -> Value {
    common::chat("m", prompt)
}

async fn set_faults(sim: &RunningEngine, faults: Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/admin/faults", sim.url()))
        .json(&faults)
        .send()
        .await
        .expect("the engine answers");
    assert_eq!(response.status(), 200);
}

async fn reloads(router: &RunningRouter, outcome: &str) -> u64 {
    let metrics = common::metrics(router).await;
    let line = format!("switchyard_config_reloads_total{{outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str())?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_an_engine_changes_a_cap_and_removes_a_bucket_while_a_stream_runs() {
    let (a, b, c) = (sim(|_| {}).await, sim(|_| {}).await, sim(|_| {}).await);
    // `first` (A, one request at a time) is tried before `second` (B).
    let before = config(json!([{
        "id": "m",
        "engines": [plain("A", &a), plain("B", &b)],
        "buckets": [
            {"id": "first", "rank": 0, "groups": {"plain": {"engine_ids": ["A"], "policy": {"type": "round_robin", "admission": {"max_inflight_requests": 1}}}}},
            {"id": "second", "rank": 1, "groups": {"plain": {"engine_ids": ["B"]}}},
        ],
    }]));
    let router = router(before).await;
    assert_eq!(
        served(&router, &chat("one")).await,
        ("first".into(), "A".into())
    );

    // A stream held on A fills its cap: the next request goes to `second`.
    set_faults(&a, json!({"hold_after_chunks": 1})).await;
    let mut stream_body = chat("held");
    stream_body["stream"] = json!(true);
    let held = {
        let url = url(&router, "/v1/chat/completions");
        tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&stream_body)
                .send()
                .await
                .expect("the stream starts");
            assert_eq!(response.status(), 200);
            response.text().await.expect("the whole stream")
        })
    };
    within("the held stream", a.visits_until(|v| v.open == 1)).await;
    assert_eq!(
        served(&router, &chat("two")).await,
        ("second".into(), "B".into())
    );

    // The reload: C joins `first`, its cap becomes 2, `second` and B go.
    let after = config(json!([{
        "id": "m",
        "engines": [plain("A", &a), plain("C", &c)],
        "buckets": [
            {"id": "first", "rank": 0, "groups": {"plain": {"engine_ids": ["A", "C"], "policy": {"type": "round_robin", "admission": {"max_inflight_requests": 2}}}}},
        ],
    }]));
    let summary = router.context().reload(after).await.expect("applied");
    assert_eq!(
        (summary.added, summary.replaced, summary.removed),
        (1, 0, 1)
    );
    let mut engines = BTreeSet::new();
    for n in 0..6 {
        let (bucket, engine) = served(&router, &chat(&format!("after {n}"))).await;
        assert_eq!(bucket, "first", "the second bucket is gone");
        engines.insert(engine);
    }
    assert_eq!(
        engines,
        BTreeSet::from(["A".to_owned(), "C".to_owned()]),
        "C serves, and A takes a second request beside the held one (its new cap)"
    );
    assert!(
        router.context().fleet().snapshot().get("B").is_none(),
        "B left the fleet"
    );
    // The stream started before the reload ends as it would have.
    set_faults(&a, json!({})).await;
    let text = within("the held stream", held).await.expect("the task");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(reloads(&router, "applied").await, 1);

    // A broken file is refused whole and the configuration in force keeps serving.
    let broken = config(json!([{
        "id": "m",
        "engines": [plain("A", &a), plain("C", &c), plain("D", &b)],
        "buckets": [
            {"id": "first", "groups": {"plain": {"engine_ids": ["A", "nobody"]}}},
        ],
    }]));
    let Err(ReloadError::Invalid(errors)) = router.context().reload(broken).await else {
        panic!("a bucket naming an unknown engine is refused");
    };
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("models[0].buckets[0]")),
        "{errors:?}"
    );
    let mut moved = config(json!([{"id": "m", "engines": [plain("A", &a)]}]));
    moved.listen = "127.0.0.1:1".parse().unwrap();
    let Err(ReloadError::Invalid(errors)) = router.context().reload(moved).await else {
        panic!("a new listen address needs a restart");
    };
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "listen: changed: it takes effect only at a restart (a reload changes models, policies and the admin token)"
        ]
    );
    assert!(router.context().fleet().snapshot().get("D").is_none());
    let (bucket, _) = served(&router, &chat("still")).await;
    assert_eq!(bucket, "first");
    assert_eq!(reloads(&router, "invalid").await, 2);
    router.shutdown().await;
    for s in [a, b, c] {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_engine_without_a_role_fails_the_reload_and_changes_nothing() {
    let a = sim(|_| {}).await;
    let before = config(json!([{"id": "m", "engines": [plain("A", &a)]}]));
    let router = router(before).await;
    // Z joins with A's new URL; an engine without a role that does not answer
    // cannot join, so nothing of the reload stays. Its port is bound and never
    // listens, so no other test's server can take it meanwhile.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let unreachable = format!("http://{}", reserved.local_addr().unwrap());
    let after = config(json!([{"id": "m", "engines": [
        {"id": "A", "url": format!("{}/", a.url()), "role": "plain"},
        {"id": "Z", "url": unreachable},
    ]}]));
    let Err(ReloadError::Failed(errors)) = router.context().reload(after).await else {
        panic!("the reload fails");
    };
    assert!(
        errors[0].to_string().starts_with("models[0].engines[1]"),
        "{errors:?}"
    );
    let fleet = router.context().fleet().snapshot();
    assert!(
        fleet.get("Z").is_none(),
        "the engine that could not join is not kept"
    );
    assert_eq!(fleet.get("A").map(|e| e.url().to_owned()), Some(a.url()));
    assert_eq!(served(&router, &chat("after")).await.1, "A");
    assert_eq!(reloads(&router, "failed").await, 1);
    router.shutdown().await;
    a.shutdown().await;
    drop(reserved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_of_unchanged_engines_survive_a_reload() {
    let sims = [sim(|_| {}).await, sim(|_| {}).await, sim(|_| {}).await];
    let model = |engines: &[&RunningEngine]| {
        let engines: Vec<Value> = engines
            .iter()
            .enumerate()
            .map(|(i, s)| plain(&format!("E{i}"), s))
            .collect();
        config(
            json!([{"id": "m", "engines": engines, "policies": {"plain": {"type": "session_aware"}}}]),
        )
    };
    let router = router(model(&[&sims[0], &sims[1]])).await;
    let address = url(&router, "/v1/chat/completions");
    let session = |n: usize| {
        let address = address.clone();
        async move {
            let response = reqwest::Client::new()
                .post(address)
                .header("x-session-id", format!("s{n}"))
                .json(&chat("hello"))
                .send()
                .await
                .expect("the router answers");
            assert_eq!(response.status(), 200);
            response.headers()["x-switchyard-engine"]
                .to_str()
                .unwrap()
                .to_owned()
        }
    };
    let mut bound = Vec::new();
    for n in 0..8 {
        bound.push(session(n).await);
    }
    let store = Arc::clone(router.context().affinity().expect("a local store"));
    assert_eq!(store.len(), 8);
    router
        .context()
        .reload(model(&[&sims[0], &sims[1], &sims[2]]))
        .await
        .expect("applied");
    for (n, engine) in bound.iter().enumerate() {
        assert_eq!(&session(n).await, engine, "session {n} keeps its engine");
    }
    assert_eq!(store.len(), 8, "no binding was lost or added");
    assert!(Arc::ptr_eq(
        &store,
        router.context().affinity().expect("a local store")
    ));
    router.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

fn tokenizer() -> PathBuf {
    common::byte_tokenizer()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_index_entries_survive_a_reload_and_new_engines_feed_it() {
    let sims = common::kv_sims(3).await;
    let model = |n: usize| {
        let engines: Vec<Value> = sims[..n]
            .iter()
            .enumerate()
            .map(|(i, s)| plain(&format!("E{i}"), s))
            .collect();
        config(
            json!([{"id": "m", "tokenizer": tokenizer(), "block_size": 16, "engines": engines, "policies": {"plain": {"type": "cache_aware", "min_matched_tokens": 64}}}]),
        )
    };
    let router = router(model(2)).await;
    let fleet = Arc::clone(router.context().fleet());
    let index = fleet.prefix_index("m").expect("an index");
    let system = "You are a careful assistant. ".repeat(30);
    let prompt = |user: &str| json!({"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "max_tokens": 4});
    let stats = Arc::clone(fleet.kv_stats());
    let applied = |sims: &[RunningEngine]| {
        let published: u64 = sims.iter().map(|s| s.engine().published_batches()).sum();
        let stats = Arc::clone(&stats);
        async move {
            let mut seen = stats.steps();
            while stats.applied() < published {
                seen = stats.steps_after(seen).await;
            }
        }
    };
    let (_, holder) = served(&router, &prompt("first")).await;
    within("the first prompt's pages", applied(&sims)).await;
    let entries = index.size().entries;
    assert!(entries > 0);
    assert_eq!(
        served(&router, &prompt("again")).await.1,
        holder,
        "before the reload"
    );
    within("the second prompt's pages", applied(&sims)).await;
    let entries = index.size().entries;

    router.context().reload(model(3)).await.expect("applied");
    assert!(
        Arc::ptr_eq(&index, &fleet.prefix_index("m").expect("an index")),
        "the index is the same"
    );
    assert_eq!(index.size().entries, entries, "and keeps its entries");
    assert_eq!(
        served(&router, &prompt("second")).await.1,
        holder,
        "the prefix holder is found again"
    );
    let hits = format!("engine=\"{holder}\",reason=\"cache_hit\"}} 2");
    assert!(
        common::metrics(&router).await.contains(&hits),
        "before and after the reload, by a prefix match"
    );
    // The engine that joined feeds the same index: a conversation it serves (sent
    // to it directly) is indexed.
    let before = index.size().entries;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sims[2].url()))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "a different conversation altogether, long enough to fill a page or two of tokens"}], "max_tokens": 4}))
        .send()
        .await
        .expect("the engine answers");
    assert_eq!(response.status(), 200);
    response.bytes().await.expect("the body");
    within("the new engine's pages", applied(&sims)).await;
    assert!(index.size().entries > before);
    router.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_be_served_is_refused_before_anything_changes() {
    let (a, b) = (sim(|_| {}).await, sim(|_| {}).await);
    let router = router(config(json!([{"id": "m", "engines": [plain("A", &a)]}]))).await;
    let unreachable = b.url();
    b.shutdown().await;
    let after = config(json!([
        {"id": "m", "engines": [plain("A", &a)]},
        {"id": "n", "engines": [{"id": "N", "url": unreachable}]},
    ]));
    let Err(ReloadError::Failed(errors)) = router.context().reload(after).await else {
        panic!("the reload fails");
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].to_string().starts_with("models[1].engines[0]"),
        "{errors:?}"
    );
    let models: Value = reqwest::get(url(&router, "/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"].as_array().map(Vec::len), Some(1), "{models}");
    // SGLang's /generate names no model: the router still serves exactly one.
    let generated = reqwest::Client::new()
        .post(url(&router, "/generate"))
        .json(&json!({"text": "hello", "sampling_params": {"max_new_tokens": 2}}))
        .send()
        .await
        .unwrap();
    assert_eq!(generated.status(), 200);
    assert_eq!(reloads(&router, "failed").await, 1);
    router.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_the_admin_api_added_outlive_reloads() {
    let (a, b, x) = (sim(|_| {}).await, sim(|_| {}).await, sim(|_| {}).await);
    let router = router(config(json!([{"id": "m", "engines": [plain("A", &a)]}]))).await;
    let added = reqwest::Client::new()
        .post(url(&router, "/workers"))
        .bearer_auth("s3cret")
        .json(&json!({"id": "X", "url": x.url(), "model": "m", "role": "plain"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    router
        .context()
        .reload(config(
            json!([{"id": "m", "engines": [plain("A", &a), plain("B", &b)]}]),
        ))
        .await
        .expect("applied");
    let mut engines = BTreeSet::new();
    for n in 0..9 {
        engines.insert(served(&router, &chat(&format!("{n}"))).await.1);
    }
    assert_eq!(
        engines,
        BTreeSet::from(["A".to_owned(), "B".to_owned(), "X".to_owned()])
    );
    // The file drops the model: its own engines leave, X keeps serving it.
    let summary = router
        .context()
        .reload(config(json!([{"id": "k", "engines": [plain("B", &b)]}])))
        .await
        .expect("applied");
    assert_eq!(
        (summary.added, summary.replaced, summary.removed),
        (0, 1, 1)
    );
    assert_eq!(served(&router, &chat("still")).await.1, "X");
    assert!(router.context().fleet().snapshot().get("A").is_none());
    router.shutdown().await;
    for s in [a, b, x] {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_naming_an_engine_the_admin_api_added_is_rolled_back() {
    let (a, b, x) = (sim(|_| {}).await, sim(|_| {}).await, sim(|_| {}).await);
    let router = router(config(json!([{"id": "m", "engines": [plain("A", &a)]}]))).await;
    let added = reqwest::Client::new()
        .post(url(&router, "/workers"))
        .bearer_auth("s3cret")
        .json(&json!({"id": "X", "url": x.url(), "model": "m", "role": "plain"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let taken = config(json!([{"id": "m", "engines": [plain("A", &a), plain("X", &b)]}]));
    let Err(ReloadError::Failed(errors)) = router.context().reload(taken).await else {
        panic!("X is the admin API's");
    };
    assert_eq!(
        errors[0].to_string(),
        "models[0].engines[1]: engine X comes from the admin API, which alone may replace or remove it"
    );
    let fleet = router.context().fleet().snapshot();
    assert_eq!(fleet.get("X").map(|e| e.url().to_owned()), Some(x.url()));
    assert_eq!(reloads(&router, "failed").await, 1);
    router.shutdown().await;
    for s in [a, b, x] {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_prefix_index_is_filled_again_from_the_engines() {
    let sims = common::kv_sims(2).await;
    let model = |pages: usize| {
        let engines: Vec<Value> = sims
            .iter()
            .enumerate()
            .map(|(i, s)| plain(&format!("E{i}"), s))
            .collect();
        config(
            json!([{"id": "m", "tokenizer": tokenizer(), "block_size": 16, "prefix_index_pages": pages, "engines": engines, "policies": {"plain": {"type": "cache_aware", "min_matched_tokens": 64}}}]),
        )
    };
    let router = router(model(1 << 16)).await;
    let fleet = Arc::clone(router.context().fleet());
    let old = fleet.prefix_index("m").expect("an index");
    let system = "You are a careful assistant. ".repeat(30);
    let prompt = |user: &str| json!({"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "max_tokens": 4});
    let (_, holder) = served(&router, &prompt("first")).await;
    let stats = Arc::clone(fleet.kv_stats());
    let filled = |index: Arc<router_state::kv_events::PrefixIndex>| {
        let stats = Arc::clone(&stats);
        async move {
            let mut seen = stats.steps();
            while index.size().entries == 0 {
                seen = stats.steps_after(seen).await;
            }
        }
    };
    within("the first pages", filled(Arc::clone(&old))).await;
    router
        .context()
        .reload(model(1 << 15))
        .await
        .expect("applied");
    let new = fleet.prefix_index("m").expect("an index");
    assert!(!Arc::ptr_eq(&old, &new), "a new budget is a new index");
    // The engines' feeds start again into it, and their replay refills it.
    within("the replayed pages", filled(Arc::clone(&new))).await;
    assert_eq!(
        served(&router, &prompt("second")).await.1,
        holder,
        "the new index knows the holder"
    );
    router.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_the_fleet_refuses_rolls_the_reload_back() {
    let (a, c) = (sim(|_| {}).await, sim(|_| {}).await);
    let (prefill, decode) = (common::prefill_sim().await, common::decode_sim().await);
    let router = router(config(json!([{"id": "m", "engines": [plain("A", &a)]}]))).await;
    for (id, sim, role) in [("P", &prefill, "prefill"), ("D", &decode, "decode")] {
        let added = reqwest::Client::new()
            .post(url(&router, "/workers"))
            .bearer_auth("s3cret")
            .json(&json!({"id": id, "url": sim.url(), "model": "p", "role": role}))
            .send()
            .await
            .unwrap();
        assert_eq!(added.status(), 201, "{id}");
    }
    // C joins m, and A moves to p as a plain engine: the fleet refuses a plain
    // engine beside p's prefill/decode pair only when A is replaced, after C joined.
    let after = config(json!([
        {"id": "m", "engines": [plain("C", &c)]},
        {"id": "p", "engines": [plain("A", &a)]},
    ]));
    let Err(ReloadError::Failed(errors)) = router.context().reload(after).await else {
        panic!("the fleet refuses A in p");
    };
    assert!(
        errors[0].to_string().starts_with("models[1].engines[0]"),
        "{errors:?}"
    );
    let fleet = router.context().fleet().snapshot();
    assert!(fleet.get("C").is_none(), "C left again");
    assert_eq!(
        fleet.get("A").map(|e| e.model().to_owned()).as_deref(),
        Some("m")
    );
    assert_eq!(served(&router, &chat("after")).await.1, "A");
    assert_eq!(reloads(&router, "failed").await, 1);
    router.shutdown().await;
    for s in [a, c, prefill, decode] {
        s.shutdown().await;
    }
}

/// The status of `GET /workers` with `token`.
async fn workers_with(router: &RunningRouter, token: &str) -> u16 {
    reqwest::Client::new()
        .get(url(router, "/workers"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the router answers")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reads_the_admin_token_file_again() {
    let a = sim(|_| {}).await;
    let dir = std::env::temp_dir().join(format!("switchyard-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("admin-token");
    let rotate = |text: &str| {
        // Written beside and renamed over, as a Secret volume swaps its files.
        std::fs::write(dir.join("next"), text).unwrap();
        std::fs::rename(dir.join("next"), &token).unwrap();
    };
    let with_file = || {
        let mut config = config(json!([{"id": "m", "engines": [plain("A", &a)]}]));
        config.admin.token = None;
        config.admin.token_file = Some(token.clone());
        config
    };
    rotate("old-token\n");
    let router = router(with_file()).await;
    assert_eq!(workers_with(&router, "old-token").await, 200);

    rotate("new-token\n");
    router.context().reload(with_file()).await.expect("applied");
    assert_eq!(
        (
            workers_with(&router, "old-token").await,
            workers_with(&router, "new-token").await
        ),
        (401, 200),
        "the rotated token replaces the old one"
    );

    // A token file that cannot be read refuses the reload; the token in force stays.
    std::fs::remove_file(&token).unwrap();
    let Err(ReloadError::Invalid(errors)) = router.context().reload(with_file()).await else {
        panic!("a missing token file is refused");
    };
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [format!(
            "admin.token_file: {}: No such file or directory (os error 2)",
            token.display()
        )]
    );
    assert_eq!(workers_with(&router, "new-token").await, 200);

    rotate("newer-token\n");
    router
        .context()
        .reload(with_file())
        .await
        .expect("applied again");
    assert_eq!(workers_with(&router, "newer-token").await, 200);
    assert_eq!(
        (
            reloads(&router, "applied").await,
            reloads(&router, "invalid").await
        ),
        (2, 1)
    );
    std::fs::remove_dir_all(&dir).unwrap();
    router.shutdown().await;
    a.shutdown().await;
}

//! A prefix indexer shared by router replicas: it follows the engines' KV events, the
//! routers keep no index and ask it, they agree on the holder of a shared prefix, and
//! an indexer that is down or silent costs a `cache_unavailable` pick, never a
//! request.

use crate::common;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{router, url};
use engine_sim::RunningEngine;
use router_config::{PrefixIndexerConfig, RouterConfig};
use router_http::{RunningIndexer, RunningRouter};
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);
/// Where the tests' indexers listen: a free loopback port.
const LOCAL: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn tokenizer() -> PathBuf {
    common::byte_tokenizer()
}

/// One cache-aware model on `sims`, asking `indexer` when given.
fn config(sims: &[RunningEngine], indexer: Option<PrefixIndexerConfig>) -> RouterConfig {
    let engines: Vec<Value> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": format!("E{i}"), "url": s.url(), "role": "plain"}))
        .collect();
    let text = json!({
        "listen": "127.0.0.1:0",
        "models": [{"id": "m", "tokenizer": tokenizer(), "block_size": 16, "engines": engines,
                    "policies": {"plain": {"type": "cache_aware", "min_matched_tokens": 64}}}],
    })
    .to_string();
    let mut config = RouterConfig::from_yaml(&text).expect("a configuration");
    config.prefix_indexer = indexer;
    config
}

fn asking(indexer: &RunningIndexer, timeout_ms: u64) -> PrefixIndexerConfig {
    PrefixIndexerConfig {
        timeout_ms,
        ..PrefixIndexerConfig::new(format!("http://{}", indexer.addr()))
    }
}

/// Waits until the indexer has applied every KV batch the engines published.
async fn caught_up(indexer: &RunningIndexer, sims: &[RunningEngine]) {
    let published: u64 = sims.iter().map(|s| s.engine().published_batches()).sum();
    let stats = Arc::clone(indexer.fleet().kv_stats());
    within("the indexer applying the engines' events", async {
        let mut seen = stats.steps();
        while stats.applied() < published {
            seen = stats.steps_after(seen).await;
        }
    })
    .await;
}

fn chat(system: &str, user: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "max_tokens": 4})
}

async fn served(router: &RunningRouter, body: &Value) -> String {
    let response = reqwest::Client::new()
        .post(url(router, "/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200);
    let engine = response.headers()["x-switchyard-engine"]
        .to_str()
        .unwrap()
        .to_owned();
    response.bytes().await.expect("the body");
    engine
}

async fn picks(router: &RunningRouter, reason: &str) -> u64 {
    let reason = format!("reason=\"{reason}\"}} ");
    common::metrics(router)
        .await
        .lines()
        .filter(|l| l.starts_with("switchyard_picks_total{") && l.contains(&reason))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_an_indexer_agree_on_holders_without_an_index_of_their_own() {
    let sims = common::kv_sims(4).await;
    let indexer = router_http::start_indexer(config(&sims, None), LOCAL)
        .await
        .expect("the indexer starts");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(router(config(&sims, Some(asking(&indexer, 5_000)))).await);
    }
    for replica in &replicas {
        assert!(
            replica.context().fleet().prefix_index("m").is_none(),
            "a replica asking the indexer keeps no index"
        );
    }
    caught_up(&indexer, &sims).await;
    for p in 0..4 {
        let system = format!("Conversation {p}. {}", "Answer with care. ".repeat(30));
        let holder = served(&replicas[p % 2], &chat(&system, "first")).await;
        caught_up(&indexer, &sims).await;
        for (r, replica) in replicas.iter().enumerate() {
            assert_eq!(
                served(replica, &chat(&system, &format!("from replica {r}"))).await,
                holder,
                "prompt {p}"
            );
        }
        caught_up(&indexer, &sims).await;
    }
    let hits = picks(&replicas[0], "cache_hit").await + picks(&replicas[1], "cache_hit").await;
    assert_eq!(hits, 8, "every follow-up was a hit the indexer found");
    for replica in replicas {
        replica.shutdown().await;
    }
    indexer.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexer_down_or_silent_costs_a_cache_unavailable_pick_not_a_request() {
    let sims = common::kv_sims(2).await;
    let system = "Answer with care. ".repeat(30);
    // Accepts connections and never answers, counting them.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_config = PrefixIndexerConfig {
        timeout_ms: 100,
        ..PrefixIndexerConfig::new(format!("http://{}", silent.local_addr().unwrap()))
    };
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let held = tokio::spawn({
        let accepted = std::sync::Arc::clone(&accepted);
        async move {
            let mut open = Vec::new();
            loop {
                let (socket, _) = silent.accept().await.expect("accepts");
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                open.push(socket);
            }
        }
    });
    let waiting = router(config(&sims, Some(silent_config))).await;
    let started = tokio::time::Instant::now();
    for n in 0..10 {
        served(&waiting, &chat(&system, &format!("question {n}"))).await;
    }
    assert_eq!(picks(&waiting, "cache_unavailable").await, 10);
    // The first lookup's timeout opens the breaker: until its first cooldown (1 s)
    // has passed no lookup goes out, then one trial a cooldown, so however slow the
    // machine, at most one lookup a second reached the indexer, not one a request.
    let seconds = started.elapsed().as_secs() as usize;
    let reached = accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..=1 + seconds).contains(&reached),
        "{reached} lookups reached the silent indexer in {seconds} s"
    );
    waiting.shutdown().await;
    held.abort();

    // An indexer that went away: refused at once.
    let indexer = router_http::start_indexer(config(&sims, None), LOCAL)
        .await
        .unwrap();
    let gone = asking(&indexer, 5_000);
    indexer.shutdown().await;
    let refused = router(config(&sims, Some(gone))).await;
    served(&refused, &chat(&system, "after")).await;
    assert_eq!(picks(&refused, "cache_unavailable").await, 1);
    refused.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

/// The status line of a lookup of `media` whose head announces a body of `bytes`
/// (the body is never sent: an answer past the bound must not wait for it).
async fn too_long(addr: std::net::SocketAddr, media: &str, bytes: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/prefix/lookup HTTP/1.1\r\nhost: x\r\ncontent-type: {media}\r\ncontent-length: {bytes}\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 12];
    within("the 413", socket.read_exact(&mut answer))
        .await
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lookup_api_bounds_what_it_reads() {
    let sims = common::kv_sims(1).await;
    let indexer = router_http::start_indexer(config(&sims, None), LOCAL)
        .await
        .unwrap();
    let lookup = format!("http://{}/v1/prefix/lookup", indexer.addr());
    let client = reqwest::Client::new();
    let status = |body: Vec<u8>| {
        let (client, lookup) = (client.clone(), lookup.clone());
        async move {
            client
                .post(lookup)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let hashes = |n: usize| {
        json!({"model": "m", "hashes": vec![7u64; n]})
            .to_string()
            .into_bytes()
    };
    assert_eq!(status(hashes(3)).await, 200);
    let answer: Value = client
        .post(&lookup)
        .json(&json!({"model": "m", "hashes": [1, 2, 3]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer,
        json!({"query_blocks": 3, "block_size": 16, "engines": [], "ranks": []})
    );
    assert_eq!(status(b"not json".to_vec()).await, 400);
    assert_eq!(status(hashes((1 << 16) + 1)).await, 400, "too many hashes");
    assert_eq!(
        too_long(indexer.addr(), "application/json", 2 << 20).await,
        "HTTP/1.1 413",
        "a body past the bound"
    );
    assert_eq!(
        status(
            json!({"model": "other", "hashes": [1]})
                .to_string()
                .into_bytes()
        )
        .await,
        404
    );
    assert_eq!(
        status(
            json!({"model": "m", "hashes": [1], "extra": 1})
                .to_string()
                .into_bytes()
        )
        .await,
        400
    );
    // Routers configured for no cache-aware model leave the indexer nothing to do.
    let mut plain = config(&sims, None);
    plain.models[0].policies.plain = None;
    let refused = router_http::start_indexer(plain, LOCAL)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("the indexer would index nothing"),
        "{refused}"
    );
    indexer.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

/// The media type of a binary lookup.
const BINARY: &str = "application/vnd.switchyard.prefix-lookup";

/// A binary lookup of `model`: flags, the name's length, the name, the hashes.
fn binary(flags: u8, model: &str, hashes: &[u64]) -> Vec<u8> {
    let mut body = vec![flags, u8::try_from(model.len()).unwrap()];
    body.extend_from_slice(model.as_bytes());
    for hash in hashes {
        body.extend_from_slice(&hash.to_le_bytes());
    }
    body
}

// A lookup in binary (what routers send) is answered as the same lookup in JSON
// (what earlier routers send) is; what does not fit the binary encoding or its
// bounds is refused with why, and the JSON one still works beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_and_json_lookups_are_answered_alike_within_their_bounds() {
    use router_state::kv_events::{chain_hashes, namespace_seed};
    let sims = common::kv_sims(2).await;
    let indexer = router_http::start_indexer(config(&sims, None), LOCAL)
        .await
        .unwrap();
    let tokens: Vec<u32> = (0..160).collect();
    sims[1].engine().serve(tokens.clone(), 1).await;
    caught_up(&indexer, &sims).await;
    let hashes = chain_hashes(&tokens, 16, namespace_seed(None));
    let lookup = format!("http://{}/v1/prefix/lookup", indexer.addr());
    let client = reqwest::Client::new();
    let ask = |media: &'static str, body: Vec<u8>| {
        let request = client
            .post(&lookup)
            .header("content-type", media)
            .body(body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    let by_json = json!({"model": "m", "hashes": hashes}).to_string();
    let (status, answer) = ask("application/json", by_json.into_bytes()).await;
    assert_eq!(status, 200);
    let mut read: Value = serde_json::from_str(&answer).unwrap();
    // How late the engine's batch arrived depends on the machine's load.
    read.as_object_mut().unwrap().remove("feed_age_ms");
    assert_eq!(
        read,
        json!({"query_blocks": 10, "block_size": 16, "engines": [["E1", 10]], "ranks": [["E1", 0]]})
    );
    assert_eq!(
        ask(BINARY, binary(0, "m", &hashes)).await,
        (status, answer.clone())
    );
    assert_eq!(
        ask(
            "Application/Vnd.Switchyard.Prefix-Lookup; version=1",
            binary(1, "m", &hashes)
        )
        .await,
        (status, answer),
        "a dry run, the media type's case and parameters aside"
    );
    assert_eq!(ask(BINARY, binary(0, "other", &hashes)).await.0, 404);

    let refused = |(status, answer): (u16, String)| {
        assert_eq!(status, 400, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        answer["error"]["message"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        refused(ask(BINARY, vec![0]).await),
        "not a binary lookup: shorter than its 2-byte header"
    );
    assert_eq!(
        refused(ask(BINARY, binary(4, "m", &hashes)).await),
        "not a binary lookup: flags other than bit 0 (a dry run) are set"
    );
    let mut ragged = binary(0, "m", &hashes);
    ragged.pop();
    assert_eq!(
        refused(ask(BINARY, ragged).await),
        "not a binary lookup: the hashes are not whole 8-byte words"
    );
    assert_eq!(
        refused(ask(BINARY, vec![0, 9, b'm']).await),
        "not a binary lookup: the model name runs past the body"
    );
    assert_eq!(
        refused(ask(BINARY, binary(0, "m", &vec![7; (1 << 16) + 1])).await),
        "not a binary lookup: more block hashes than a lookup may carry (65,536)"
    );
    assert!(
        refused(ask(BINARY, b"{\"model\": \"m\", \"hashes\": [1]}".to_vec()).await)
            .starts_with("not a binary lookup: "),
        "JSON sent as binary is read as binary"
    );
    // Past the binary bound (2 + 128 + 8 x 65,536 bytes), below the JSON one.
    assert_eq!(
        too_long(indexer.addr(), BINARY, 2 + 128 + (8 << 16) + 1).await,
        "HTTP/1.1 413"
    );
    indexer.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

/// The status of a lookup sent with `authorization`, if any.
async fn lookup_status(indexer: &RunningIndexer, authorization: Option<&str>) -> u16 {
    let mut request = reqwest::Client::new()
        .post(format!("http://{}/v1/prefix/lookup", indexer.addr()))
        .json(&json!({"model": "m", "hashes": [1, 2, 3]}));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_indexer_answers_only_lookups_that_carry_it() {
    let sims = common::kv_sims(1).await;
    let mut guarded = config(&sims, None);
    // The routers' file: the indexer takes the token from it and ignores the rest.
    guarded.prefix_indexer = Some(PrefixIndexerConfig {
        token: Some("s3cret".into()),
        ..PrefixIndexerConfig::new("http://127.0.0.1:1")
    });
    let indexer = router_http::start_indexer(guarded, LOCAL).await.unwrap();
    assert_eq!(lookup_status(&indexer, None).await, 401);
    assert_eq!(lookup_status(&indexer, Some("Bearer s3cre")).await, 401);
    assert_eq!(lookup_status(&indexer, Some("Bearer s3cret")).await, 200);
    let refused = reqwest::get(format!("http://{}/metrics", indexer.addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        refused.contains("switchyard_indexer_lookups_unauthorized_total 2"),
        "{refused}"
    );

    // A router with the token (from a file) is answered; one without is refused,
    // which costs it a `cache_unavailable` pick, not the request.
    let dir = std::env::temp_dir().join(format!("switchyard-indexer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "s3cret\n").unwrap();
    let system = "Answer with care. ".repeat(30);
    let holding = router(config(
        &sims,
        Some(PrefixIndexerConfig {
            token_file: Some(file),
            ..asking(&indexer, 5_000)
        }),
    ))
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
    served(&holding, &chat(&system, "with the token")).await;
    assert_eq!(picks(&holding, "cache_unavailable").await, 0);
    let lacking = router(config(&sims, Some(asking(&indexer, 5_000)))).await;
    served(&lacking, &chat(&system, "without it")).await;
    assert_eq!(picks(&lacking, "cache_unavailable").await, 1);
    holding.shutdown().await;
    lacking.shutdown().await;
    indexer.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

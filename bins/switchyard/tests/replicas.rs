//! Several router processes behind a load balancer: three `switchyard serve`
//! replicas in front of eight simulated engines, a client that spreads each
//! conversation's turns over the replicas the way a round-robin balancer does, and
//! a replica or the Redis server killed mid-run (`under_load`: killed and restarted,
//! with a shared prefix indexer).

use crate::common;

mod under_load;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Replica, TempFile};
use engine_sim::{RunningEngine, SimConfig};
use router_state::test_util::RedisServer;
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs milliseconds.
pub(crate) const GUARD: Duration = Duration::from_secs(30);
const SESSIONS: usize = 16;
pub(crate) const PAGE: u32 = 16;

pub(crate) fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-bytes/tokenizer.json")
}

pub(crate) async fn engines(n: usize) -> Vec<RunningEngine> {
    let mut engines = Vec::new();
    for _ in 0..n {
        let mut config = SimConfig::for_tests();
        config.model = "m".into();
        config.tokenizer = Some(tokenizer());
        config.page_size = PAGE;
        config.kv_port = Some(0);
        config.replay_port = Some(0);
        config.output_tokens = 4;
        engines.push(engine_sim::start(config).await.expect("the engine starts"));
    }
    engines
}

/// A configuration file of one model on `engines` with the plain group's `policy`
/// and the `affinity` section given; the file lives as long as the returned guard.
fn config_file(engines: &[RunningEngine], policy: Value, affinity: Value) -> TempFile {
    let members = common::plain_members(engines);
    // YAML is a superset of JSON.
    let config = json!({
        "listen": "127.0.0.1:0",
        "models": [{
            "id": "m",
            "tokenizer": tokenizer(),
            "block_size": PAGE,
            "engines": members,
            "policies": {"plain": policy},
        }],
        "health": {"interval_ms": 50, "timeout_ms": 5000, "failure_threshold": 3, "success_threshold": 1},
        "affinity": affinity,
    });
    TempFile::new(&config.to_string())
}

/// What a balancer saw of one request.
#[derive(Debug)]
enum Outcome {
    /// Served by this engine.
    Served(String),
    /// Lost with the replica it had reached.
    Lost(SocketAddr),
}

/// A round-robin balancer over the replicas: a turn goes to the replica after the
/// session's last one; a replica that refuses the connection (it is gone) is
/// skipped, so only a request that reached a replica can be lost with it.
async fn send(
    client: &reqwest::Client,
    addrs: &[SocketAddr],
    first: usize,
    session: &str,
) -> Outcome {
    for attempt in 0..addrs.len() {
        let addr = addrs[(first + attempt) % addrs.len()];
        let sent = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("x-session-id", session)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": format!("{session}: hello")}], "max_tokens": 4}))
            .send()
            .await;
        match sent {
            Ok(response) => {
                assert_eq!(response.status(), 200, "{session} via {addr}");
                let engine = response.headers()["x-switchyard-engine"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                return match response.bytes().await {
                    Ok(_) => Outcome::Served(engine),
                    Err(_) => Outcome::Lost(addr),
                };
            }
            Err(e) if e.is_connect() => continue,
            Err(_) => return Outcome::Lost(addr),
        }
    }
    panic!("no replica accepted {session}");
}

/// Something done once, mid-run, by the request that reaches a count.
type Midway = Arc<parking_lot::Mutex<Option<Box<dyn FnOnce() + Send>>>>;

fn midway(action: impl FnOnce() + Send + 'static) -> Midway {
    Arc::new(parking_lot::Mutex::new(Some(Box::new(action))))
}

/// Runs `turns` turns of every session at once, turn `t` of session `s` first to
/// replica `s + t`; the session whose request is the `after`th done runs `midway`
/// before its next turn, while the other sessions go on. Returns the outcomes by
/// session.
async fn run(
    client: &reqwest::Client,
    addrs: &[SocketAddr],
    turns: std::ops::Range<usize>,
    after: usize,
    midway: &Midway,
) -> BTreeMap<String, Vec<Outcome>> {
    let done = Arc::new(AtomicUsize::new(0));
    let tasks = (0..SESSIONS).map(|s| {
        let (client, addrs, turns) = (client.clone(), addrs.to_vec(), turns.clone());
        let (done, midway) = (Arc::clone(&done), Arc::clone(midway));
        tokio::spawn(async move {
            let session = format!("conversation-{s}");
            let mut outcomes = Vec::new();
            for t in turns {
                outcomes.push(send(&client, &addrs, s + t, &session).await);
                if done.fetch_add(1, Ordering::AcqRel) + 1 == after
                    && let Some(action) = midway.lock().take()
                {
                    action();
                }
            }
            (session, outcomes)
        })
    });
    let outcomes = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("the session runs"))
        .collect();
    assert!(midway.lock().is_none(), "the mid-run action ran");
    outcomes
}

fn served(outcomes: &[Outcome]) -> BTreeSet<&str> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Served(engine) => Some(engine.as_str()),
            Outcome::Lost(_) => None,
        })
        .collect()
}

/// Asserts that every lost request had reached the replica at `killed`.
fn lost_only_on(outcomes: &BTreeMap<String, Vec<Outcome>>, killed: SocketAddr) {
    for (session, outcomes) in outcomes {
        for outcome in outcomes {
            if let Outcome::Lost(addr) = outcome {
                assert_eq!(
                    *addr, killed,
                    "{session}: only requests that reached the killed replica are lost"
                );
            }
        }
    }
}

/// Three replicas of `file`; one is killed a sixth of the way through six turns of
/// every session, and every session's turns must land on one engine (only requests
/// that had reached the killed replica may be lost). Returns the replicas left and
/// the addresses of all three.
async fn sticky_through_a_replica_loss(file: &TempFile) -> (Vec<Replica>, Vec<SocketAddr>) {
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(&file.0, &[]).await);
    }
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    let mut doomed = replicas.pop().expect("three replicas");
    let kill = midway(move || doomed.kill());
    let client = reqwest::Client::new();
    let outcomes = tokio::time::timeout(GUARD, run(&client, &addrs, 0..6, SESSIONS, &kill))
        .await
        .expect("the sessions finish");
    lost_only_on(&outcomes, addrs[2]);
    let mut used = BTreeSet::new();
    for (session, outcomes) in &outcomes {
        let engines = served(outcomes);
        assert_eq!(engines.len(), 1, "{session}: {outcomes:?}");
        used.extend(engines);
    }
    assert!(
        used.len() >= 4,
        "sessions spread over the engines: {used:?}"
    );
    (replicas, addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_every_turn_of_a_session_lands_on_one_engine_through_a_replica_loss_and_an_outage()
 {
    let redis = RedisServer::start();
    let sims = engines(8).await;
    // Without the local cache every turn asks Redis, so the outage is met at once.
    let file = config_file(
        &sims,
        json!({"type": "session_aware"}),
        json!({"backend": "redis", "redis": {"url": redis.url(), "timeout_ms": 5000, "reconnect_interval_ms": 50, "local_cache_ms": 0}}),
    );
    // A replica dies a sixth of the way through: its sessions' next turns go to the
    // others, which find the bindings in Redis.
    let (replicas, addrs) = sticky_through_a_replica_loss(&file).await;
    let client = reqwest::Client::new();

    // Redis dies mid-run: nothing fails, the replicas bind locally and say so.
    let redis_pid = redis.pid().expect("Redis runs");
    let outage = midway(move || drop(redis));
    let second = tokio::time::timeout(GUARD, run(&client, &addrs[..2], 6..12, SESSIONS, &outage))
        .await
        .expect("the sessions finish");
    assert!(
        !std::path::Path::new(&format!("/proc/{redis_pid}")).exists(),
        "Redis was stopped (its handle kills it by pid when dropped)"
    );
    assert!(
        second
            .values()
            .flatten()
            .all(|o| matches!(o, Outcome::Served(_))),
        "Redis is never in the way of a request: {second:?}"
    );
    let mut fallbacks = 0.0;
    for replica in &replicas {
        assert_eq!(
            replica
                .metric(&client, "switchyard_affinity_backend_up ")
                .await,
            0.0
        );
        fallbacks += replica
            .metric(&client, "switchyard_affinity_local_fallbacks_total ")
            .await;
    }
    assert!(fallbacks > 0.0, "the outage is counted");
    drop(replicas);
    for sim in sims {
        sim.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_rendezvous_replicas_agree_with_nothing_shared_through_a_replica_loss() {
    let sims = engines(8).await;
    let file = config_file(
        &sims,
        json!({"type": "session_aware"}),
        json!({"backend": "rendezvous"}),
    );
    let (replicas, _) = sticky_through_a_replica_loss(&file).await;
    drop(replicas);
    for sim in sims {
        sim.shutdown().await;
    }
}

/// Waits until every replica (or indexer) has applied every KV batch the engines
/// published.
pub(crate) async fn caught_up(
    client: &reqwest::Client,
    replicas: &[Replica],
    sims: &[RunningEngine],
) {
    let published: u64 = sims.iter().map(|e| e.engine().published_batches()).sum();
    let wait = async {
        for replica in replicas {
            while replica
                .metric(
                    client,
                    "switchyard_kv_feed_events_total{event=\"applied\"} ",
                )
                .await
                < published as f64
            {
                tokio::task::yield_now().await;
            }
        }
    };
    tokio::time::timeout(GUARD, wait)
        .await
        .expect("every replica applies the engines' KV events");
}

async fn chat(client: &reqwest::Client, replica: &Replica, system: &str, user: &str) -> String {
    let response = client
        .post(replica.url("/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ], "max_tokens": 4}))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_picks_agree_across_replicas() {
    let sims = engines(8).await;
    let file = config_file(
        &sims,
        json!({"type": "cache_aware", "min_matched_tokens": 64}),
        json!({}),
    );
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(&file.0, &[]).await);
    }
    let client = reqwest::Client::new();
    caught_up(&client, &replicas, &sims).await;
    let mut holders = BTreeSet::new();
    for p in 0..8 {
        let system = format!(
            "You are assistant number {p}. {}",
            "Answer briefly and well. ".repeat(40)
        );
        let holder = chat(&client, &replicas[p % 3], &system, "first question").await;
        caught_up(&client, &replicas, &sims).await;
        for (r, replica) in replicas.iter().enumerate() {
            assert_eq!(
                chat(
                    &client,
                    replica,
                    &system,
                    &format!("a question to replica {r}")
                )
                .await,
                holder,
                "prompt {p}: every replica sends the shared prefix to its holder"
            );
        }
        caught_up(&client, &replicas, &sims).await;
        holders.insert(holder);
    }
    assert!(holders.len() >= 2, "the prefixes spread: {holders:?}");
    let mut hits = 0.0;
    for replica in &replicas {
        hits += replica.sum(&client, "reason=\"cache_hit\"").await;
    }
    assert_eq!(hits, 24.0, "every follow-up was a cache hit");
    drop(replicas);
    for sim in sims {
        sim.shutdown().await;
    }
}

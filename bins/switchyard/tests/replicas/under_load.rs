//! Three replicas with rendezvous affinity and a shared prefix indexer under traffic
//! of conversations (a `session_aware` bucket) and of prompts sharing long prefixes
//! (a `cache_aware` bucket asking the indexer), one replica killed and restarted
//! mid-run, against one replica alone serving the same traffic on a fresh fleet.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use engine_sim::RunningEngine;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::{GUARD, PAGE, caught_up, engines, tokenizer};
use crate::common::{self, Replica, TempFile};

const SESSIONS: usize = 12;
/// Prompts sharing a long prefix, each sent once a turn by a client of its own.
const SHARED: usize = 4;
const TURNS: usize = 6;
/// Prompts longer than this go to the cache-aware bucket.
const SHORT_PROMPT: u32 = 1500;

/// The fleet's file (for the indexer), or the routers' when `indexer` is given: a
/// `session_aware` bucket for short prompts, a `cache_aware` one for long.
fn config_file(engines: &[RunningEngine], indexer: Option<SocketAddr>) -> TempFile {
    let members = common::plain_members(engines);
    let mut config = json!({
        "listen": "127.0.0.1:0",
        "models": [{
            "id": "m",
            "tokenizer": tokenizer(),
            "block_size": PAGE,
            "engines": members,
            "buckets": [
                {"id": "sessions", "limits": {"max": SHORT_PROMPT}, "groups": {"plain": {"policy": {"type": "session_aware"}}}},
                {"id": "shared", "limits": {"min": SHORT_PROMPT + 1}, "groups": {"plain": {"policy": {"type": "cache_aware", "min_matched_tokens": 64, "load_bound": null}}}},
            ],
        }],
        "health": {"interval_ms": 50, "timeout_ms": 5000, "failure_threshold": 3, "success_threshold": 1},
        "affinity": {"backend": "rendezvous"},
    });
    if let Some(addr) = indexer {
        config["prefix_indexer"] = json!({"url": format!("http://{addr}"), "timeout_ms": 5000});
    }
    TempFile::new(&config.to_string())
}

/// The `t`-th turn of client `c`: a conversation's turns so far (with its session
/// key), or a question after a long shared prefix.
fn turn(c: usize, t: usize) -> (Value, Option<String>) {
    if c < SESSIONS {
        let mut messages =
            vec![json!({"role": "system", "content": format!("You talk with user {c}.")})];
        for i in 0..=t {
            if i > 0 {
                messages.push(json!({"role": "assistant", "content": "Noted."}));
            }
            messages.push(
                json!({"role": "user", "content": format!("Turn {i} of conversation {c}: go on.")}),
            );
        }
        (
            json!({"model": "m", "messages": messages, "max_tokens": 4}),
            Some(format!("conversation-{c}")),
        )
    } else {
        let p = c - SESSIONS;
        let system = format!(
            "You are assistant number {p}. {}",
            "Answer briefly and well. ".repeat(80)
        );
        let messages = json!([{"role": "system", "content": system}, {"role": "user", "content": format!("question {t}")}]);
        (
            json!({"model": "m", "messages": messages, "max_tokens": 4}),
            None,
        )
    }
}

/// What a balancer saw of one request.
#[derive(Debug)]
enum Outcome {
    /// Served by `engine` through the replica at `via`, with the answer's usage.
    Served {
        engine: String,
        via: SocketAddr,
        cached: u64,
        prompt: u64,
    },
    /// Lost with the replica it had reached.
    Lost(SocketAddr),
}

/// A round-robin balancer: the request goes to `addrs[first]`, or the next replica
/// when one refuses the connection (it is gone).
async fn send(
    client: &reqwest::Client,
    addrs: &[SocketAddr],
    first: usize,
    c: usize,
    t: usize,
) -> Outcome {
    let (body, session) = turn(c, t);
    for attempt in 0..addrs.len() {
        let addr = addrs[(first + attempt) % addrs.len()];
        let mut request = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .json(&body);
        if let Some(session) = &session {
            request = request.header("x-session-id", session);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_connect() => continue,
            Err(_) => return Outcome::Lost(addr),
        };
        assert_eq!(response.status(), 200, "client {c} turn {t} via {addr}");
        let engine = response.headers()["x-switchyard-engine"]
            .to_str()
            .unwrap()
            .to_owned();
        let Ok(answer) = response.json::<Value>().await else {
            return Outcome::Lost(addr);
        };
        let usage = &answer["usage"];
        return Outcome::Served {
            engine,
            via: addr,
            cached: usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            prompt: usage["prompt_tokens"]
                .as_u64()
                .expect("the engine reports its prompt tokens"),
        };
    }
    panic!("no replica accepted client {c}'s turn {t}");
}

/// Every client's `turns` at once, turn `t` of client `c` first to replica `c + t`;
/// the request that is the `after`th done runs `midway`. The outcomes by client.
async fn traffic(
    client: &reqwest::Client,
    addrs: &[SocketAddr],
    turns: Range<usize>,
    after: usize,
    midway: Option<Box<dyn FnOnce() + Send>>,
) -> Vec<Vec<Outcome>> {
    let done = Arc::new(AtomicUsize::new(0));
    let midway = Arc::new(parking_lot::Mutex::new(midway));
    let tasks = (0..SESSIONS + SHARED).map(|c| {
        let (client, addrs, turns) = (client.clone(), addrs.to_vec(), turns.clone());
        let (done, midway) = (Arc::clone(&done), Arc::clone(&midway));
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for t in turns {
                outcomes.push(send(&client, &addrs, c + t, c, t).await);
                if done.fetch_add(1, Ordering::AcqRel) + 1 == after
                    && let Some(action) = midway.lock().take()
                {
                    action();
                }
            }
            outcomes
        })
    });
    let outcomes = tokio::time::timeout(GUARD, futures_util::future::join_all(tasks))
        .await
        .expect("the clients finish")
        .into_iter()
        .map(|r| r.expect("a client runs"))
        .collect();
    assert!(midway.lock().is_none(), "the mid-run action ran");
    outcomes
}

/// Engines, an indexer following them, the routers' file, and each shared prefix
/// sent once through `first` and indexed (the holders both runs start from).
struct Fleet {
    sims: Vec<RunningEngine>,
    indexer: Replica,
    routed: TempFile,
    _plain: TempFile,
}

impl Fleet {
    async fn start(client: &reqwest::Client) -> Self {
        let sims = engines(8).await;
        let plain = config_file(&sims, None);
        let indexer = Replica::indexer(&plain.0, &[]).await;
        let routed = config_file(&sims, Some(indexer.addr));
        caught_up(client, std::slice::from_ref(&indexer), &sims).await;
        Self {
            sims,
            indexer,
            routed,
            _plain: plain,
        }
    }

    async fn warm(&self, client: &reqwest::Client, first: &Replica) {
        for p in 0..SHARED {
            assert!(matches!(
                send(client, &[first.addr], 0, SESSIONS + p, TURNS).await,
                Outcome::Served { .. }
            ));
            caught_up(client, std::slice::from_ref(&self.indexer), &self.sims).await;
        }
    }

    async fn stop(self) {
        drop(self.indexer);
        for sim in self.sims {
            sim.shutdown().await;
        }
    }
}

/// Reported cached tokens over prompt tokens, of every served request.
fn cached_share(outcomes: &[Vec<Outcome>]) -> f64 {
    let (mut cached, mut prompt) = (0, 0);
    for outcome in outcomes.iter().flatten() {
        if let Outcome::Served {
            cached: c,
            prompt: p,
            ..
        } = outcome
        {
            cached += c;
            prompt += p;
        }
    }
    cached as f64 / prompt as f64
}

/// Each conversation's engines.
fn session_engines(outcomes: &[Vec<Outcome>]) -> Vec<BTreeSet<&str>> {
    outcomes[..SESSIONS]
        .iter()
        .map(|turns| {
            turns
                .iter()
                .filter_map(|o| match o {
                    Outcome::Served { engine, .. } => Some(engine.as_str()),
                    Outcome::Lost(_) => None,
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_and_restarted_under_load_loses_only_its_requests_and_keeps_sessions_and_cache()
 {
    let client = reqwest::Client::new();

    // One replica alone: the reference.
    let fleet = Fleet::start(&client).await;
    let alone = Replica::start(&fleet.routed.0, &[]).await;
    fleet.warm(&client, &alone).await;
    let reference = traffic(&client, &[alone.addr], 0..TURNS, 0, None).await;
    drop(alone);
    fleet.stop().await;

    // Three replicas; the third is killed after a third of the first half's requests,
    // and restarted while the others serve.
    let fleet = Fleet::start(&client).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(&fleet.routed.0, &[]).await);
    }
    fleet.warm(&client, &replicas[0]).await;
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    let mut doomed = replicas.pop().expect("three replicas");
    let restarted: Arc<parking_lot::Mutex<Option<JoinHandle<Replica>>>> = Arc::default();
    let kill = {
        let (restarted, file) = (Arc::clone(&restarted), fleet.routed.0.clone());
        Box::new(move || {
            doomed.kill();
            *restarted.lock() = Some(tokio::spawn(
                async move { Replica::start(&file, &[]).await },
            ));
        })
    };
    let half = TURNS / 2;
    let mut outcomes = traffic(
        &client,
        &addrs,
        0..half,
        (SESSIONS + SHARED) / 3 + 1,
        Some(kill),
    )
    .await;
    let handle = restarted.lock().take().expect("the restart began");
    let again = tokio::time::timeout(GUARD, handle)
        .await
        .expect("the replica restarts")
        .expect("it starts");
    let second_addrs = [addrs[0], addrs[1], again.addr];
    let second = traffic(&client, &second_addrs, half..TURNS, 0, None).await;
    for (all, more) in outcomes.iter_mut().zip(second) {
        all.extend(more);
    }

    let mut lost = 0;
    let mut via_restarted = 0;
    for outcome in outcomes.iter().flatten() {
        match outcome {
            Outcome::Lost(addr) => {
                assert_eq!(
                    *addr, addrs[2],
                    "only requests that reached the killed replica are lost"
                );
                lost += 1;
            }
            Outcome::Served { via, .. } => via_restarted += usize::from(*via == again.addr),
        }
    }
    assert!(
        lost <= SESSIONS + SHARED,
        "at most one request a client was in flight: {lost}"
    );
    assert!(via_restarted > 0, "the restarted replica serves");
    let sticky = session_engines(&outcomes);
    for (s, (engines, alone)) in sticky.iter().zip(session_engines(&reference)).enumerate() {
        assert_eq!(
            engines.len(),
            1,
            "conversation {s} stays on one engine: {engines:?}"
        );
        assert_eq!(
            *engines, alone,
            "conversation {s}: the engine one replica alone picks"
        );
    }
    let (share, alone_share) = (cached_share(&outcomes), cached_share(&reference));
    assert!(
        alone_share > 0.5,
        "the traffic reuses its prefixes: {alone_share}"
    );
    assert!(
        (share - alone_share).abs() <= 0.05,
        "cached share {share:.3} with three replicas, {alone_share:.3} with one"
    );
    drop(replicas);
    drop(again);
    fleet.stop().await;
}

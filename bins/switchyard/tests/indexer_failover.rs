//! Two `switchyard indexer` processes serving one fleet of simulated engines, two
//! router replicas naming both (`prefix_indexer.urls`), traffic of prompts that
//! share prefixes through both replicas, and the first indexer killed mid-run.

use crate::common::{self, Replica, TempFile};
use crate::replicas::{GUARD, PAGE, caught_up, engines, tokenizer};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use engine_sim::RunningEngine;
use serde_json::{Value, json};

/// Prompts sharing a prefix: their first turns, then `FOLLOW_UPS` follow-ups each.
const PREFIXES: usize = 8;
const FOLLOW_UPS: usize = 8;
/// Clients sending follow-ups at once, each its own prefixes one after another.
const CLIENTS: usize = 4;
/// The follow-up after which the first indexer is killed.
const KILL_AFTER: usize = 16;

/// A configuration file of one model on `engines` with a cache-aware group and,
/// when given, the `prefix_indexer` section.
fn config_file(engines: &[RunningEngine], indexer: Option<Value>) -> TempFile {
    let members = common::plain_members(engines);
    let mut config = json!({
        "listen": "127.0.0.1:0",
        "models": [{
            "id": "m",
            "tokenizer": tokenizer(),
            "block_size": PAGE,
            "engines": members,
            // No load bound: a prefix stays on its holder whatever the others' load.
            "policies": {"plain": {"type": "cache_aware", "min_matched_tokens": 64, "load_bound": null}},
        }],
        "health": {"interval_ms": 50, "timeout_ms": 5000, "failure_threshold": 3, "success_threshold": 1},
    });
    if let Some(indexer) = indexer {
        config["prefix_indexer"] = indexer;
    }
    TempFile::new(&config.to_string())
}

fn system(p: usize) -> String {
    format!(
        "You are assistant number {p}. {}",
        "Answer briefly and well. ".repeat(40)
    )
}

/// Sends one chat turn; the engine that served it. Every request must succeed.
async fn chat(client: &reqwest::Client, router: &Replica, system: &str, user: &str) -> String {
    let response = client
        .post(router.url("/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ], "max_tokens": 4}))
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200, "no request fails");
    let engine = response.headers()["x-switchyard-engine"]
        .to_str()
        .unwrap()
        .to_owned();
    response.bytes().await.expect("the body");
    engine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_fails_over_to_the_second_indexer_without_a_burst_of_misses() {
    let sims = engines(4).await;
    let fleet = config_file(&sims, None);
    let first = Replica::indexer(&fleet.0, &[]).await;
    let second = Replica::indexer(&fleet.0, &[]).await;
    let routed = config_file(
        &sims,
        Some(
            json!({"urls": [format!("http://{}", first.addr), format!("http://{}", second.addr)], "timeout_ms": 5000}),
        ),
    );
    let routers = Arc::new([
        Replica::start(&routed.0, &[]).await,
        Replica::start(&routed.0, &[]).await,
    ]);
    let client = reqwest::Client::new();
    let both_caught_up = async |first: &Replica| {
        caught_up(&client, std::slice::from_ref(first), &sims).await;
        caught_up(&client, std::slice::from_ref(&second), &sims).await;
    };
    both_caught_up(&first).await;

    // Each prefix's first turn makes its holder; both indexers learn of it.
    let mut holders = Vec::new();
    for p in 0..PREFIXES {
        holders.push(chat(&client, &routers[p % 2], &system(p), "first question").await);
        both_caught_up(&first).await;
    }
    let holders = Arc::new(holders);

    // Follow-ups from several clients at once; the first indexer dies mid-run.
    let (done, in_flight) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let in_flight_at_kill = Arc::new(AtomicUsize::new(usize::MAX));
    let kill = Arc::new(parking_lot::Mutex::new(Some(first)));
    let tasks = (0..CLIENTS).map(|c| {
        let (client, routers, holders) =
            (client.clone(), Arc::clone(&routers), Arc::clone(&holders));
        let (done, in_flight, at_kill, kill) = (
            Arc::clone(&done),
            Arc::clone(&in_flight),
            Arc::clone(&in_flight_at_kill),
            Arc::clone(&kill),
        );
        tokio::spawn(async move {
            let mut misses = 0;
            for n in 0..FOLLOW_UPS {
                for p in (c..PREFIXES).step_by(CLIENTS) {
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    let engine = chat(
                        &client,
                        &routers[(n + p) % 2],
                        &system(p),
                        &format!("question {n}"),
                    )
                    .await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    misses += usize::from(engine != holders[p]);
                    if done.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AFTER
                        && let Some(mut first) = kill.lock().take()
                    {
                        // The other clients' requests are under way meanwhile.
                        at_kill.store(in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
                        first.kill();
                    }
                }
            }
            misses
        })
    });
    let misses: usize = tokio::time::timeout(GUARD, futures_util::future::join_all(tasks))
        .await
        .expect("the follow-ups finish")
        .into_iter()
        .map(|m| m.expect("a client runs"))
        .sum();
    assert!(kill.lock().is_none(), "the first indexer was killed");
    let at_kill = in_flight_at_kill.load(Ordering::SeqCst);
    assert!(
        at_kill < CLIENTS,
        "{at_kill} requests were in flight at the kill"
    );
    assert!(
        misses <= at_kill,
        "{misses} of {} follow-ups missed their prefix's holder; at most the {at_kill} in flight at the kill may",
        PREFIXES * FOLLOW_UPS
    );
    for router in routers.iter() {
        let unavailable = router.sum(&client, "reason=\"cache_unavailable\"").await;
        assert!(
            unavailable <= at_kill as f64,
            "{unavailable} picks without an index"
        );
        assert_eq!(
            router
                .metric(&client, "switchyard_indexer_breaker_open{indexer=\"0\"} ")
                .await,
            1.0,
            "the dead indexer's breaker is open"
        );
        assert!(
            router
                .metric(
                    &client,
                    "switchyard_indexer_lookup_failures_total{indexer=\"0\"} "
                )
                .await
                >= 1.0
        );
        assert_eq!(
            router
                .metric(&client, "switchyard_indexer_breaker_open{indexer=\"1\"} ")
                .await,
            0.0
        );
        assert!(
            router
                .metric(&client, "switchyard_indexer_lookups_total{indexer=\"1\"} ")
                .await
                > 0.0,
            "the second indexer answered"
        );
    }
    drop(routers);
    drop(second);
    for sim in sims {
        sim.shutdown().await;
    }
}

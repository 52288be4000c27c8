//! Cache-aware routing end to end: simulated engines publish KV events over ZeroMQ,
//! the router tokenizes chats with the same tokenizer, follows the events, and sends
//! each request to the engine that holds its prefix.

use crate::common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{config, router, url};
use engine_sim::{RunningEngine, SimConfig, StartError};
use router_config::{EngineRole, ModelConfig};
use router_http::RunningRouter;
use router_policy::PolicyConfig;
use serde_json::{Value, json};

const MODEL: &str = "m";
const PAGE: u32 = 16;
/// The prefix index budget the tests configure (far above what they store).
const INDEX_PAGES: usize = 1 << 18;
/// The admin token, for explanations.
const ADMIN_TOKEN: &str = "s3cret";
/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(20);

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-bytes/tokenizer.json")
}

fn sim_config(http: u16, kv: u16, replay: u16) -> SimConfig {
    let mut c = SimConfig::for_tests();
    c.model = MODEL.into();
    c.tokenizer = Some(tokenizer());
    c.page_size = PAGE;
    c.port = http;
    c.kv_port = Some(kv);
    c.replay_port = Some(replay);
    c.output_tokens = 8;
    c
}

/// Starts an engine on ports a stopped one held (after its `shutdown`). Its ZeroMQ
/// listeners close in tasks of their own, a moment after the shutdown, so a failed
/// bind is tried again until the ports are free (a hang fails at `GUARD`).
async fn restart(config: SimConfig) -> RunningEngine {
    let again = async {
        loop {
            match engine_sim::start(config.clone()).await {
                Ok(engine) => return engine,
                Err(StartError::Zmq(_) | StartError::Listen { .. }) => {
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("the engine restarts: {e}"),
            }
        }
    };
    tokio::time::timeout(GUARD, again)
        .await
        .expect("the stopped engine's ports are free again")
}

async fn fleet(n: usize) -> Vec<RunningEngine> {
    let mut engines = Vec::new();
    for _ in 0..n {
        engines.push(
            engine_sim::start(sim_config(0, 0, 0))
                .await
                .expect("the engine starts"),
        );
    }
    engines
}

struct Harness {
    router: RunningRouter,
    client: reqwest::Client,
    engines: Vec<RunningEngine>,
}

impl Harness {
    async fn start(engines: Vec<RunningEngine>, policy: Value) -> Self {
        let members = engines
            .iter()
            .enumerate()
            .map(|(i, e)| common::engine(&format!("E{i}"), e, EngineRole::Plain))
            .collect();
        let mut model = ModelConfig::new(MODEL, members);
        model.tokenizer = Some(tokenizer());
        model.block_size = PAGE;
        model.prefix_index_pages = INDEX_PAGES;
        model.policies.plain =
            Some(serde_json::from_value::<PolicyConfig>(policy).expect("a policy"));
        let mut config = config(vec![model]);
        config.admin.token = Some(ADMIN_TOKEN.into());
        let router = router(config).await;
        let harness = Self {
            router,
            client: reqwest::Client::new(),
            engines,
        };
        harness.caught_up().await;
        harness
    }

    async fn shutdown(self) {
        self.router.shutdown().await;
        for engine in self.engines {
            engine.shutdown().await;
        }
    }

    /// Waits until the router has applied every KV batch the engines published (at
    /// once when it keeps no index): the next request is routed on an index that
    /// holds everything the engines announced.
    async fn caught_up(&self) {
        if self.router.context().fleet().prefix_index(MODEL).is_none() {
            return;
        }
        common::kv_caught_up(&self.router, &self.engines).await;
    }

    /// Sends one chat and waits until its KV events are applied; returns the engine
    /// and the cached prompt tokens it reported.
    async fn chat(&self, messages: &[Value]) -> (String, u64) {
        let answer = self.send(messages).await;
        self.caught_up().await;
        answer
    }

    /// The explanation of a chat, which is not sent.
    async fn explain(&self, messages: &[Value]) -> Value {
        let response = self
            .client
            .post(url(&self.router, "/explain/v1/chat/completions"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 8}))
            .send()
            .await
            .expect("the router answers");
        assert_eq!(response.status(), 200);
        response.json().await.expect("a JSON explanation")
    }

    /// Sends one chat without waiting for its KV events.
    async fn send(&self, messages: &[Value]) -> (String, u64) {
        let response = self
            .client
            .post(url(&self.router, "/v1/chat/completions"))
            .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 8}))
            .send()
            .await
            .expect("the router answers");
        assert_eq!(response.status(), 200);
        let engine = response.headers()["x-switchyard-engine"]
            .to_str()
            .expect("an ascii header")
            .to_owned();
        let body: Value = response.json().await.expect("a JSON body");
        let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens reported");
        (engine, cached)
    }

    /// Waits until the router's index holds a page: after an engine restart, the
    /// applied-batch count says nothing about the new process's batches.
    async fn indexed(&self) {
        let fleet = self.router.context().fleet();
        let prefix = fleet.prefix_index(MODEL).expect("an index");
        let stats = fleet.kv_stats();
        let wait = async {
            let mut seen = stats.steps();
            while prefix.size().entries == 0 {
                seen = stats.steps_after(seen).await;
            }
        };
        tokio::time::timeout(GUARD, wait)
            .await
            .expect("the router indexes the engine's pages");
    }

    async fn metric(&self, line_prefix: &str) -> f64 {
        common::metric(&self.router, line_prefix).await
    }

    /// The cached and prompt tokens the engines' answers reported, so far.
    async fn reported(&self) -> (f64, f64) {
        (
            self.metric("switchyard_reported_cached_tokens_total{model=\"m\",stage=\"plain\"}")
                .await,
            self.metric("switchyard_reported_prompt_tokens_total{model=\"m\",stage=\"plain\"}")
                .await,
        )
    }

    async fn predicted(&self) -> f64 {
        self.metric("switchyard_predicted_cached_tokens_total{model=\"m\",stage=\"plain\"}")
            .await
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// A long shared system prompt: 1,160 bytes, so 72 pages of byte tokens.
fn system_prompt() -> Value {
    json!({"role": "system", "content": "You are a careful assistant. ".repeat(40)})
}

fn cache_aware() -> Value {
    json!({"type": "cache_aware", "min_matched_tokens": 64, "seed": 1})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_chats_converge_on_the_engine_holding_the_prefix() {
    let h = Harness::start(fleet(4).await, cache_aware()).await;
    let (first, cold) = h.chat(&[system_prompt(), user("question 0")]).await;
    assert_eq!(cold, 0);
    for i in 1..10 {
        let before = h.predicted().await;
        let reported_before = h.reported().await;
        let (engine, cached) = h
            .chat(&[system_prompt(), user(&format!("question {i}"))])
            .await;
        let after = h.reported().await;
        let reported = (after.0 - reported_before.0, after.1 - reported_before.1);
        assert_eq!(
            reported.0 as u64, cached,
            "the reported cached tokens are what the answer said"
        );
        assert!(
            reported.1 > reported.0,
            "the reported prompt tokens count the whole prompt: {reported:?}"
        );
        assert_eq!(engine, first, "request {i} follows the prefix");
        assert!(
            cached >= 1_152,
            "the engine found the system prompt cached: {cached}"
        );
        let predicted = h.predicted().await - before;
        assert_eq!(
            predicted as u64, cached,
            "the router predicted exactly the engine's hit"
        );
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explanation_predicts_the_holder_and_the_hit_the_next_request_gets() {
    let h = Harness::start(fleet(3).await, cache_aware()).await;
    let (holder, _) = h.chat(&[system_prompt(), user("question 0")]).await;
    let next = [system_prompt(), user("question 1")];
    let explanation = h.explain(&next).await;
    let pick = &explanation["pick"]["engines"]["plain"];
    assert_eq!(pick["engine"], holder.as_str());
    assert_eq!(pick["reason"], "cache_hit");
    let predicted = pick["predicted_cached_tokens"].as_u64().unwrap();
    let matched: Vec<(String, Option<u64>)> = explanation["buckets"][0]["stages"][0]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["engine"].as_str().unwrap().to_owned(),
                c["matched_prefix_tokens"].as_u64(),
            )
        })
        .collect();
    let expected: Vec<(String, Option<u64>)> = (0..3)
        .map(|i| format!("E{i}"))
        .map(|e| {
            let tokens = (e == holder).then_some(predicted);
            (e, tokens)
        })
        .collect();
    assert_eq!(matched, expected, "only the holder matched the prefix");

    let response = h
        .client
        .post(url(&h.router, "/v1/chat/completions"))
        .json(&json!({"model": MODEL, "messages": next, "max_tokens": 8}))
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.headers()["x-switchyard-engine"], holder.as_str());
    assert_eq!(response.headers()["x-switchyard-reason"], "cache_hit");
    let body: Value = response.json().await.expect("a JSON body");
    assert_eq!(
        body["usage"]["prompt_tokens_details"]["cached_tokens"], predicted,
        "the engine found what the explanation predicted"
    );
    h.shutdown().await;
}

/// Eight conversations of four turns, interleaved, as a fleet of eight engines
/// serves them; returns the cached prompt tokens the engines reported.
async fn multi_turn_workload(h: &Harness) -> u64 {
    let mut conversations: Vec<Vec<Value>> = (0..8)
        .map(|c| {
            vec![json!({"role": "system", "content": format!("Conversation {c}. ").repeat(20)})]
        })
        .collect();
    let mut cached_total = 0;
    for turn in 0..4 {
        for (c, history) in conversations.iter_mut().enumerate() {
            history.push(user(&format!(
                "Turn {turn} of conversation {c}: tell me more."
            )));
            let (_, cached) = h.chat(history).await;
            cached_total += cached;
            history.push(json!({"role": "assistant", "content": format!("Answer {turn}.")}));
        }
    }
    cached_total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_turn_workload_finds_at_least_twice_the_cache_of_power_of_two() {
    let h = Harness::start(fleet(8).await, cache_aware()).await;
    let with_cache = multi_turn_workload(&h).await;
    h.shutdown().await;
    let h = Harness::start(fleet(8).await, json!({"type": "power_of_two", "seed": 1})).await;
    let without = multi_turn_workload(&h).await;
    h.shutdown().await;
    assert!(
        with_cache >= 2 * without,
        "cache_aware found {with_cache} cached tokens, power_of_two {without}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_batch_is_repaired_by_replay_before_it_misleads_routing() {
    let h = Harness::start(fleet(4).await, cache_aware()).await;
    let (holder, _) = h.chat(&[system_prompt(), user("warm up")]).await;
    let index: usize = holder[1..].parse().expect("E<n>");
    let status = h
        .client
        .post(format!("{}/admin/faults", h.engines[index].url()))
        .json(&json!({"drop_event_batches": 1}))
        .send()
        .await
        .expect("the engine's admin endpoint")
        .status();
    assert!(status.is_success());
    let lost = [
        system_prompt(),
        user("a question whose pages are announced in a lost batch"),
    ];
    let (engine, _) = h.send(&lost[..]).await;
    assert_eq!(engine, holder);
    // The next batch from the holder reveals the gap; the replay fills it.
    h.chat(&[
        system_prompt(),
        user("another question, long enough to fill a new page"),
    ])
    .await;
    let gaps = h
        .metric("switchyard_kv_feed_events_total{event=\"gaps\"}")
        .await;
    assert_eq!(gaps, 1.0);
    // Continuing the lost conversation, the router predicts exactly what the holder has.
    let mut longer = lost.to_vec();
    longer.push(json!({"role": "assistant", "content": "Answer."}));
    longer.push(user("and then?"));
    let before = h.predicted().await;
    let (engine, cached) = h.chat(&longer).await;
    assert_eq!(engine, holder);
    assert_eq!((h.predicted().await - before) as u64, cached);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_kv_feed_shows_in_the_metrics_and_the_explanation() {
    let h = Harness::start(fleet(2).await, cache_aware()).await;
    let (holder, _) = h.chat(&[system_prompt(), user("warm up")]).await;
    let index: usize = holder[1..].parse().expect("E<n>");
    let status = h
        .client
        .post(format!("{}/admin/faults", h.engines[index].url()))
        .json(&json!({"event_clock_behind_ms": 120_000}))
        .send()
        .await
        .expect("the engine's admin endpoint")
        .status();
    assert!(status.is_success());
    let (engine, _) = h
        .chat(&[
            system_prompt(),
            user("a question whose pages are announced two minutes late"),
        ])
        .await;
    assert_eq!(engine, holder);
    let age = h
        .metric(&format!(
            "switchyard_engine_kv_feed_age_seconds{{engine=\"{holder}\"}}"
        ))
        .await;
    assert!(
        age >= 120.0,
        "the holder's feed is two minutes behind: {age}"
    );
    let explained = h.explain(&[system_prompt(), user("warm up")]).await;
    let candidates = explained["buckets"][0]["stages"][0]["candidates"]
        .as_array()
        .expect("candidates")
        .clone();
    let seen = candidates
        .iter()
        .find(|c| c["engine"] == holder.as_str())
        .expect("the holder is a candidate");
    assert!(
        seen["kv_feed_age_ms"]
            .as_u64()
            .is_some_and(|ms| ms >= 120_000),
        "{seen}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_removes_its_entries() {
    let mut h = Harness::start(fleet(4).await, cache_aware()).await;
    let (holder, _) = h.chat(&[system_prompt(), user("warm up")]).await;
    let index_of_holder: usize = holder[1..].parse().expect("E<n>");
    let prefix = h
        .router
        .context()
        .fleet()
        .prefix_index(MODEL)
        .expect("an index");
    assert_eq!(
        prefix.config().max_nodes,
        INDEX_PAGES,
        "the configured budget"
    );
    assert!(prefix.size().entries > 0);

    // The engine goes away: its subscriber loses the connection and forgets it.
    let stopped = h.engines.remove(index_of_holder);
    let ports = stopped.ports().clone();
    let stats = Arc::clone(h.router.context().fleet().kv_stats());
    let seen = stats.steps();
    stopped.shutdown().await;
    let forgotten = async {
        let mut seen = seen;
        while prefix.size().entries > 0 {
            seen = stats.steps_after(seen).await;
        }
    };
    tokio::time::timeout(GUARD, forgotten)
        .await
        .expect("the engine's entries are dropped");

    // It comes back on the same ports with an empty cache: nothing stale is predicted.
    let restarted = restart(sim_config(ports.http.port(), ports.kv[0], ports.replay[0])).await;
    h.engines.push(restarted);
    let before = h.predicted().await;
    let (_, cached) = h.send(&[system_prompt(), user("after the restart")]).await;
    assert_eq!(cached, 0, "the restarted engine's cache is empty");
    assert_eq!(
        (h.predicted().await - before) as u64,
        cached,
        "no stale prediction"
    );

    // And what is cached from now on is predicted again.
    h.indexed().await;
    let before = h.predicted().await;
    let (_, cached) = h.send(&[system_prompt(), user("after the restart")]).await;
    assert!(cached > 0, "the engine holds the prompt it just served");
    assert_eq!((h.predicted().await - before) as u64, cached);
    h.shutdown().await;
}

#[tokio::test]
async fn an_engine_back_on_other_feed_ports_is_subscribed_there() {
    let mut h = Harness::start(fleet(1).await, cache_aware()).await;
    h.chat(&[system_prompt(), user("warm up")]).await;
    let fleet = Arc::clone(h.router.context().fleet());
    let health =
        |fleet: &router_fleet::Fleet| fleet.snapshot().get("E0").map(|engine| engine.health());

    // The engine stops; a probe finds it gone.
    let stopped = h.engines.remove(0);
    let http = stopped.ports().http.port();
    stopped.shutdown().await;
    let down = async {
        while health(&fleet) != Some(router_state::Health::Unhealthy) {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, down)
        .await
        .expect("a probe finds the engine down");

    // A new process answers on the same HTTP port, its KV events on other ports.
    let restarted = restart(sim_config(http, 0, 0)).await;
    h.engines.push(restarted);
    let up = async {
        while health(&fleet) != Some(router_state::Health::Healthy) {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, up)
        .await
        .expect("a probe finds the engine back");
    h.send(&[system_prompt(), user("after the restart")]).await;
    // The router follows the engine's new KV-event ports.
    h.indexed().await;

    // Predictions match what the engine reports again.
    let before = h.predicted().await;
    let (_, cached) = h.send(&[system_prompt(), user("after the restart")]).await;
    assert!(cached > 0, "the engine holds the prompt's prefix");
    assert_eq!((h.predicted().await - before) as u64, cached);
    h.shutdown().await;
}

/// The prompt length the router routed on and the one the engine counted.
async fn prompt_lengths(harness: &Harness, content: &str) -> (u64, u64) {
    prompt_lengths_of(harness, &[json!({"role": "user", "content": content})]).await
}

/// [`prompt_lengths`] of a whole conversation.
async fn prompt_lengths_of(harness: &Harness, messages: &[Value]) -> (u64, u64) {
    let response = harness
        .client
        .post(url(&harness.router, "/v1/chat/completions"))
        .json(&json!({"model": MODEL, "messages": messages}))
        .send()
        .await
        .expect("the router answers");
    let routed = response.headers()["x-switchyard-prompt-tokens"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number");
    let body: Value = response.json().await.expect("a JSON body");
    (
        routed,
        body["usage"]["prompt_tokens"].as_u64().expect("usage"),
    )
}

#[tokio::test]
async fn prompts_are_tokenized_only_where_a_policy_reads_them() {
    let content = "x".repeat(600);
    let reading = Harness::start(fleet(1).await, json!({"type": "cache_aware"})).await;
    let (routed, counted) = prompt_lengths(&reading, &content).await;
    assert_eq!(
        routed, counted,
        "cache-aware: the router counts as the engine does"
    );
    reading.shutdown().await;
    let blind = Harness::start(fleet(1).await, json!({"type": "round_robin"})).await;
    let (routed, counted) = prompt_lengths(&blind, &content).await;
    assert!(
        counted > 600,
        "the byte tokenizer counts a token a byte: {counted}"
    );
    assert!(
        (150..200).contains(&routed),
        "round-robin in one open bucket: estimated at four bytes a token, {routed}"
    );
    blind.shutdown().await;
}

#[tokio::test]
async fn the_next_turn_of_a_long_conversation_reuses_its_tokenized_prefix() {
    let harness = Harness::start(fleet(1).await, json!({"type": "cache_aware"})).await;
    let mut messages = vec![
        json!({"role": "system", "content": "a long system prompt. ".repeat(500)}),
        json!({"role": "user", "content": "first question"}),
    ];
    harness.chat(&messages).await;
    let lookups = "switchyard_prompt_prefix_cache_lookups_total{model=\"m\",result=";
    assert_eq!(harness.metric(&format!("{lookups}\"miss\"}}")).await, 1.0);
    assert_eq!(harness.metric(&format!("{lookups}\"hit\"}}")).await, 0.0);
    messages.push(json!({"role": "assistant", "content": "an answer"}));
    messages.push(json!({"role": "user", "content": "second question"}));
    let (routed, counted) = prompt_lengths_of(&harness, &messages).await;
    assert_eq!(
        routed, counted,
        "the reused prefix and the new part count as the engine does"
    );
    assert_eq!(harness.metric(&format!("{lookups}\"hit\"}}")).await, 1.0);
    let reused = harness
        .metric("switchyard_prompt_prefix_cache_reused_tokens_total{model=\"m\"}")
        .await;
    assert!(
        reused > 11_000.0,
        "the first turn's system prompt was reused: {reused}"
    );
    assert!(
        harness
            .metric("switchyard_prompt_prefix_cache_bytes{model=\"m\"}")
            .await
            > 2.0 * 44_000.0,
        "both turns' prefixes are held"
    );
    harness.shutdown().await;
}

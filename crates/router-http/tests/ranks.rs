//! Data-parallel ranks end to end: two ranks behind one simulated engine; the router
//! names a rank for every request, spreading requests by each rank's load and sending
//! a cache-aware request to the rank that holds its prefix.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use engine_sim::{RunningEngine, SimConfig};
use router_config::{EngineConfig, EngineRole, ModelConfig};
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs milliseconds.
const GUARD: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn two_ranks(sim: &RunningEngine) -> EngineConfig {
    EngineConfig {
        dp_size: Some(2),
        ..engine("E", sim, EngineRole::Plain)
    }
}

/// A streamed chat that runs until the test ends (the engine decodes slowly).
fn held(prompt: &str) -> Value {
    let mut body = chat("m", prompt);
    body["stream"] = json!(true);
    body["max_tokens"] = json!(1000);
    body
}

/// Sends `body` to `url` from a task of its own.
fn spawn_post(
    url: String,
    body: Value,
    rank: Option<u32>,
) -> tokio::task::JoinHandle<reqwest::Response> {
    tokio::spawn(async move {
        let mut request = reqwest::Client::new().post(url).json(&body);
        if let Some(rank) = rank {
            request = request.header("x-data-parallel-rank", rank);
        }
        request.send().await.expect("an answer")
    })
}

/// The ranks the engine was asked for, in arrival order.
async fn named_ranks(sim: &RunningEngine) -> Vec<Option<u64>> {
    recent_requests(sim)
        .await
        .iter()
        .map(|r| r["dp_rank"].as_u64())
        .collect()
}

#[tokio::test]
async fn requests_spread_over_the_ranks_by_their_load() {
    let sim = sim(|c| {
        c.dp_size = 2;
        c.decode_tokens_per_sec = 0.001;
    })
    .await;
    let router = router(config(vec![ModelConfig::new("m", vec![two_ranks(&sim)])])).await;
    let streams: Vec<_> = (0..4)
        .map(|n| {
            spawn_post(
                url(&router, "/v1/chat/completions"),
                held(&format!("held {n}")),
                None,
            )
        })
        .collect();
    within("four streams", sim.visits_until(|v| v.open == 4)).await;
    let mut ranks = named_ranks(&sim).await;
    ranks.sort_unstable();
    assert_eq!(
        ranks,
        [Some(0), Some(0), Some(1), Some(1)],
        "each request to the rank with fewer in flight"
    );
    for stream in streams {
        stream.abort();
    }
    sim.shutdown().await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_ranks_reported_load_sends_requests_to_the_other() {
    // A vLLM engine of two ranks, its load read from its /metrics.
    let sim = sim(|c| {
        c.dp_size = 2;
        c.decode_tokens_per_sec = 0.001;
        c.pd_protocol = engine_sim::PdProtocol::Vllm;
    })
    .await;
    let mut config = config(vec![ModelConfig::new("m", vec![two_ranks(&sim)])]);
    config.load.metrics_interval_ms = 20;
    let router = router(config).await;
    // Three requests straight to rank 0, which only the engine's metrics can tell.
    let busy: Vec<_> = (0..3)
        .map(|n| {
            let url = format!("{}/v1/chat/completions", sim.url());
            spawn_post(url, held(&format!("busy {n}")), Some(0))
        })
        .collect();
    within("rank 0 busy", sim.visits_until(|v| v.open == 3)).await;
    let fleet = router.context().fleet();
    within("the router reading rank 0's load", async {
        let mut seen = 0;
        while fleet.load().least_loaded_rank(&"E".into()) != Some(1) {
            seen = fleet.feed_stats().applied_after(seen).await;
        }
    })
    .await;
    let routed = spawn_post(
        url(&router, "/v1/chat/completions"),
        held("through the router"),
        None,
    );
    within("the routed request", sim.visits_until(|v| v.open == 4)).await;
    assert_eq!(
        named_ranks(&sim).await,
        [Some(0), Some(0), Some(0), Some(1)],
        "rank 0 runs three"
    );
    routed.abort();
    for request in busy {
        request.abort();
    }
    sim.shutdown().await;
    router.shutdown().await;
}

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-bytes/tokenizer.json")
}

#[tokio::test]
async fn a_cache_aware_request_goes_to_the_rank_holding_its_prefix() {
    let [kv, replay] = engine_sim::free_port_ranges([2, 2]);
    let sim = sim(|c: &mut SimConfig| {
        c.dp_size = 2;
        c.model = "m".into();
        c.tokenizer = Some(tokenizer());
        c.kv_port = Some(kv);
        c.replay_port = Some(replay);
    })
    .await;
    let mut model = ModelConfig::new("m", vec![two_ranks(&sim)]);
    model.tokenizer = Some(tokenizer());
    model.policies.plain = Some(
        serde_json::from_value(json!({"type": "cache_aware", "min_matched_tokens": 64})).unwrap(),
    );
    let router = router(config(vec![model])).await;
    let fleet = router.context().fleet();
    let prompt = "a long shared system prompt ".repeat(20);
    // Prefilled on rank 1, straight to the engine: only its KV events tell.
    let direct = spawn_post(
        format!("{}/v1/chat/completions", sim.url()),
        chat("m", &prompt),
        Some(1),
    )
    .await
    .unwrap();
    assert_eq!(direct.status(), 200);
    direct.bytes().await.unwrap();
    let index = fleet.prefix_index("m").expect("a prefix index");
    within("the router indexing rank 1's pages", async {
        let stats = fleet.kv_stats();
        let mut seen = stats.steps();
        while index.size().entries == 0 {
            seen = stats.steps_after(seen).await;
        }
    })
    .await;
    let response = post(&router, &chat("m", &prompt)).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "the prefix was found where it is cached: {answer}"
    );
    assert_eq!(
        named_ranks(&sim).await,
        [Some(1), Some(1)],
        "the routed request named rank 1"
    );
    sim.shutdown().await;
    router.shutdown().await;
}

#[tokio::test]
async fn a_prefill_rank_and_its_bootstrap_room_agree() {
    // The prefill engine holds every request until the test lets them go, so all four
    // are in flight when their ranks are chosen.
    let prefill = sim(|c| {
        c.role = engine_sim::EngineRole::Prefill;
        c.bootstrap_port = Some(0);
        c.dp_size = 2;
        c.faults.hold_after_chunks = Some(0);
    })
    .await;
    let decode = sim(|c| {
        c.role = engine_sim::EngineRole::Decode;
        c.dp_size = 2;
    })
    .await;
    let pd = |id: &str, sim: &RunningEngine, role| EngineConfig {
        dp_size: Some(2),
        ..engine(id, sim, role)
    };
    let model = ModelConfig::new(
        "m",
        vec![
            pd("P", &prefill, EngineRole::Prefill),
            pd("D", &decode, EngineRole::Decode),
        ],
    );
    let router = router(config(vec![model])).await;
    let streams: Vec<_> = (0..4)
        .map(|n| {
            let mut body = chat("m", &format!("pd {n}"));
            body["stream"] = json!(true);
            spawn_post(url(&router, "/v1/chat/completions"), body, None)
        })
        .collect();
    within("four prefill legs", prefill.visits_until(|v| v.open == 4)).await;
    let released = reqwest::Client::new()
        .post(format!("{}/admin/faults", prefill.url()))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    for stream in streams {
        let response = within("a PD answer", stream).await.unwrap();
        assert_eq!(response.status(), 200);
        let text = response.text().await.unwrap();
        assert!(
            text.ends_with("data: [DONE]\n\n"),
            "the decode engine found its room: {text}"
        );
    }
    let legs = recent_requests(&prefill).await;
    assert_eq!(legs.len(), 4);
    let mut ranks = Vec::new();
    for leg in &legs {
        let (room, rank) = (
            leg["bootstrap_room"].as_u64().unwrap(),
            leg["dp_rank"].as_u64().unwrap(),
        );
        assert_eq!(
            room % 2,
            rank,
            "SGLang finds the prefill's rank from the room: {leg}"
        );
        ranks.push(rank);
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 0, 1, 1]);
    prefill.shutdown().await;
    decode.shutdown().await;
    router.shutdown().await;
}

//! The regret of cache-aware picks end to end: per engine, the cached prompt tokens
//! the router predicted beside those the engine's answer reported, as counters and in
//! decision records. A model whose chat template renders chats as its engine does
//! predicts what the engine reports (a prefill/decode pair: what the prefill engine
//! found, which the decode engine's answer reports); one whose template differs by a
//! single character predicts nothing while the engine finds the prompts cached. An
//! engine's series leave with it.

use crate::common::{self, TempDir};

use std::path::{Path, PathBuf};

use engine_sim::{EngineRole as SimRole, RunningEngine};
use router_config::{DecisionsConfig, EngineRole, ModelConfig, RouterConfig};
use router_http::RunningRouter;
use router_policy::PolicyConfig;
use serde_json::{Value, json};

/// The plain engine's id in the router.
const ENGINE: &str = "E0";
/// A pair's engines' ids in the router.
const PREFILL: &str = "P";
const DECODE: &str = "D";
/// Chats sent: the first finds the engine's cache cold, the others its system prompt.
const CHATS: u64 = 5;
/// The system prompt all chats share: 1,160 bytes, so 72 pages of byte tokens.
const SHARED: u64 = 72 * 16;

/// The byte tokenizer with the engines' chat template made different by one
/// character: a newline after each role's marker instead of a space.
fn wrong_template(dir: &Path) -> PathBuf {
    let right = common::byte_tokenizer();
    let tokenizer = dir.join("tokenizer.json");
    std::fs::copy(&right, &tokenizer).unwrap();
    let config = std::fs::read_to_string(right.with_file_name("tokenizer_config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&config).unwrap();
    let template = config["chat_template"].as_str().unwrap();
    let changed = template.replace("}}|> {{", "}}|>\n{{");
    assert_ne!(
        changed, template,
        "the template has a role marker to change"
    );
    config["chat_template"] = json!(changed);
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    tokenizer
}

/// A router of model `m` over one engine with KV events, cache-aware, tokenizing
/// with `tokenizer`, recording every request's decision in `dir`; and its
/// configuration.
async fn start(
    tokenizer: PathBuf,
    dir: &Path,
) -> (RunningRouter, Vec<RunningEngine>, RouterConfig) {
    let engines = common::kv_sims(1).await;
    let mut model = ModelConfig::new(
        "m",
        vec![common::engine(ENGINE, &engines[0], EngineRole::Plain)],
    );
    model.policies.plain = Some(cache_aware());
    let (router, config) = serve(model, tokenizer, dir).await;
    common::kv_caught_up(&router, &engines).await;
    (router, engines, config)
}

/// [`start`] with a prefill engine (publishing KV events, picked cache-aware) and a
/// decode engine, handing requests over as SGLang does.
async fn start_pd(dir: &Path) -> (RunningRouter, Vec<RunningEngine>) {
    let sim = |role: SimRole| {
        common::sim(move |c| {
            c.model = "m".into();
            c.role = role;
            c.tokenizer = Some(common::byte_tokenizer());
            c.page_size = 16;
            if role == SimRole::Prefill {
                c.bootstrap_port = Some(0);
                c.kv_port = Some(0);
                c.replay_port = Some(0);
            }
        })
    };
    let engines = vec![sim(SimRole::Prefill).await, sim(SimRole::Decode).await];
    let mut model = ModelConfig::new(
        "m",
        vec![
            common::engine(PREFILL, &engines[0], EngineRole::Prefill),
            common::engine(DECODE, &engines[1], EngineRole::Decode),
        ],
    );
    model.policies.prefill = Some(cache_aware());
    let (router, _) = serve(model, common::byte_tokenizer(), dir).await;
    common::kv_caught_up(&router, &engines).await;
    (router, engines)
}

fn cache_aware() -> PolicyConfig {
    let policy = json!({"type": "cache_aware", "min_matched_tokens": 64, "seed": 1});
    serde_json::from_value(policy).unwrap()
}

/// A router serving `model`, tokenizing with `tokenizer`, recording every request's
/// decision in `dir`; and its configuration.
async fn serve(
    mut model: ModelConfig,
    tokenizer: PathBuf,
    dir: &Path,
) -> (RunningRouter, RouterConfig) {
    model.tokenizer = Some(tokenizer);
    model.block_size = 16;
    let mut config = common::config(vec![model]);
    config.decisions = Some(DecisionsConfig::new(dir.join("decisions.jsonl"), 1.0));
    (common::router(config.clone()).await, config)
}

/// The prompt and cached tokens an answer reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    prompt: u64,
    cached: u64,
}

/// Sends [`CHATS`] chats sharing a system prompt, each once the router has applied
/// the KV events of the one before; returns the usage each answer reported.
async fn chats(router: &RunningRouter, engines: &[RunningEngine]) -> Vec<Usage> {
    let pair = engines.len() == 2;
    let system = "You are a careful assistant. ".repeat(40);
    let mut usages = Vec::new();
    for i in 0..CHATS {
        let body = json!({"model": "m", "max_tokens": 4, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question {i}")},
        ]});
        let response = common::post(router, &body).await;
        assert_eq!(response.status(), 200);
        let (header, engine) = if pair {
            ("x-switchyard-prefill", PREFILL)
        } else {
            ("x-switchyard-engine", ENGINE)
        };
        assert_eq!(response.headers()[header], engine);
        let answer: Value = response.json().await.unwrap();
        let usage = &answer["usage"];
        usages.push(Usage {
            prompt: usage["prompt_tokens"].as_u64().unwrap(),
            cached: usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        });
        common::kv_caught_up(router, engines).await;
    }
    usages
}

/// `engine`'s regret counters: answers compared, their prompt tokens, the cached
/// tokens predicted, reported, and mispredicted either way (`None` without them).
async fn regret_of(router: &RunningRouter, engine: &str) -> Option<[u64; 5]> {
    let metrics = common::metrics(router).await;
    let counters = [
        "compared_answers",
        "compared_prompt_tokens",
        "predicted_cached_tokens",
        "reported_cached_tokens",
        "mispredicted_cached_tokens",
    ]
    .map(|family| {
        let line = format!("switchyard_engine_{family}_total{{engine=\"{engine}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.parse().ok())
    });
    if counters.iter().all(Option::is_none) {
        return None;
    }
    Some(counters.map(|n| n.unwrap_or_else(|| panic!("every family of {engine} in\n{metrics}"))))
}

/// [`regret_of`] the plain engine.
async fn regret(router: &RunningRouter) -> [u64; 5] {
    regret_of(router, ENGINE)
        .await
        .expect("the engine's counters")
}

/// Every decision record, once [`CHATS`] are written.
async fn records(router: &RunningRouter, dir: &Path) -> Vec<Value> {
    common::decision_records(router, &dir.join("decisions.jsonl"), CHATS).await
}

/// Each record's prediction (its `stage` pick's, of `engine`) beside the usage its
/// result reports.
fn recorded(records: &[Value], stage: &str, engine: &str) -> Vec<(u64, Usage)> {
    records
        .iter()
        .map(|record| {
            let pick = &record["pick"]["engines"][stage];
            assert_eq!(pick["engine"], engine);
            let result = &record["result"];
            (
                pick["predicted_cached_tokens"].as_u64().unwrap(),
                Usage {
                    prompt: result["prompt_tokens"].as_u64().unwrap(),
                    cached: result["cached_tokens"].as_u64().unwrap(),
                },
            )
        })
        .collect()
}

async fn stop(router: RunningRouter, engines: Vec<RunningEngine>) {
    router.shutdown().await;
    for engine in engines {
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_rendering_chats_as_its_engine_does_predicts_what_the_engine_reports() {
    let dir = TempDir::new("regret-right");
    let (router, mut engines, config) = start(common::byte_tokenizer(), dir.path()).await;
    let usages = chats(&router, &engines).await;
    assert_eq!(usages[0].cached, 0, "the first chat finds the cache cold");
    assert!(
        usages[1..].iter().all(|u| u.cached >= SHARED),
        "the others find the system prompt cached: {usages:?}"
    );
    let reported: u64 = usages.iter().map(|u| u.cached).sum();
    let prompt: u64 = usages.iter().map(|u| u.prompt).sum();
    assert_eq!(
        regret(&router).await,
        [CHATS, prompt, reported, reported, 0],
        "every answer compared; the router predicted exactly what the engine reported"
    );
    let records = records(&router, dir.path()).await;
    let predicted: Vec<(u64, Usage)> = usages.iter().map(|u| (u.cached, *u)).collect();
    assert_eq!(
        recorded(&records, "plain", ENGINE),
        predicted,
        "each record holds the prediction beside the answer's usage"
    );
    // A reload replaces the engine: its series leave with it.
    let other = common::kv_sims(1).await;
    let mut replaced = config;
    replaced.models[0].engines = vec![common::engine("E1", &other[0], EngineRole::Plain)];
    engines.extend(other);
    router.context().reload(replaced).await.expect("applied");
    assert_eq!(
        regret_of(&router, ENGINE).await,
        None,
        "a departed engine's series go"
    );
    stop(router, engines).await;
    dir.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_chat_template_makes_predictions_and_reports_diverge() {
    let dir = TempDir::new("regret-wrong");
    let (router, engines, _) = start(wrong_template(dir.path()), dir.path()).await;
    let usages = chats(&router, &engines).await;
    assert!(
        usages[1..].iter().all(|u| u.cached >= SHARED),
        "the engine, rendering chats its own way, finds the system prompt cached: {usages:?}"
    );
    let reported: u64 = usages.iter().map(|u| u.cached).sum();
    let prompt: u64 = usages.iter().map(|u| u.prompt).sum();
    let [answers, compared_prompt, predicted, counted, mispredicted] = regret(&router).await;
    assert_eq!(
        (answers, compared_prompt, counted),
        (CHATS, prompt, reported)
    );
    assert_eq!(
        predicted, 0,
        "the router's prompts share no page with the engine's"
    );
    assert_eq!(mispredicted, reported, "every reported token was missed");
    assert!(
        mispredicted * 2 > compared_prompt,
        "over half the prompt tokens mispredicted, far past the alert's 20%: {mispredicted} of {compared_prompt}"
    );
    let records = records(&router, dir.path()).await;
    let missed: Vec<(u64, Usage)> = usages.iter().map(|u| (0, *u)).collect();
    assert_eq!(
        recorded(&records, "plain", ENGINE),
        missed,
        "each record shows the miss beside the engine's hit"
    );
    stop(router, engines).await;
    dir.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pairs_prefill_prediction_is_compared_with_what_its_answer_reports() {
    let dir = TempDir::new("regret-pd");
    let (router, engines) = start_pd(dir.path()).await;
    let usages = chats(&router, &engines).await;
    assert!(
        usages[1..].iter().all(|u| u.cached >= SHARED),
        "the decode engine reports the system prompt the prefill engine found: {usages:?}"
    );
    let reported: u64 = usages.iter().map(|u| u.cached).sum();
    let prompt: u64 = usages.iter().map(|u| u.prompt).sum();
    assert_eq!(
        regret_of(&router, PREFILL).await,
        Some([CHATS, prompt, reported, reported, 0]),
        "the prefill engine's cache was predicted, and exactly"
    );
    assert_eq!(
        regret_of(&router, DECODE).await,
        None,
        "nothing was predicted of the decode engine"
    );
    let records = records(&router, dir.path()).await;
    let predicted: Vec<(u64, Usage)> = usages.iter().map(|u| (u.cached, *u)).collect();
    assert_eq!(recorded(&records, "prefill", PREFILL), predicted);
    stop(router, engines).await;
    dir.remove();
}

//! Decision records through the router: exactly the sampled requests are recorded,
//! each with the explanation of its selection and what came back (the status, the
//! first byte's time, the cached tokens the engine reported), including requests no
//! bucket could take.

use crate::common;

use std::path::{Path, PathBuf};

use common::{router, sim, url};
use router_config::RouterConfig;
use router_state::kv_events::{chain_hashes, namespace_seed};
use serde_json::{Value, json};

fn records_file(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("decisions.jsonl");
    drop(std::fs::remove_file(&file));
    file
}

fn config(file: &Path, sample_ratio: f64, model: Value) -> RouterConfig {
    let text = json!({
        "listen": "127.0.0.1:0",
        "decisions": {"path": file, "sample_ratio": sample_ratio},
        "models": [model],
    })
    .to_string();
    RouterConfig::from_yaml(&text).expect("a configuration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_are_recorded_with_their_selection_and_what_came_back() {
    let a = sim(|_| {}).await;
    let file = records_file("decisions");
    let router = router(config(
        &file,
        0.5,
        json!({"id": "m", "engines": [{"id": "A", "url": a.url(), "role": "plain"}]}),
    ))
    .await;
    let client = reqwest::Client::new();
    let mut sent = Vec::new();
    for (i, stream) in [false, false, true, true].into_iter().enumerate() {
        let mut body = common::chat("m", &format!("question {i}"));
        body["stream"] = json!(stream);
        body["stream_options"] = json!({"include_usage": true});
        if !stream {
            body.as_object_mut().unwrap().remove("stream_options");
        }
        let response = client
            .post(url(&router, "/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let text = response.text().await.unwrap();
        let cached = text
            .split("\"cached_tokens\":")
            .last()
            .and_then(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u64>().ok()
            })
            .expect("the engine reports cached tokens");
        sent.push((id, cached));
    }
    let records = common::decision_records(&router, &file, 2).await;
    assert_eq!(records.len(), 2, "every second request is recorded");
    for (record, (id, cached)) in records.iter().zip([&sent[1], &sent[3]]) {
        assert_eq!(&record["request_id"], id);
        assert_eq!(record["model"], "m");
        assert_eq!(record["pick"]["engines"]["plain"]["engine"], "A");
        assert_eq!(record["buckets"][0]["outcome"], "picked");
        assert_eq!(
            record["buckets"][0]["stages"][0]["candidates"][0]["admission"][0]["verdict"],
            "admitted"
        );
        let result = &record["result"];
        assert_eq!(
            (&result["status"], &result["outcome"], &result["code"]),
            (&json!(200), &json!("ok"), &json!("ok"))
        );
        assert_eq!(&result["cached_tokens"], cached);
        assert!(
            result["first_byte_ms"].as_f64().unwrap() <= result["duration_ms"].as_f64().unwrap()
        );
        assert!(record["time_unix_ms"].as_u64().unwrap() > 0);
    }
    assert_eq!(records[0]["request"]["stream"], false);
    assert_eq!(records[1]["request"]["stream"], true);
    router.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[tokio::test]
async fn a_request_no_bucket_takes_is_recorded_with_its_error() {
    let a = sim(|_| {}).await;
    let file = records_file("decisions-error");
    let router = router(config(
        &file,
        1.0,
        json!({
            "id": "m",
            "engines": [{"id": "A", "url": a.url(), "role": "plain"}],
            "buckets": [{"id": "tiny", "limits": {"max": 2}, "groups": {"plain": {}}}],
        }),
    ))
    .await;
    let response = common::post(&router, &common::chat("m", "far more than two tokens")).await;
    assert_eq!(response.status(), 400);
    let records = common::decision_records(&router, &file, 1).await;
    assert_eq!(records[0]["error"]["code"], "no_matching_bucket");
    assert_eq!(records[0]["buckets"][0]["outcome"], "skipped");
    assert_eq!(records[0]["result"]["status"], 400);
    assert_eq!(records[0]["result"]["outcome"], "client_error");
    assert_eq!(records[0]["result"]["first_byte_ms"], Value::Null);
    assert_eq!(a.visits().answered, 0);
    router.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[tokio::test]
async fn a_retried_requests_record_names_the_engine_that_failed_and_the_one_that_answered() {
    let (a, b) = (
        sim(|c| {
            c.faults.error_rate = 1.0;
            c.faults.error_status = Some(503);
        })
        .await,
        sim(|_| {}).await,
    );
    let file = records_file("decisions-retry");
    let mut config = config(
        &file,
        1.0,
        json!({
            "id": "m",
            "engines": [
                {"id": "A", "url": a.url(), "role": "plain"},
                {"id": "B", "url": b.url(), "role": "plain"},
            ],
        }),
    );
    // Engines stay candidates whatever they answer.
    config.health.breaker_failures = 1_000_000;
    let router = router(config).await;
    // Round robin offers A first.
    let response = common::post(&router, &common::chat("m", "hello")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-switchyard-engine"], "B");
    response.bytes().await.unwrap();
    let records = common::decision_records(&router, &file, 1).await;
    let record = &records[0];
    assert_eq!(record["pick"]["engines"]["plain"]["engine"], "A");
    assert_eq!(
        record["result"]["retries"],
        json!([{
            "failed": "A",
            "reason": "status_503",
            "then": {"plain": {"engine": "B", "reason": "single_candidate", "predicted_cached_tokens": null}},
        }])
    );
    assert_eq!(record["result"]["status"], 200);
    router.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

/// The page hashes of a replayable record, one a page.
fn pages(record: &Value) -> Vec<String> {
    let hex = record["replay"]["pages"].as_str().expect("pages");
    assert_eq!(hex.len() % 16, 0);
    hex.as_bytes()
        .chunks(16)
        .map(|page| String::from_utf8(page.to_vec()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayable_records_carry_page_hashes_and_never_the_prompt() {
    let a = sim(|c| {
        c.model = "m".into();
        c.tokenizer = Some(common::byte_tokenizer());
    })
    .await;
    let file = records_file("decisions-replayable");
    // Round robin reads no prompt: only the recorded requests are tokenized, for
    // their records.
    let text = json!({
        "listen": "127.0.0.1:0",
        "decisions": {"path": file, "sample_ratio": 1.0, "replayable": true},
        "models": [{
            "id": "m", "tokenizer": common::byte_tokenizer(), "block_size": 4,
            "engines": [{"id": "A", "url": a.url(), "role": "plain"}],
        }],
    })
    .to_string();
    let router = router(RouterConfig::from_yaml(&text).unwrap()).await;
    let secret = "zebra quartz lantern 7f3q overlooks the harbour at dusk";
    let ids: Vec<u32> = (1..=40).collect();
    let forked: Vec<u32> = (1..=32).chain(200..208).collect();
    let prompts = [
        json!(secret),
        json!(secret),
        json!(format!("{secret} and then some")),
        json!(ids),
        json!(forked),
    ];
    let mut completions = Vec::new();
    for prompt in &prompts {
        let body = json!({"model": "m", "prompt": prompt, "max_tokens": 5});
        let response = reqwest::Client::new()
            .post(url(&router, "/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let answer: Value = response.json().await.unwrap();
        completions.push(answer["usage"]["completion_tokens"].clone());
    }
    let mut records = common::decision_records(&router, &file, 5).await;
    // Written as requests end and their pages are hashed: put in arrival order.
    records.sort_by_key(|r| r["replay"]["arrival_unix_us"].as_u64());
    let lines = std::fs::read_to_string(&file).unwrap();
    for fragment in ["zebra", "quartz", "harbour", "7f3q"] {
        assert!(!lines.contains(fragment), "a record holds {fragment:?}");
    }
    let listed: Vec<String> = ids.iter().map(u32::to_string).collect();
    assert!(
        !lines.contains(&listed[..8].join(",")),
        "a record holds the token ids"
    );
    for (record, completion) in records.iter().zip(&completions) {
        let replay = &record["replay"];
        assert_eq!(replay["block_size"], 4);
        let arrival = replay["arrival_unix_us"].as_u64().unwrap();
        let recorded_ms = record["time_unix_ms"].as_u64().unwrap();
        assert!(arrival > 0 && arrival / 1000 <= recorded_ms);
        assert_eq!(&record["result"]["completion_tokens"], completion);
        assert!(completion.as_u64().unwrap() > 0);
    }
    // Equal prompts, equal pages; a longer prompt shares the shorter one's pages.
    let (first, again, longer) = (pages(&records[0]), pages(&records[1]), pages(&records[2]));
    let prompt_tokens = records[0]["replay"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first.len() as u64, prompt_tokens / 4);
    assert!(first.len() >= secret.len() / 4);
    assert_eq!(first, again);
    assert!(longer.len() > first.len() && longer.starts_with(&first));
    // Token ids sent as the prompt: pages of them, never the index's own hashes (a
    // guessed page could be checked against those); prompts forking after 32 tokens
    // share 8 pages.
    let (ids_pages, forked_pages) = (pages(&records[3]), pages(&records[4]));
    let index_hashes: Vec<String> = chain_hashes(&ids, 4, namespace_seed(None))
        .iter()
        .map(|h| format!("{h:016x}"))
        .collect();
    assert_eq!(ids_pages.len(), 10);
    assert!(ids_pages.iter().all(|page| !index_hashes.contains(page)));
    assert_eq!(ids_pages[..8], forked_pages[..8]);
    assert_ne!(ids_pages[8..], forked_pages[8..]);
    assert_eq!(records[3]["replay"]["prompt_tokens"], 40);
    router.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[tokio::test]
async fn records_carry_no_replay_fields_unless_asked() {
    let a = sim(|_| {}).await;
    let file = records_file("decisions-not-replayable");
    let router = router(config(
        &file,
        1.0,
        json!({"id": "m", "engines": [{"id": "A", "url": a.url(), "role": "plain"}]}),
    ))
    .await;
    let response = common::post(&router, &common::chat("m", "hello")).await;
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    let records = common::decision_records(&router, &file, 1).await;
    assert!(records[0].get("replay").is_none());
    router.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policys_picks_are_counted_and_recorded_beside_the_groups() {
    let a = sim(|_| {}).await;
    let b = sim(|_| {}).await;
    let file = records_file("decisions-shadow");
    let router = router(config(
        &file,
        1.0,
        json!({
            "id": "m",
            "engines": [
                {"id": "A", "url": a.url(), "role": "plain"},
                {"id": "B", "url": b.url(), "role": "plain"},
            ],
            "buckets": [{"id": "all", "groups": {"plain": {
                "policy": {"type": "round_robin"},
                "shadow": {"policy": {"type": "load_based"}, "every": 1},
            }}}],
        }),
    ))
    .await;
    for i in 0..4 {
        let response = common::post(&router, &common::chat("m", &format!("question {i}"))).await;
        assert_eq!(response.status(), 200);
    }
    let records = common::decision_records(&router, &file, 4).await;
    let shadows: Vec<&Value> = records
        .iter()
        .map(|r| &r["buckets"][0]["stages"][0]["shadow"])
        .collect();
    for (record, shadow) in records.iter().zip(&shadows) {
        let live = &record["pick"]["engines"]["plain"]["engine"];
        assert_eq!(shadow["policy"], "load_based");
        assert_eq!(
            shadow["agreed"],
            json!(shadow["engine"] == *live),
            "{record}"
        );
        assert_eq!(
            (&shadow["cached_tokens"], &shadow["live_cached_tokens"]),
            (&json!(0), &json!(0)),
            "no prefix lookup: nothing is known held"
        );
    }
    let agreed = shadows.iter().filter(|s| s["agreed"] == true).count();
    let metrics = common::metrics(&router).await;
    let series = |outcome: &str| {
        format!(
            "switchyard_shadow_picks_total{{model=\"m\",bucket=\"all\",stage=\"plain\",policy=\"load_based\",outcome=\"{outcome}\"}}"
        )
    };
    assert!(
        metrics.contains(&format!("{} {agreed}", series("agreed"))),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("{} {}", series("disagreed"), 4 - agreed)),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("{} 0", series("none"))));
    assert!(metrics.contains(
        "switchyard_shadow_cached_tokens_total{model=\"m\",bucket=\"all\",stage=\"plain\",policy=\"load_based\",side=\"live\"} 0"
    ));
    router.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

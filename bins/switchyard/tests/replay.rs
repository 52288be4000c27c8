//! `switchyard workload` and `switchyard replay` as an operator runs them.

use std::process::{Command, Output};

use crate::common::TempFile;

const ENGINES: &[&str] = &[
    "--slots",
    "16",
    "--prefill-tokens-per-sec",
    "20000",
    "--serial-prefill",
    "--decode-tokens-per-sec",
    "100",
    "--kv-capacity-tokens",
    "32768",
];

fn switchyard(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .args(ENGINES)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_replay_prints_the_same_bytes_every_time() {
    let config = TempFile::new(
        "models:\n  - id: m\n    engines:\n      - {id: a, url: 'http://127.0.0.1:1', role: plain}\n      - {id: b, url: 'http://127.0.0.1:2', role: plain}\n      - {id: c, url: 'http://127.0.0.1:3', role: plain}\n",
    );
    let trace = TempFile::new("");
    let json = TempFile::new("");
    let [config, trace, json] = [&config, &trace, &json].map(|f| f.0.to_str().unwrap().to_owned());
    let generated = switchyard(&[
        "workload",
        "--out",
        &trace,
        "--requests",
        "800",
        "--config",
        &config,
    ]);
    let said = String::from_utf8_lossy(&generated.stderr);
    assert!(said.contains("capacity under round_robin"), "{said}");
    let replay = || {
        switchyard(&[
            "replay",
            "--trace",
            &trace,
            "--config",
            &config,
            "--policies",
            "round_robin,power_of_two,cache_aware",
            "--json",
            &json,
        ])
    };
    let first = replay();
    let first_json = std::fs::read(&json).unwrap();
    let second = replay();
    assert_eq!(first.stdout, second.stdout);
    assert_eq!(first_json, std::fs::read(&json).unwrap());
    let table = String::from_utf8(first.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("policy") && lines[0].contains("ttft_p99_ms"),
        "{table}"
    );
    for (line, policy) in lines[1..]
        .iter()
        .zip(["round_robin", "power_of_two", "cache_aware"])
    {
        assert!(
            line.starts_with(policy) && line.contains(" 800 "),
            "{table}"
        );
    }
    let summaries: serde_json::Value = serde_json::from_slice(&first_json).unwrap();
    assert_eq!(
        summaries[2]["ttft_percentiles_ms"].as_array().map(Vec::len),
        Some(102),
        "whole percents 0 to 100, then 99.9"
    );
}

#[test]
fn a_trace_line_that_is_not_a_request_is_named() {
    let config = TempFile::new(
        "models:\n  - id: m\n    engines:\n      - {id: a, url: 'http://127.0.0.1:1', role: plain}\n",
    );
    let trace =
        TempFile::new("{\"at_us\": 0, \"prompt\": [], \"output_tokens\": 1}\n{\"at_us\": 1}\n");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "replay",
            "--trace",
            trace.0.to_str().unwrap(),
            "--config",
            config.0.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("trace line 2") && stderr.contains("missing field"),
        "{stderr}"
    );
}

/// A trace of two conversations of two turns each, the second turns 200 ms later.
const CONVERSATIONS: &str = r#"{"at_us": 0, "session": "a", "prompt": [{"id": "sys", "tokens": 64}, {"id": "a-u0", "tokens": 20}], "output_tokens": 8}
{"at_us": 100000, "session": "b", "prompt": [{"id": "sys", "tokens": 64}, {"id": "b-u0", "tokens": 30}], "output_tokens": 8}
{"at_us": 200000, "session": "a", "prompt": [{"id": "sys", "tokens": 64}, {"id": "a-u0", "tokens": 20}, {"id": "a-a0", "tokens": 8}, {"id": "a-u1", "tokens": 9}], "output_tokens": 8}
{"at_us": 300000, "session": "b", "prompt": [{"id": "sys", "tokens": 64}, {"id": "b-u0", "tokens": 30}, {"id": "b-a0", "tokens": 8}, {"id": "b-u1", "tokens": 9}], "output_tokens": 8}
"#;

/// Runs `switchyard drive` on `trace` against `router`, off the test's runtime.
async fn drive(
    router: &crate::common::Replica,
    trace: &TempFile,
    model: &str,
    json: &TempFile,
    extra: &[&str],
) -> Output {
    let mut args: Vec<String> = [
        "drive",
        "--trace",
        trace.0.to_str().unwrap(),
        "--url",
        &router.url(""),
        "--model",
        model,
        "--json",
        json.0.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("the binary runs")
    })
    .await
    .expect("the driver ran")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drive_sends_a_trace_through_a_router_and_reports_what_came_back() {
    let engine = engine_sim::start(engine_sim::SimConfig::for_tests())
        .await
        .expect("an engine");
    let config = TempFile::new(
        &serde_json::json!({
            "listen": "127.0.0.1:0",
            "models": [{"id": "m", "engines": [{"id": "E0", "url": engine.url(), "role": "plain"}]}],
        })
        .to_string(),
    );
    let router = crate::common::Replica::start(&config.0, &[]).await;
    let trace = TempFile::new(CONVERSATIONS);
    let json = TempFile::new("");

    let out = drive(&router, &trace, "m", &json, &["--engines", "E0,E1"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("live") && l.contains(" 4 ")),
        "{table}"
    );
    let summary =
        &serde_json::from_slice::<serde_json::Value>(&std::fs::read(&json.0).unwrap()).unwrap()[0];
    assert_eq!(summary["rejected"], 0);
    assert_eq!(summary["engine_load"][0][0], "E0", "{summary}");
    assert_eq!(
        summary["engine_load"][1],
        serde_json::json!(["E1", 0.0]),
        "an engine named that never answered counts as idle"
    );
    // The first turns find nothing but the second's shared system prompt (4 pages
    // of 16); the second turns find their first turn's 5 and 5 pages.
    let cached = 64 + 80 + 80;
    let prompt = 84 + 94 + 101 + 111;
    let share = summary["cached_share"].as_f64().unwrap();
    assert!(
        (share - f64::from(cached) / f64::from(prompt)).abs() < 1e-9,
        "{summary}"
    );

    let out = drive(&router, &trace, "unknown-model", &json, &[]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("4 requests failed"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drive_counts_a_capacity_refusal_as_rejected_not_failed() {
    let mut slow = engine_sim::SimConfig::for_tests();
    slow.decode_tokens_per_sec = 2.0;
    let engine = engine_sim::start(slow).await.expect("an engine");
    let capped =
        serde_json::json!({"type": "round_robin", "admission": {"max_inflight_requests": 1}});
    let config = TempFile::new(
        &serde_json::json!({
            "listen": "127.0.0.1:0",
            "models": [{"id": "m", "engines": [{"id": "E0", "url": engine.url(), "role": "plain"}],
                        "policies": {"plain": capped}}],
        })
        .to_string(),
    );
    let router = crate::common::Replica::start(&config.0, &[]).await;
    // The first holds the only slot for two seconds (four tokens at two a second);
    // the second arrives 200 ms into it.
    let trace = TempFile::new(
        "{\"at_us\": 0, \"prompt\": [{\"id\": \"a\", \"tokens\": 20}], \"output_tokens\": 4}\n\
         {\"at_us\": 200000, \"prompt\": [{\"id\": \"b\", \"tokens\": 20}], \"output_tokens\": 4}\n",
    );
    let json = TempFile::new("");
    let out = drive(&router, &trace, "m", &json, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary =
        &serde_json::from_slice::<serde_json::Value>(&std::fs::read(&json.0).unwrap()).unwrap()[0];
    assert_eq!(
        (summary["rejected"].as_u64(), summary["failed"].as_u64()),
        (Some(1), Some(0)),
        "{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drive_in_a_closed_loop_sends_each_request_once_the_one_before_completed() {
    let mut paced = engine_sim::SimConfig::for_tests();
    paced.decode_tokens_per_sec = 100.0;
    let engine = engine_sim::start(paced).await.expect("an engine");
    let config = TempFile::new(
        &serde_json::json!({
            "listen": "127.0.0.1:0",
            "models": [{"id": "m", "engines": [{"id": "E0", "url": engine.url(), "role": "plain"}]}],
        })
        .to_string(),
    );
    let router = crate::common::Replica::start(&config.0, &[]).await;
    // Six requests due at once, 50 ms each (five tokens at 100 a second).
    let trace = TempFile::new(
        &(0..6)
            .map(|i| {
                format!(
                    "{{\"at_us\": 0, \"session\": \"s{i}\", \"prompt\": [{{\"id\": \"p{i}\", \"tokens\": 20}}], \"output_tokens\": 5}}\n"
                )
            })
            .collect::<String>(),
    );
    let json = TempFile::new("");
    let load = |out: Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary =
            &serde_json::from_slice::<serde_json::Value>(&std::fs::read(&json.0).unwrap()).unwrap()
                [0];
        assert_eq!(summary["requests"], 6, "{summary}");
        summary["engine_load"][0][1].as_f64().unwrap()
    };
    let open = load(drive(&router, &trace, "m", &json, &[]).await);
    let closed = load(drive(&router, &trace, "m", &json, &["--closed-loop", "1"]).await);
    assert!(open > 2.0, "sent at once, they overlap: {open}");
    assert!(
        (0.5..=1.0).contains(&closed),
        "one client: one request at a time ({closed})"
    );
}

/// Waits until `router` has written `n` decision records.
async fn records_written(router: &crate::common::Replica, n: f64) {
    let client = reqwest::Client::new();
    let written = async {
        while router
            .metric(
                &client,
                "switchyard_decision_records_total{outcome=\"written\"}",
            )
            .await
            < n
        {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), written)
        .await
        .expect("the records are written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_recorded_by_the_router_replays_as_it_happened() {
    let engine = engine_sim::start(engine_sim::SimConfig::for_tests())
        .await
        .expect("an engine");
    let records = TempFile::new("");
    std::fs::remove_file(&records.0).unwrap();
    let config = TempFile::new(
        &serde_json::json!({
            "listen": "127.0.0.1:0",
            "decisions": {"path": records.0, "sample_ratio": 1.0, "replayable": true},
            "models": [{"id": "m", "engines": [{"id": "E0", "url": engine.url(), "role": "plain"}]}],
        })
        .to_string(),
    );
    let mut router = crate::common::Replica::start(&config.0, &[]).await;
    let trace = TempFile::new(CONVERSATIONS);
    let json = TempFile::new("");
    let out = drive(&router, &trace, "m", &json, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let live =
        &serde_json::from_slice::<serde_json::Value>(&std::fs::read(&json.0).unwrap()).unwrap()[0];
    records_written(&router, 4.0).await;
    router.terminate(std::time::Duration::from_secs(10)).await;

    // The records name the prompts' pages, never their token ids.
    let text = std::fs::read_to_string(&records.0).unwrap();
    let first = router_replay::read_trace(CONVERSATIONS.as_bytes()).unwrap()[0].tokens();
    let ids: Vec<String> = first[..6].iter().map(u32::to_string).collect();
    assert!(!text.contains(&ids.join(",")), "a record holds token ids");

    let replayed = TempFile::new("");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["replay", "--records"])
        .arg(&records.0)
        .arg("--config")
        .arg(&config.0)
        .arg("--json")
        .arg(&replayed.0)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[1].starts_with("recorded ") && rows[2].starts_with("config "),
        "{table}"
    );
    let written = std::fs::read_to_string(&replayed.0).unwrap();
    assert!(
        written.find("\"policy\"") < written.find("\"ttft_p50_ms\""),
        "the summaries' fields in their order"
    );
    let summaries: Vec<serde_json::Value> = serde_json::from_str(&written).unwrap();
    let (recorded, replay) = (&summaries[0], &summaries[1]);
    for summary in [recorded, replay] {
        assert_eq!(summary["requests"], 4, "{summary}");
        assert_eq!(summary["failed"], 0, "{summary}");
    }
    // One engine: the second turns find their first turns' pages and the second
    // conversation the first's system prompt, live, as recorded and as replayed.
    let share = |s: &serde_json::Value| s["cached_share"].as_f64().unwrap();
    assert!(
        (share(recorded) - share(live)).abs() < 1e-9,
        "{recorded} {live}"
    );
    assert!(
        (share(replay) - share(live)).abs() < 1e-9,
        "{replay} {live}"
    );
    assert_eq!(recorded["of_oracle"], replay["of_oracle"]);
    assert!(share(live) > 0.5, "{live}");

    // The same records through another configuration: every decision as before with
    // one engine, whatever the policy; cell by cell, nothing moved.
    let other = TempFile::new(
        &serde_json::json!({
            "models": [{"id": "m", "engines": [{"id": "E0", "url": "http://127.0.0.1:1", "role": "plain"}],
                        "buckets": [{"id": "all", "groups": {"plain": {"policy": {"type": "power_of_two"}}}}]}],
        })
        .to_string(),
    );
    let diffed = TempFile::new("");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["replay", "diff", "--records"])
        .arg(&records.0)
        .arg("--config")
        .arg(&config.0)
        .arg("--against")
        .arg(&other.0)
        .arg("--json")
        .arg(&diffed.0)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let diff: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&diffed.0).unwrap()).unwrap();
    assert_eq!(diff["before"]["cached_share"], replay["cached_share"]);
    assert_eq!(diff["after"]["cached_share"], replay["cached_share"]);
    // Only the pick's reason differs: one candidate either way.
    for moved in diff["requests"].as_array().unwrap() {
        assert_eq!(
            moved["before"]["engine"], moved["after"]["engine"],
            "{moved}"
        );
        assert_eq!(
            moved["before"]["ttft_ms"], moved["after"]["ttft_ms"],
            "{moved}"
        );
    }

    // Four streamed answers are too few to fit the engines to: refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["replay", "--calibrate", "--records"])
        .arg(&records.0)
        .arg("--config")
        .arg(&config.0)
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("4 streamed answers served"),
        "{stderr}"
    );
}

#[test]
fn records_in_pages_a_model_cannot_make_up_are_refused() {
    let records = TempFile::new(
        r#"{"request_id": "r", "model": "m", "replay": {"arrival_unix_us": 1, "prompt_tokens": 16, "block_size": 16, "pages": "00000000000000aa"}, "result": {"status": 200, "duration_ms": 1.0}}
"#,
    );
    let config = TempFile::new(
        "models:\n  - id: m\n    block_size: 24\n    engines:\n      - {id: a, url: 'http://127.0.0.1:1', role: plain}\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["replay", "--records"])
        .arg(&records.0)
        .arg("--config")
        .arg(&config.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("pages of 24 tokens, which pages of 16 tokens (the records') do not make up"),
        "{stderr}"
    );
}

#[test]
fn a_diff_sets_two_configurations_side_by_side_and_names_the_requests_that_moved() {
    let fleet = |policy: &str| {
        TempFile::new(&format!(
            "models:\n  - id: m\n    engines:\n      - {{id: a, url: 'http://127.0.0.1:1', role: plain}}\n      - {{id: b, url: 'http://127.0.0.1:2', role: plain}}\n      - {{id: c, url: 'http://127.0.0.1:3', role: plain}}\n    buckets: [{{id: all, groups: {{plain: {{policy: {{type: {policy}}}}}}}}}]\n"
        ))
    };
    let (round_robin, cache_aware) = (fleet("round_robin"), fleet("cache_aware"));
    let trace = TempFile::new(CONVERSATIONS);
    let json = TempFile::new("");
    let diff = |against: &TempFile| {
        switchyard(&[
            "replay",
            "diff",
            "--trace",
            trace.0.to_str().unwrap(),
            "--config",
            round_robin.0.to_str().unwrap(),
            "--against",
            against.0.to_str().unwrap(),
            "--top",
            "3",
            "--json",
            json.0.to_str().unwrap(),
        ])
    };
    let out = diff(&cache_aware);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("cell"), "{text}");
    for cell in [
        "served",
        "rejected",
        "ttft_p50_ms",
        "ttft_p99.9_ms",
        "cached_%",
        "load_max/min",
    ] {
        assert!(lines.iter().any(|l| l.starts_with(cell)), "{cell}: {text}");
    }
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json.0).unwrap()).unwrap();
    assert_eq!(written["before"]["requests"], 4);
    assert_eq!(written["after"]["requests"], 4);
    // Round robin over three engines sends the second turns away from their first
    // turns' engines; cache-aware sends them back: their decisions differ.
    let moved = written["requests"].as_array().unwrap();
    assert!(!moved.is_empty() && moved.len() <= 3, "{written}");
    assert!(
        written["after"]["cached_share"].as_f64() > written["before"]["cached_share"].as_f64(),
        "{written}"
    );
    // A configuration against itself: nothing moved.
    let same = diff(&round_robin);
    assert!(
        String::from_utf8_lossy(&same.stdout).contains("every request went as before"),
        "{}",
        String::from_utf8_lossy(&same.stdout)
    );
}

#[test]
fn replay_refuses_two_inputs_and_a_diff_without_its_second_configuration() {
    let config =
        TempFile::new("models: [{id: m, engines: [{id: a, url: 'http://127.0.0.1:1'}]}]\n");
    let trace = TempFile::new(CONVERSATIONS);
    let refused = |args: &[&str], says: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    let (config, trace) = (config.0.to_str().unwrap(), trace.0.to_str().unwrap());
    refused(
        &[
            "replay",
            "--trace",
            trace,
            "--records",
            trace,
            "--config",
            config,
        ],
        "cannot be used with",
    );
    refused(
        &["replay", "diff", "--trace", trace, "--config", config],
        "--against",
    );
    refused(&["replay", "--trace", trace], "--config");
    refused(
        &[
            "replay",
            "--calibrate",
            "--trace",
            trace,
            "--config",
            config,
        ],
        "--records",
    );
    refused(
        &[
            "replay",
            "--calibrate",
            "--closed-loop",
            "2",
            "--records",
            trace,
            "--config",
            config,
        ],
        "closed loop",
    );
}

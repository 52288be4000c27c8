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
